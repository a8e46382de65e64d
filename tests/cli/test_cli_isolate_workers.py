"""``flyreg tune --isolate``, the workers: a raising config keeps its worker while an abort or a hang
replaces it, nothing runs in the tune's own process, the time limit follows the candidates already
timed, and a worker that cannot make its inputs is one clear error."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from cli_harness import Flyreg, fake_distribution, table_rows
from test_cli_isolate import journal_errors, timed_out

#: An op whose configs come from WORKERS_CONFIGS ("MODE:K,..."): MODE "ok" sleeps K ms a call, "slow" sleeps
#: K s, "abort" aborts its process, "hang" never returns and "raise" raises. Every launch notes
#: "MODE K PID PPID" in WORKERS_LOG; WORKERS_NO_INPUTS makes ``make_inputs`` fail, and WORKERS_FULL_AFTER (a
#: file) makes every call of it after the first (the benchmarking worker's) run out of device memory.
WORKERS_MODULE = '''
import os
import time

import torch

from flyreg import Config, OpRecord, hookimpl


@hookimpl
def specialize(args, kwargs):
    return {"n": int(args[0].shape[0])}


@hookimpl
def build(config, spec):
    mode, k = config.kwargs["MODE"], config.kwargs["K"]

    def launch(x):
        with open(os.environ["WORKERS_LOG"], "a", encoding="utf-8") as f:
            f.write(f"{mode} {k} {os.getpid()} {os.getppid()}\\n")
        if mode == "abort":
            os.abort()
        if mode == "hang":
            time.sleep(3600)
        if mode == "raise":
            raise RuntimeError("illegal value for this config")
        time.sleep(k if mode == "slow" else k / 1e3)
        return x * 2

    return launch


@hookimpl
def configs(spec):
    pairs = [item.split(":") for item in os.environ["WORKERS_CONFIGS"].split(",")]
    return [Config({"MODE": mode, "K": int(k)}) for mode, k in pairs]


@hookimpl
def default(spec):
    return configs(spec)[0]


@hookimpl
def make_inputs(spec, device):
    if "WORKERS_NO_INPUTS" in os.environ:
        raise ImportError("no such kernel library")
    full = os.environ.get("WORKERS_FULL_AFTER")
    if full:
        made = os.path.exists(full)
        open(full, "a").close()
        if made:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return (torch.randn(spec["n"], device=device),), {}


@hookimpl
def reference(args, kwargs):
    return args[0] * 2


@hookimpl
def describe():
    return OpRecord(description="configs that fail as WORKERS_CONFIGS says", version="1", structural=["MODE", "K"])
'''


def workers_env(tmp_path: Path, configs: str, timeout: str, **env: str) -> tuple[Flyreg, Path]:
    site = fake_distribution(tmp_path / "site", "workers-ops", "[flyreg.ops]\nworkers = workers_ops\n",
                             {"workers_ops/__init__.py": WORKERS_MODULE})
    log = tmp_path / "launches.log"
    return Flyreg(tmp_path / "run", {"workers-ops": site}, WORKERS_LOG=str(log), WORKERS_CONFIGS=configs,
                  FLYREG_CANDIDATE_TIMEOUT=timeout, FLYREG_COMPILE_WORKERS="1", **env), log


def tune(run: Flyreg) -> subprocess.CompletedProcess[str]:
    proc = run.popen("tune", "workers", "--spec", "n=64", "--device", "cpu", "--isolate")
    out, err = proc.communicate(timeout=400)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def launches(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().split("\n") if line]


def test_a_raising_config_keeps_its_worker_and_an_abort_or_a_hang_replaces_it(tmp_path: Path) -> None:
    run, log = workers_env(tmp_path, "ok:3,abort:1,ok:2,hang:1,ok:1,raise:1,ok:4", "3")
    proc = tune(run)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr

    (row,) = table_rows(proc.stdout)
    assert row[2] == "K=1 MODE=ok" and row[-1] == "written"
    errors = journal_errors(run)
    assert all(errors[f"ok{k}"] is None for k in range(1, 5))
    assert "SIGABRT" in str(errors["abort1"])
    assert timed_out(errors["hang1"], 3)
    assert "RuntimeError: illegal value" in str(errors["raise1"])

    seen = launches(log)
    assert {mode for mode, *_ in seen} == {"ok", "abort", "hang", "raise"}
    workers, parents = {pid for *_, pid, _ in seen}, {ppid for *_, ppid in seen}
    assert len(parents) == 1 and not parents & workers  # nothing ran in the tune's own process
    assert len(workers) == 3  # the first, and one for the abort and the hang each: the raise kept its worker
    raised_in = {pid for mode, _, pid, _ in seen if mode == "raise"}
    assert raised_in <= {pid for mode, _, pid, _ in seen if mode == "ok"}


def test_the_time_limit_adapts_to_the_configs_already_timed(tmp_path: Path) -> None:
    # The least limit is 0.5 s. Each fast config takes more than 0.05 s of sleeps in its worker, so a config
    # hanging after them gets 20 times the slowest: over the least limit, far under the first config's 600 s.
    run, log = workers_env(tmp_path, "ok:8,ok:4,slow:60,ok:1", "0.5")
    proc = tune(run)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr

    errors = journal_errors(run)
    assert errors["ok8"] is None and errors["ok4"] is None and errors["ok1"] is None
    limit = re.fullmatch(r"timed out after ([\d.e+]+) s \(worker replaced\)", str(errors["slow60"]))
    assert limit, errors["slow60"]
    assert 0.5 < float(limit.group(1)) < 30
    assert table_rows(proc.stdout)[0][2] == "K=1 MODE=ok"
    assert [mode for mode, *_ in launches(log)].count("slow") == 1  # killed in its first call


def test_a_compile_that_runs_out_of_device_memory_leaves_its_config_to_the_benchmarking_worker(tmp_path: Path) -> None:
    # Each compile pool process makes the op's inputs too; where the device cannot hold them all, the
    # config is not failed: the benchmarking worker builds it itself and times it.
    run, log = workers_env(tmp_path, "ok:3,ok:1,ok:2", "3", WORKERS_FULL_AFTER=str(tmp_path / "made"))
    proc = tune(run)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert journal_errors(run) == {"ok3": None, "ok1": None, "ok2": None}
    assert table_rows(proc.stdout)[0][2] == "K=1 MODE=ok"
    assert {mode for mode, *_ in launches(log)} == {"ok"}


def test_a_worker_that_cannot_make_its_inputs_is_one_clear_error(tmp_path: Path) -> None:
    run, log = workers_env(tmp_path, "ok:1,ok:2", "3", WORKERS_NO_INPUTS="1")
    proc = tune(run)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    (row,) = table_rows(proc.stdout)
    assert row[-1] == ("failed: IsolationError: the candidate worker could not set up: "
                       "HookError: workers.make_inputs raised ImportError: no such kernel library")
    assert not log.exists()  # no config ran
