"""A serving record (``FLYREG_RECORD``, ``flyreg.record``) drives ``flyreg tune --from-record`` and gates
``flyreg check --against-record``; concurrent and forked processes add to one record without losing calls.

Programs and commands run in fresh interpreters that see flyreg's own ops and the toy op of
``toy_ops.py`` only; tuning is on the CPU.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_harness import Flyreg, one_line_error, table_rows
from toy_ops import NAME, toy_site

#: Runs each (n, dtype, calls) of argv[1] through toyscale, then prints what served each spec.
PROGRAM = """
import json, sys, torch, flyreg
op = flyreg.op("toyscale")
served = []
for n, dtype, calls in json.loads(sys.argv[1]):
    x = torch.randn(n, dtype=getattr(torch, dtype))
    for _ in range(calls):
        y = op(x)
    assert torch.equal(y, x * 2)
    res = flyreg.resolve("toyscale", x)  # a memory hit: the resolution the calls got
    served.append({"spec": res.spec, "origin": res.origin, "nearest": res.nearest, "calls": calls})
print(json.dumps(served))
"""
#: argv[2] calls of toyscale on 64 float64 elements inside flyreg.record(argv[1]).
IN_BLOCK = """
import sys, torch, flyreg
op, x = flyreg.op("toyscale"), torch.randn(64, dtype=torch.float64)
with flyreg.record(sys.argv[1]) as path:
    for _ in range(int(sys.argv[2])):
        op(x)
"""
#: Under FLYREG_RECORD: 3 calls, then a forked child makes 2 and exits, then the parent 1 more.
FORKED = """
import os, sys, torch, flyreg
op, x = flyreg.op("toyscale"), torch.randn(32, dtype=torch.float64)
for _ in range(3):
    op(x)
pid = os.fork()
if pid == 0:
    op(x); op(x)
    sys.exit(0)
assert os.waitpid(pid, 0)[1] == 0
op(x)
"""
CALLS = [[256, "float32", 3], [4096, "float32", 2], [256, "float64", 4]]


def spec_of(text: str) -> dict[str, Any]:
    """``dtype=float32,n=4096`` -> ``{"dtype": "float32", "n": 4096}``."""
    return {k: json.loads(v) if v.isdigit() else v for k, v in (part.split("=", 1) for part in text.split(","))}


def key(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True)


def program(cmd: Flyreg, code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-c", code, *args], env={**cmd.env, **env}, cwd=cmd.root, text=True,
                          capture_output=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return proc


def missing_lines(text: str) -> dict[str, int]:
    """``check --against-record``'s lines of specs with no current artifact: spec key -> calls."""
    found = {}
    for m in re.finditer(r"^(?:missing|stale artifact): toyscale (\S+) on .*: (\d+) call\(s\)", text, re.M):
        found[key(spec_of(m[1]))] = int(m[2])
    return found


@pytest.fixture(scope="module")
def cmd(tmp_path_factory: pytest.TempPathFactory) -> Flyreg:
    root = tmp_path_factory.mktemp("record")
    return Flyreg(root, {NAME: toy_site(root / "site")})


@pytest.fixture(scope="module")
def recorded(cmd: Flyreg) -> tuple[Path, list[dict[str, Any]]]:
    """An artifact for n=256 float32, then PROGRAM's CALLS under FLYREG_RECORD: the record and what served."""
    tuned = cmd.run("tune", "toyscale", "--spec", "n=256,dtype=float32", "--device", "cpu")
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    record = cmd.root / "serving.sqlite3"
    served = json.loads(program(cmd, PROGRAM, json.dumps(CALLS), FLYREG_RECORD=str(record)).stdout)
    return record, served


def untuned(served: list[dict[str, Any]]) -> dict[str, int]:
    """The specs served by the default or by a nearest artifact, with their calls."""
    return {key(s["spec"]): s["calls"] for s in served
            if s["origin"] == "default" or (s["origin"] == "offline" and s["nearest"])}


def test_the_program_met_every_kind_of_source(recorded: tuple[Path, list[dict[str, Any]]]) -> None:
    _, served = recorded
    kinds = {("nearest" if s["nearest"] else s["origin"]) for s in served}
    assert {"default", "nearest"} <= kinds and kinds - {"default", "nearest"}  # and one tuned for itself


