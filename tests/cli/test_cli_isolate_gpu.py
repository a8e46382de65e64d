"""``flyreg tune --isolate`` on a GPU (marker ``gpu``): a Triton config that makes an illegal memory access
fails alone with CUDA's one-line message, its poisoned worker is replaced, the configs after it are timed
in a fresh worker, and the tune writes a good config's artifact."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest
import torch

from cli_harness import Flyreg, fake_distribution, table_rows

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

#: ``out = 2 * x`` in BLOCK-element programs; a config with BAD=1 stores 2**40 elements past ``out``.
WILD_MODULE = '''
import torch
import triton
import triton.language as tl

from flyreg import Config, OpRecord, hookimpl


@triton.jit
def _double(x_ptr, out_ptr, n, shift, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out_ptr + (i.to(tl.int64) + shift), tl.load(x_ptr + i, mask=m) * 2, mask=m)


@hookimpl
def specialize(args, kwargs):
    return {"n": int(args[0].shape[0])}


@hookimpl
def build(config, spec):
    block, shift = config.kwargs["BLOCK"], (1 << 40) if config.kwargs["BAD"] else 0

    def launch(x):
        out = torch.empty_like(x)
        _double[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), shift, BLOCK=block)
        return out

    return launch


@hookimpl
def configs(spec):
    return [Config({"BLOCK": b, "BAD": bad}) for b, bad in ((256, 0), (512, 1), (1024, 0), (128, 1), (2048, 0))]


@hookimpl
def default(spec):
    return Config({"BLOCK": 1024, "BAD": 0})


@hookimpl
def make_inputs(spec, device):
    return (torch.randn(spec["n"], device=device),), {}


@hookimpl
def reference(args, kwargs):
    return args[0] * 2


@hookimpl
def describe():
    return OpRecord(description="doubles x; BAD configs store far out of bounds", version="1",
                    structural=["BLOCK", "BAD"])
'''


def journaled(run: Flyreg) -> dict[tuple[int, int], list[str | None]]:
    """(BLOCK, BAD) -> the journaled errors of its rows, in order (None for a timing)."""
    with sqlite3.connect(run.dirs["cache"] / "flyreg-journal.sqlite3") as conn:
        rows = conn.execute("SELECT config, error FROM measurements ORDER BY id").fetchall()
    out: dict[tuple[int, int], list[str | None]] = {}
    for config, error in rows:
        knobs = json.loads(config)["kwargs"]
        out.setdefault((knobs["BLOCK"], knobs["BAD"]), []).append(error)
    return out


def test_an_illegal_memory_access_fails_its_config_and_replaces_the_worker(tmp_path: Path) -> None:
    site = fake_distribution(tmp_path / "site", "wild-ops", "[flyreg.ops]\nwild = wild_ops\n",
                             {"wild_ops/__init__.py": WILD_MODULE})
    run = Flyreg(tmp_path / "run", {"wild-ops": site}, FLYREG_COMPILE_WORKERS="1")
    proc = run.popen("tune", "wild", "--spec", f"n={1 << 22}", "--device", "cuda", "--isolate")
    try:
        out, err = proc.communicate(timeout=500)
    except subprocess.TimeoutExpired:
        proc.kill()  # its workers end within a second of it
        proc.communicate()
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr

    (row,) = table_rows(done.stdout)
    assert "BAD=0" in row[2] and row[-1] == "written"
    errors = journaled(run)
    for bad in ((512, 1), (128, 1)):
        why = str(errors[bad][0])
        assert "illegal memory access" in why and "CUDA context unusable); worker replaced" in why, why
        assert "\n" not in why  # torch's debugging hints are cut
    for good in ((256, 0), (1024, 0), (2048, 0)):  # 2048 comes after both poisoned workers
        assert errors[good] and all(e is None for e in errors[good]), errors[good]
    stored = [json.loads(p.read_text()) for p in run.dirs["configs"].rglob("wild*.json")]
    assert len(stored) == 1 and stored[0]["config"]["kwargs"]["BAD"] == 0
