"""``flyreg tune``'s search options and its journal: --effort, --budget, --fresh, and resuming after kill -9."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path

from cli_harness import fake_distribution
from test_cli import Flyreg, one_line_error

#: An op of CONFIGS configs whose call sleeps DELAY_MS (from the environment, default 0).
SLOW_MODULE = '''
import os
import time

import torch

from flyreg import Config, OpRecord, hookimpl

DELAY = float(os.environ.get("SLOW_DELAY_MS", "0")) / 1e3
CONFIGS = int(os.environ.get("SLOW_CONFIGS", "300"))


@hookimpl
def specialize(args, kwargs):
    return {"n": int(args[0].shape[0])}


@hookimpl
def build(config, spec):
    def launch(x):
        time.sleep(DELAY)
        return x

    return launch


@hookimpl
def configs(spec):
    return [Config({"K": k}) for k in range(CONFIGS)]


@hookimpl
def default(spec):
    return Config({"K": 0})


@hookimpl
def make_inputs(spec, device):
    return (torch.zeros(spec["n"], device=device),), {}


@hookimpl
def describe():
    return OpRecord(description="sleeps per call", version="1", structural=[])
'''


def slow_env(tmp_path: Path) -> Flyreg:
    site = fake_distribution(tmp_path / "site", "slow-ops", "[flyreg.ops]\nslow = slow_ops\n",
                             {"slow_ops/__init__.py": SLOW_MODULE})
    return Flyreg(tmp_path / "run", {"slow-ops": site})


def journal_rows(run: Flyreg, timing: str = "cpu") -> list[str]:
    """The configs of the journal's rows of the first round (``timing``), oldest first."""
    path = run.dirs["cache"] / "flyreg-journal.sqlite3"
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        try:
            return [r[0] for r in conn.execute("SELECT config FROM measurements WHERE timing = ? ORDER BY id",
                                               (timing,))]
        except sqlite3.OperationalError:  # not created yet
            return []


def test_kill_9_then_the_same_command_times_nothing_already_journaled(tmp_path: Path) -> None:
    run = slow_env(tmp_path)
    env = {"SLOW_CONFIGS": "40", "SLOW_DELAY_MS": "2"}
    command = ("tune", "slow", "--spec", "n=4", "--device", "cpu", "--effort", "full")
    proc = run.popen(*command, **env)
    deadline = time.monotonic() + 60
    while len(journal_rows(run)) < 5 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()  # still in the middle of the spec
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    before = journal_rows(run)
    assert 5 <= len(before) < 40
    again = run.run(*command, **env)
    assert again.returncode == 0, again.stdout + again.stderr
    after = journal_rows(run)
    assert after[:len(before)] == before  # the killed run's measurements are all kept
    assert max(Counter(after).values()) == 1 and len(after) == 40  # each config timed once, over both runs
    assert f"({len(before)} results read from the tuning journal)" in again.stdout
    rerun = run.run(*command, **env)  # finished: the same command again times nothing at all
    assert rerun.returncode == 0 and journal_rows(run) == after
    fresh = run.run(*command, "--fresh", "--force", **env)
    assert fresh.returncode == 0 and len(journal_rows(run)) == 80


def test_effort_budget_and_their_errors(tmp_path: Path) -> None:
    run = slow_env(tmp_path)
    quick = run.run("tune", "slow", "--spec", "n=4", "--device", "cpu", "--effort", "quick")
    assert quick.returncode == 0, quick.stderr
    assert 0 < len(journal_rows(run)) <= 45  # at most 15 % of the 300 configs
    full = run.run("tune", "slow", "--spec", "n=4", "--device", "cpu", "--effort", "full", "--force")
    assert full.returncode == 0, full.stderr
    assert sorted(Counter(journal_rows(run)).values()) == [1] * 300  # the rest timed, none twice
    budget = run.run("tune", "slow", "--spec", "n=8", "--device", "cpu", "--effort", "full", "--budget", "0.3",
                     SLOW_DELAY_MS="3")
    assert budget.returncode == 0, budget.stderr
    assert 300 < len(journal_rows(run)) < 600  # n=8 stopped after its budget
    assert "--budget" in one_line_error(run.run("tune", "slow", "--budget", "0"), 2)
    assert "--effort" in one_line_error(run.run("tune", "slow", "--effort", "fast"), 2)