def test_from_record_plans_exactly_the_specs_served_by_a_default_or_a_nearest_artifact(
        cmd: Flyreg, recorded: tuple[Path, list[dict[str, Any]]]) -> None:
    record, served = recorded
    proc = cmd.run("tune", "--from-record", str(record), "--device", "cpu", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    planned = {key(spec_of(spec)) for op, spec, action in table_rows(proc.stdout) if action == "tune"}
    assert planned == set(untuned(served)) and len(planned) == 2


def test_against_record_fails_on_a_missing_artifact_and_passes_once_tuned(
        cmd: Flyreg, recorded: tuple[Path, list[dict[str, Any]]]) -> None:
    record, served = recorded
    before = cmd.run("check", "--against-record", str(record))
    assert before.returncode == 1, before.stdout + before.stderr
    assert missing_lines(before.stdout) == untuned(served)  # each with the calls it served
    assert re.search(r"checked 3 recorded spec\(s\) from .*: 2 without a current artifact", before.stdout)

    out = cmd.root / "from-record"
    tuned = cmd.run("tune", "--from-record", str(record), "--device", "cpu", "--out", str(out))
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    assert len(list(out.glob("toyscale,*.json"))) == 2
    after = cmd.run("check", "--against-record", str(record), str(cmd.dirs["configs"]), str(out))
    assert after.returncode == 0, after.stdout + after.stderr
    assert missing_lines(after.stdout) == {}
    again = cmd.run("check", "--against-record", str(record), str(out))  # the first artifact is elsewhere
    assert again.returncode == 1 and len(missing_lines(again.stdout)) == 1


def test_a_recorded_spec_the_op_no_longer_takes_fails_alone_and_a_hand_written_row_is_skipped(
        cmd: Flyreg, recorded: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    record, served = recorded
    edited = tmp_path / "edited.sqlite3"
    edited.write_bytes(record.read_bytes())
    with contextlib.closing(sqlite3.connect(edited)) as db, db:
        names = [r[1] for r in db.execute("PRAGMA table_info(served)")]
        row = dict(zip(names, db.execute("SELECT * FROM served WHERE origin = 'default'").fetchone()))
        for spec in ({**json.loads(row["spec"]), "zz": 1}, [1, 2]):  # an axis the op lacks; no spec at all
            values = {**row, "spec": json.dumps(spec)}
            db.execute(f"INSERT INTO served ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                       [values[n] for n in names])
    plan = cmd.run("tune", "--from-record", str(edited), "--device", "cpu", "--dry-run")
    rows = table_rows(plan.stdout)
    assert {key(spec_of(spec)) for op, spec, action in rows if action == "tune"} == set(untuned(served))
    assert [spec for op, spec, action in rows if "unknown axis zz" in action] == [spec_arg_of(row, zz=1)]
    check = cmd.run("check", "--against-record", str(edited))
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr
    assert re.search(r"checked 4 recorded spec\(s\)", check.stdout)  # the row without a spec is skipped


def spec_arg_of(row: dict[str, Any], **extra: Any) -> str:
    """A record row's spec with ``extra`` as ``flyreg tune``'s table writes it (``dtype=float64,n=256,zz=1``)."""
    spec = {**json.loads(row["spec"]), **extra}
    return ",".join(f"{k}={v}" for k, v in sorted(spec.items()))


def test_concurrent_processes_and_a_forked_child_lose_no_call(cmd: Flyreg) -> None:
    record = cmd.root / "shared.sqlite3"
    procs = [subprocess.Popen([sys.executable, "-c", IN_BLOCK, str(record), str(n)], env=cmd.env, cwd=cmd.root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (40, 50, 60, 70)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    program(cmd, FORKED, FLYREG_RECORD=str(record))
    found = missing_lines(cmd.run("check", "--against-record", str(record)).stdout)
    assert found == {key({"dtype": "float64", "n": 64}): 220, key({"dtype": "float64", "n": 32}): 6}


def test_record_errors_are_one_line(cmd: Flyreg) -> None:
    nothing = cmd.root / "nothing.sqlite3"
    assert "no serving record" in one_line_error(cmd.run("check", "--against-record", str(nothing)), 1)
    other = cmd.root / "other.json"
    other.write_text("{}", encoding="utf-8")
    assert "is not a serving record" in one_line_error(cmd.run("tune", "--from-record", str(other)), 1)
    assert other.read_text(encoding="utf-8") == "{}"  # read, never moved or changed
    mixed = cmd.run("tune", "toyscale", "--from-record", str(other), "--spec", "n=1,dtype=float32")
    assert "--from-record" in one_line_error(mixed, 2)
