"""``flyreg tune --budget``: a spec's search ends within its seconds, binding and compiling included, on a large
space of slow builds; the progress bar counts configs within a spec, and specs."""

from __future__ import annotations

import re
import time
from pathlib import Path

from cli_harness import fake_distribution, table_rows
from test_cli import Flyreg

#: An op of 2,304 configs (a 12 x 12 x 16 grid) whose every build sleeps BUILD_MS (from the environment).
SLOW_BUILDS = '''
import os
import time

import torch

from flyreg import Config, OpRecord, hookimpl

BUILD = float(os.environ.get("BUILD_MS", "300")) / 1e3


@hookimpl
def specialize(args, kwargs):
    return {"n": int(args[0].shape[0])}


@hookimpl
def build(config, spec):
    time.sleep(BUILD)  # a compile
    k = config.kwargs

    def launch(x):
        return x * 1.0 + (k["A"] + k["B"] + k["C"]) * 0.0

    return launch


@hookimpl
def configs(spec):
    return [Config({"A": a, "B": b, "C": c}) for a in range(12) for b in range(12) for c in range(16)]


@hookimpl
def default(spec):
    return Config({"A": 0, "B": 0, "C": 0})


@hookimpl
def workloads(device):
    return [{"n": n} for n in (4, 8)]


@hookimpl
def make_inputs(spec, device):
    return (torch.ones(spec["n"], device=device),), {}


@hookimpl
def reference(args, kwargs):
    return args[0].double()


@hookimpl
def describe():
    return OpRecord(description="every build sleeps", version="1", arg_names=["x"])
'''

BUILD_S = 0.3
BUDGET_S = 2.0
#: What a loaded 2-core machine may add to a budgeted search besides one build and one timing: the
#: planning, making the inputs and the reference, writing the artifact. Today's first batch alone,
#: 47 builds, takes 14 s.
SLACK_S = 3.0


def slow_builds(tmp_path: Path) -> Flyreg:
    site = fake_distribution(tmp_path / "site", "slow-builds", "[flyreg.ops]\nslowbuild = slow_builds\n",
                             {"slow_builds/__init__.py": SLOW_BUILDS})
    return Flyreg(tmp_path / "run", {"slow-builds": site})


def cost_seconds(stdout: str) -> float:
    """The wall time of the tune's jobs, from its ``cost:`` line (the process's start and the op's import left out)."""
    found = re.search(r"^cost: .*, (\d+(?:\.\d+)?) s$", stdout, re.MULTILINE)
    assert found, stdout
    return float(found.group(1))


def test_a_budget_ends_the_search_within_its_seconds_and_one_build(tmp_path: Path) -> None:
    run = slow_builds(tmp_path)
    start = time.monotonic()
    proc = run.run("tune", "slowbuild", "--spec", "n=4", "--device", "cpu", "--budget", str(BUDGET_S))
    wall = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cost_seconds(proc.stdout) <= BUDGET_S + BUILD_S + SLACK_S, proc.stdout
    assert wall < 60  # the process's start and torch's import included
    [row] = table_rows(proc.stdout)
    tried = int(row[-3])  # tried, failed, result
    # It timed what fits: at least the default, never more than the budget has room to build.
    assert 1 <= tried <= (BUDGET_S + BUILD_S) / BUILD_S, proc.stdout


def test_the_progress_bar_counts_the_configs_of_a_spec_and_the_specs(tmp_path: Path) -> None:
    run = slow_builds(tmp_path)
    # As in a terminal (rich redraws the bar as it goes): the specs line, and under it the configs line.
    proc = run.run("tune", "slowbuild", "--device", "cpu", "--budget", "1", BUILD_MS="50", TTY_COMPATIBLE="1",
                   COLUMNS="120")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line).strip() for line in proc.stderr.splitlines()]
    specs = [m.groups() for line in lines if (m := re.match(r"slowbuild (n=\d) .* (\d)/2 ", line))]
    configs = [int(m.group(1)) for line in lines if (m := re.match(r"configs \(budget 1 s\) .* (\d+)/345 ", line))]
    assert specs[0] == ("n=4", "0") and specs[-1] == ("n=8", "2"), lines
    # 15 % of the 2,304 configs planned; each spec counted up from 0, past the first config, and started again.
    assert configs and max(configs) >= 2 and configs.count(0) >= 2, lines
    assert "configs" not in lines[-1]  # hidden once the specs are done