def test_journaled_times_of_a_wide_spread_still_make_a_valid_artifact(tmp_path: Path) -> None:
    # A noisy timing's middle reps can span more than twice its median; read back from the journal, its band
    # must not reach below 0 ms, which the artifact's validator refuses.
    run = slow_env(tmp_path)
    out = tmp_path / "out"
    first = run.run("tune", "slow", "--spec", "n=4", "--device", "cpu", "--out", str(out), SLOW_CONFIGS="6")
    assert first.returncode == 0, first.stderr
    with sqlite3.connect(run.dirs["cache"] / "flyreg-journal.sqlite3") as conn:
        assert conn.execute("UPDATE measurements SET spread = 2.5").rowcount >= 6
    again = run.run("tune", "slow", "--spec", "n=4", "--device", "cpu", "--out", str(out), "--force",
                    SLOW_CONFIGS="6")
    assert again.returncode == 0, again.stderr
    check = run.run("check", str(out), SLOW_CONFIGS="6")
    assert check.returncode == 0, check.stdout + check.stderr
    (artifact,) = out.glob("slow,*.json")
    decision = json.loads(artifact.read_text(encoding="utf-8"))["provenance"]["decision"]
    assert decision["winner"]["p20_ms"] >= 0 and decision["winner"]["p80_ms"] > decision["winner"]["median_ms"]


#: Two toy ops: ``loose`` declares no axes (a spec may hold any), ``ddtype`` a dtype axis with a device default.
AXES_MODULE = '''
import torch
from flyreg import Config, OpRecord, hookimpl
from flyreg.plugin import Axis


class Toy:
    def __init__(self, axes):
        self.axes = axes

    @hookimpl
    def specialize(self, args, kwargs):
        return {"n": int(args[0].shape[0]), **({"dtype": str(args[0].dtype)[6:]} if self.axes else {})}

    @hookimpl
    def build(self, config, spec):
        return lambda x: x

    @hookimpl
    def configs(self, spec):
        return [Config({"K": 0})]

    @hookimpl
    def default(self, spec):
        return Config({"K": 0})

    @hookimpl
    def workloads(self, device):
        return [{"n": n, **({"dtype": "float32"} if self.axes else {})} for n in (4, 8)]

    @hookimpl
    def make_inputs(self, spec, device):
        return (torch.zeros(spec["n"], dtype=getattr(torch, spec.get("dtype", "float32")), device=device),), {}

    @hookimpl
    def describe(self):
        return OpRecord(description="toy", version="1", structural=[], axes=self.axes)


loose = Toy([])
ddtype = Toy([Axis("n", int), Axis("dtype", str, device_default=lambda device: "float32")])
'''


def test_where_and_spec_checks_leave_undeclared_and_defaulted_axes_alone(tmp_path: Path) -> None:
    site = fake_distribution(tmp_path / "site", "axes-ops", "[flyreg.ops]\nloose = axes_ops:loose\n"
                             "ddtype = axes_ops:ddtype\n", {"axes_ops.py": AXES_MODULE})
    run = Flyreg(tmp_path / "run", {"axes-ops": site})
    loose = run.run("tune", "loose", "--where", "n=4", "--device", "cpu", "--dry-run")
    assert loose.returncode == 0 and "n=4" in loose.stdout and "n=8" not in loose.stdout, loose.stderr
    # A device default fills an axis left out; a value given is the user's (only a declared op's backend is a rule).
    given = run.run("tune", "ddtype", "--spec", "n=4,dtype=float64", "--device", "cpu", "--dry-run")
    assert given.returncode == 0 and "dtype=float64" in given.stdout, given.stderr
