"""``flyreg.record`` in-process and ``flyreg.plugin.Work``: counts, results and errors, through the public API.

The record is read back by ``flyreg check --against-record`` (a fresh interpreter); calls go to
flyreg's own RMSNorm op on the CPU, whose specs here have no artifact (each is served by its default).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flyreg
from flyreg.plugin import Work


def recorded_calls(record: Path) -> dict[str, int]:
    """Calls per spec in ``record``, as ``flyreg check --against-record`` lists them."""
    proc = subprocess.run([sys.executable, "-m", "flyreg", "check", "--against-record", str(record)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # no artifact for any of them
    return {m[1]: int(m[2]) for m in re.finditer(r"^missing: rmsnorm (\S+) on .*: (\d+) call\(s\) served by default$",
                                                 proc.stdout, re.M)}


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xd = x.double()
    return xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + 1e-6) * w.double()


def test_calls_inside_the_block_are_counted_and_computed_as_without(tmp_path: Path) -> None:
    op = flyreg.op("rmsnorm")
    x, w = torch.randn(7, 96), torch.rand(96) + 0.5
    wide = torch.randn(3, 200)
    before = op(x, w)  # resolved and bound before recording: counted afresh inside the block
    with flyreg.record(tmp_path / "serving.sqlite3") as path:
        assert path == (tmp_path / "serving.sqlite3").absolute()
        outs = [op(x, w) for _ in range(5)] + [op(x, w, 1e-6)]  # a keyword: another signature, the same spec
        for _ in range(3):
            op(wide, torch.ones(200))
    op(x, w)  # after the block: not counted
    for out in (before, *outs):
        torch.testing.assert_close(out.double(), reference(x, w), rtol=1e-5, atol=1e-5)
    assert recorded_calls(path) == {"M=32,N=96,backend=cpu,dtype=float32": 6, "M=32,N=200,backend=cpu,dtype=float32": 3}


def test_blocks_add_to_one_file_and_nest_on_the_same_file_only(tmp_path: Path) -> None:
    op, x, w = flyreg.op("rmsnorm"), torch.randn(2, 64), torch.ones(64)
    path = tmp_path / "serving.sqlite3"
    with flyreg.record(path):
        op(x, w)
        with flyreg.record(path):
            op(x, w)
        with pytest.raises(RuntimeError, match="already recording into"):
            with flyreg.record(tmp_path / "other.sqlite3"):
                pass
        op(x, w)
    with flyreg.record(str(path)):
        op(x, w)
    assert recorded_calls(path) == {"M=32,N=64,backend=cpu,dtype=float32": 4}
    assert not (tmp_path / "other.sqlite3").exists()


@pytest.mark.parametrize("bad", [None, 3, b"bytes", ""])
def test_record_takes_a_path(bad: object) -> None:
    with pytest.raises(TypeError, match="record\\(\\) takes the record's file path"):
        with flyreg.record(bad):  # type: ignore[arg-type]
            pass


def test_work_states_bytes_or_flops() -> None:
    assert Work(bytes=1024).flops is None and Work(flops=2e9, bytes=0).bytes == 0
    with pytest.raises(ValueError, match="needs bytes or flops"):
        Work()
    for field, value in (("bytes", -1), ("flops", math.nan), ("bytes", True), ("flops", "1e9"), ("bytes", math.inf)):
        with pytest.raises(ValueError, match=f"Work {field} must be a finite number"):
            Work(**{field: value})  # type: ignore[arg-type]
