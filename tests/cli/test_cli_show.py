"""``flyreg show``: an op's call, axes, buckets and workloads without a spec; a value out of an axis' range refused;
a bucketed value shown with its bucket; and a lookup that reads only its own spec's cache entries, however many the
op has."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from cli_harness import Flyreg, fake_distribution, one_line_error
from test_cli_budget import SLOW_BUILDS

SPEC = "M=1,N=4096,dtype=bfloat16"
#: Cache entries of other specs of the op, none of which a lookup of SPEC may read.
OTHERS = 50_000


def test_show_an_op_without_a_spec_prints_its_call_axes_buckets_and_workloads(tmp_path: Path) -> None:
    from flyreg_rmsnorm import space

    site = fake_distribution(tmp_path / "site", "slow-builds", "[flyreg.ops]\nslowbuild = slow_builds\n",
                             {"slow_builds/__init__.py": SLOW_BUILDS})
    run = Flyreg(tmp_path / "run", {"slow-builds": site})
    text, as_json, undeclared, planned = run.many([
        ["show", "rmsnorm", "--device", "cpu"], ["show", "rmsnorm", "--device", "cpu", "--json"],
        ["show", "slowbuild"], ["tune", "rmsnorm", "--device", "cpu", "--dry-run"]])
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert "call:      rmsnorm(Tensor x, Tensor weight, float eps=1e-06) -> Tensor" in lines
    axes = lines[lines.index("axes:") + 1:]
    assert axes[0].split()[:3] == ["M", "int,", "ordered"] and axes[0].endswith(">= 0")
    assert axes[1].strip().startswith(f"buckets {'|'.join(map(str, space.ROW_BUCKETS))}; row_bucket: ")
    assert any(line.split()[:3] == ["N", "int,", ">="] for line in axes)
    assert "default from the device: cpu on cpu, triton on cuda" in text.stdout
    assert as_json.returncode == 0, as_json.stderr
    shown = json.loads(as_json.stdout)
    assert [a["name"] for a in shown["axes"]] == ["M", "N", "backend", "dtype"]
    m = shown["axes"][0]
    assert (m["low"], m["high"], m["ordered"], m["buckets"]) == (0, None, True, list(space.ROW_BUCKETS))
    assert shown["axes"][2]["device_default"] == {"cpu": "cpu", "cuda": "triton"}
    # the workloads are the jobs `flyreg tune` plans, each shown as --spec takes it
    jobs = [line.split("│")[2].strip() for line in planned.stdout.splitlines() if line.startswith("│ rmsnorm")]
    assert len(shown["workloads"]) == len(jobs) > 0
    assert [f"  {job}" for job in jobs] == [line for line in lines if line.startswith("  M=")]
    assert undeclared.returncode == 0, undeclared.stderr
    assert "call:      slowbuild(x)" in undeclared.stdout
    assert "axes:      not declared" in undeclared.stdout and "workloads: 2 on " in undeclared.stdout


def test_a_value_outside_an_axis_range_is_refused_and_a_bucketed_one_is_shown_with_its_bucket(tmp_path: Path) -> None:
    run = Flyreg(tmp_path / "run")
    negative, huge, bucketed, as_json = run.many([
        ["show", "rmsnorm", "--spec", "M=-5,N=4096,dtype=bfloat16"],
        ["show", "rmsnorm", "--spec", "M=300,N=0,dtype=bfloat16"],
        ["show", "rmsnorm", "--spec", "M=300,N=4096,dtype=bfloat16", "--device", "cpu"],
        ["show", "rmsnorm", "--spec", "M=300,N=4096,dtype=bfloat16", "--device", "cpu", "--json"]])
    line = one_line_error(negative, 2)  # never served as M=1
    assert "does not fit the op's axes: M: -5 is out of its range >= 0." in line
    assert "M (int, ordered, >= 0, buckets" in line  # the allowed range, with the other axes
    assert "N: 0 is out of its range >= 1" in one_line_error(huge, 2)
    assert bucketed.returncode == 0, bucketed.stderr
    assert "spec:    M=300 (bucket 4096),N=4096,backend=cpu,dtype=bfloat16" in bucketed.stdout.splitlines()
    [row] = json.loads(as_json.stdout)
    assert row["spec"]["M"] == 4096 and row["given"] == {"M": 300}


def test_show_reads_only_the_cache_entries_of_its_spec(tmp_path: Path) -> None:
    run = Flyreg(tmp_path / "run")
    tuned = run.run("tune", "rmsnorm", "--spec", SPEC, "--device", "cpu")
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    db = run.dirs["cache"] / "flyreg-cache.sqlite3"  # the scratch cache (docs/cli.md)
    with sqlite3.connect(db) as conn:  # as a long-lived machine's cache: entries of many other specs of the op
        [(key, op)] = conn.execute("SELECT key, op FROM entries").fetchall()
        fields = json.loads(key)
        rows = []
        for i in range(OTHERS):
            other = {**fields, "spec": {**fields["spec"], "N": 5000 + i}}
            # each entry unreadable: reading one warns, so the lookup's stderr counts the entries it read
            rows.append((op, json.dumps(other, sort_keys=True, separators=(",", ":")), "{not json", time.time()))
        conn.executemany("INSERT INTO entries VALUES (?, ?, ?, ?)", rows)
    shown = run.run("show", "rmsnorm", "--spec", SPEC, "--device", "cpu")
    assert shown.returncode == 0, shown.stderr
    assert "source:  cache" in shown.stdout.splitlines(), shown.stdout
    assert "corrupt entry" not in shown.stderr, shown.stderr[:2000]
    other = run.run("show", "rmsnorm", "--spec", "M=1,N=5007,dtype=bfloat16", "--device", "cpu")
    assert other.returncode == 0 and "source:  default" in other.stdout.splitlines(), other.stdout + other.stderr
    assert other.stderr.count("corrupt entry") == 1, other.stderr[:2000]  # its own entry, and no other
