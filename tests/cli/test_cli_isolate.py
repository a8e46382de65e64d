"""``flyreg tune --isolate``: a config that aborts its worker, one that hangs, one whose build aborts or hangs
and a wrong one are each recorded with their reason, and the tune still picks the known best config."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from cli_harness import fake_distribution
from test_cli import Flyreg, artifacts, table_rows

#: An op whose configs sleep K ms per call (so K=1 is the fastest correct one), and whose MODE
#: "abort" aborts the process running its launch, "hang" never returns, "bad_build" aborts the
#: process building it (FRAGILE_BAD_BUILD=abort) or never returns from its build (=hang), and
#: "wrong" returns a wrong result. Every launch notes "MODE PID PPID" in FRAGILE_LOG, a hanging build its
#: PID in FRAGILE_BUILD_LOG (when set).
FRAGILE_MODULE = '''
import os
import time

import torch

from flyreg import Config, OpRecord, hookimpl

LOG = os.environ["FRAGILE_LOG"]


@hookimpl
def specialize(args, kwargs):
    return {"n": int(args[0].shape[0])}


@hookimpl
def build(config, spec):
    mode, k = config.kwargs["MODE"], config.kwargs["K"]
    if mode == "bad_build":
        if os.environ["FRAGILE_BAD_BUILD"] == "abort":
            os.abort()
        if "FRAGILE_BUILD_LOG" in os.environ:
            with open(os.environ["FRAGILE_BUILD_LOG"], "a", encoding="utf-8") as f:
                f.write(f"{os.getpid()}\\n")
        time.sleep(3600)

    def launch(x):
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(f"{mode} {os.getpid()} {os.getppid()}\\n")
        if mode == "abort":
            os.abort()
        if mode == "hang":
            time.sleep(3600)
        time.sleep(k / 1e3)
        return x * (3 if mode == "wrong" else 2)

    return launch


@hookimpl
def configs(spec):
    ok = [Config({"MODE": "ok", "K": k}) for k in (4, 3, 1, 2, 5)]
    bad = [Config({"MODE": m, "K": 1}) for m in ("abort", "hang", "bad_build", "wrong")]
    return [ok[0], bad[0], ok[1], bad[1], ok[2], bad[2], ok[3], bad[3], ok[4]]


@hookimpl
def default(spec):
    return Config({"MODE": "ok", "K": 4})


@hookimpl
def make_inputs(spec, device):
    return (torch.randn(spec["n"], device=device),), {}


@hookimpl
def reference(args, kwargs):
    return args[0] * 2


@hookimpl
def describe():
    return OpRecord(description="fails in every way a kernel can", version="1", structural=["MODE", "K"])
'''


def fragile_env(tmp_path: Path, bad_build: str) -> tuple[Flyreg, Path]:
    site = fake_distribution(tmp_path / "site", "fragile-ops", "[flyreg.ops]\nfragile = fragile_ops\n",
                             {"fragile_ops/__init__.py": FRAGILE_MODULE})
    log = tmp_path / "launches.log"
    return Flyreg(tmp_path / "run", {"fragile-ops": site}, FRAGILE_LOG=str(log), FLYREG_CANDIDATE_TIMEOUT="3",
                  FLYREG_COMPILE_WORKERS="1", FRAGILE_BAD_BUILD=bad_build), log


def journal_errors(run: Flyreg) -> dict[str, str | None]:
    """MODE -> the journaled error of its first-round row (None for a timing)."""
    with sqlite3.connect(run.dirs["cache"] / "flyreg-journal.sqlite3") as conn:
        rows = conn.execute("SELECT config, error FROM measurements WHERE timing = 'cpu' ORDER BY id").fetchall()
    out: dict[str, str | None] = {}
    for config, error in rows:
        knobs = json.loads(config)["kwargs"]
        out[f"{knobs['MODE']}{knobs['K']}"] = error
    return out


def timed_out(why: object, floor: float) -> bool:
    """Whether ``why`` says its config ran past a time limit of at least ``floor`` s (the worker replaced): the
    limit adapts to the slowest config, so on a loaded machine it is more than the floor."""
    found = re.search(r"timed out after ([\d.e+]+) s \(worker replaced\)", str(why))
    return found is not None and float(found.group(1)) >= floor


def summary_line(out: str, config: str) -> str:
    """The summary's line that reports ``config``'s failure (``K=1 MODE=hang``)."""
    (line,) = [line for line in out.splitlines() if line.startswith(f"  fragile n=64: {config}: ")]
    return line


def tune(run: Flyreg, *extra: str) -> str:
    proc = run.popen("tune", "fragile", "--spec", "n=64", "--device", "cpu", "--isolate", *extra)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, out + err
    assert "Traceback" not in err
    return out


def test_crashes_hangs_and_wrong_results_fail_alone_and_the_best_config_wins(tmp_path: Path) -> None:
    run, log = fragile_env(tmp_path, "abort")
    out = tune(run)

    errors = journal_errors(run)
    assert set(errors) == {"ok1", "ok2", "ok3", "ok4", "ok5", "abort1", "hang1", "bad_build1", "wrong1"}
    assert all(errors[f"ok{k}"] is None for k in range(1, 6))
    assert "the worker died (killed by SIGABRT)" in str(errors["abort1"])
    assert timed_out(errors["hang1"], 3)
    assert "the worker died (killed by SIGABRT)" in str(errors["bad_build1"])
    assert str(errors["wrong1"]).startswith("rejected: output")

    (row,) = table_rows(out)
    assert row[0] == "fragile" and row[2] == "K=1 MODE=ok" and row[-1] == "written"
    assert row[-3:-1] == ["9", "4"]  # tried; failed or rejected
    for line in ("K=1 MODE=abort: the worker died (killed by SIGABRT); worker replaced",
                 "K=1 MODE=bad_build: the worker died (killed by SIGABRT); worker replaced",
                 "K=1 MODE=wrong: rejected: output"):
        assert f"  fragile n=64: {line}" in out
    assert timed_out(summary_line(out, "K=1 MODE=hang"), 3)
    (artifact,) = artifacts(run.dirs["configs"], "fragile").values()
    assert json.loads(artifact.read_text())["config"]["kwargs"] == {"K": 1, "MODE": "ok"}

    launches = [line.split() for line in log.read_text().split("\n") if line]
    assert {mode for mode, _, _ in launches} == {"ok", "abort", "hang", "wrong"}  # bad_build never got to launch
    parents = {ppid for _, _, ppid in launches}
    assert len(parents) == 1 and not parents & {pid for _, pid, _ in launches}  # all in workers of one tune


def test_a_hanging_build_fails_alone_and_the_journal_keeps_every_failure(tmp_path: Path) -> None:
    run, log = fragile_env(tmp_path, "hang")
    out = tune(run)
    assert timed_out(journal_errors(run)["bad_build1"], 3)
    assert table_rows(out)[0][2] == "K=1 MODE=ok"
    launched = log.read_text()

    again = tune(run, "--out", str(tmp_path / "elsewhere"))  # the same search again: all of it is in the journal
    assert "(5 results read from the tuning journal)" in again
    relaunched = log.read_text()[len(launched):]
    # Not one config that crashed or hung runs again; the contenders (the default, the fastest) are checked
    # against the reference again, once each, before one is written.
    assert {line.split()[0] for line in relaunched.splitlines()} == {"ok"} and len(relaunched.splitlines()) <= 2
    (row,) = table_rows(again)
    assert row[2] == "K=1 MODE=ok" and row[-3:-1] == ["9", "4"]



def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_hung_worker_ends_when_its_tune_is_killed(tmp_path: Path) -> None:
    run, log = fragile_env(tmp_path, "abort")
    proc = run.popen("tune", "fragile", "--spec", "n=16", "--device", "cpu", "--isolate",
                     FLYREG_CANDIDATE_TIMEOUT="600")
    deadline = time.monotonic() + 300
    hung: list[list[str]] = []
    while not hung and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
        lines = log.read_text().split("\n") if log.exists() else []
        hung = [line.split() for line in lines if line.startswith("hang ")]
    assert hung, proc.communicate()
    worker = int(hung[0][1])
    assert _running(worker)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(worker)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_ctrl_c_during_a_hung_compile_stops_the_tune_and_its_compile(tmp_path: Path) -> None:
    run, _ = fragile_env(tmp_path, "hang")
    log = tmp_path / "builds.log"
    proc = run.popen("tune", "fragile", "--spec", "n=16", "--device", "cpu", "--isolate",
                     FLYREG_CANDIDATE_TIMEOUT="600", FRAGILE_BUILD_LOG=str(log))
    try:
        deadline = time.monotonic() + 300
        while not (log.exists() and log.read_text()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert log.exists() and log.read_text(), proc.communicate()
        compiling = int(log.read_text().split()[0])
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err
    assert "interrupted: the artifacts written so far are kept" in out
    assert "Traceback" not in err  # not even from the idle benchmarking worker it ended
    assert not _running(compiling)
