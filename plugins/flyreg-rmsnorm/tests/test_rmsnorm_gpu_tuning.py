"""The RMSNorm plugin through flyreg's tuner on a real GPU (marker ``gpu``)."""

from __future__ import annotations

import importlib.metadata
import os

import pytest
import torch

import flyreg
from flyreg_rmsnorm import ops

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def installed_plugin(op: str):
    return getattr(ops, op)


def fresh_tuner(op: str):
    """A new tuner of ``op`` (nothing in memory), registered again as this distribution registers it."""
    flyreg.unregister(op)
    flyreg.register(installed_plugin(op), name=op, distribution="flyreg-rmsnorm",
                    version=importlib.metadata.version("flyreg-rmsnorm"))
    return flyreg.op(op)


def inputs(op: str, M: int, N: int, dtype: torch.dtype) -> tuple:
    x = torch.randn(M, N, device="cuda", dtype=dtype)
    w = torch.rand(N, device="cuda", dtype=dtype) + 0.5
    if op == "fused_add_rmsnorm":
        return (x, torch.randn(M, N, device="cuda", dtype=dtype), w)
    return (x, w)


@pytest.mark.parametrize("op", ["rmsnorm", "fused_add_rmsnorm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_default_path_matches_reference(op: str, dtype: torch.dtype) -> None:
    tuner = fresh_tuner(op)
    plugin = installed_plugin(op)
    for M, N in [(1, 4096), (300, 2880), (4096, 8192), (33, 16384)]:
        args = inputs(op, M, N, dtype)
        ref = plugin.reference(tuple(a.clone() for a in args), {})  # the fused reference updates its residual
        assert tuner.resolve(*args).origin in ("offline", "default")  # never a search
        out = tuner(*args)
        tol = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}[dtype]
        assert rel_err(out, ref) < tol
    assert tuner.stats.benchmarks == 0


def test_forced_search_then_reuse_and_artifact_round_trip(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    args = inputs("rmsnorm", 4096, 8192, torch.bfloat16)
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    tuner = fresh_tuner("rmsnorm")
    tuner(*args)
    assert tuner.stats.searches == 1 and tuner.stats.benchmarks > 1
    report = next(iter(tuner.reports.values()))
    assert report.artifact and os.path.isfile(report.artifact)
    monkeypatch.delenv("FLYREG_AUTOTUNE")
    n = tuner.stats.benchmarks
    for _ in range(5):
        tuner(*args)
    assert tuner.stats.benchmarks == n and tuner.resolve(*args).source == "memory"
    # A fresh tuner with an empty scratch cache serves the emitted artifact, no search.
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "empty-cache"))
    fresh = fresh_tuner("rmsnorm")
    res = fresh.resolve(*args)
    assert res.source == "offline" and res.path == report.artifact and res.config == report.winner
    out = fresh(*args)
    assert fresh.stats.benchmarks == 0
    assert rel_err(out, installed_plugin("rmsnorm").reference(args, {})) < 1e-2


def test_fused_add_tuned_with_restore_value_equals_one_clean_run(monkeypatch: pytest.MonkeyPatch) -> None:
    x, residual, w = inputs("fused_add_rmsnorm", 4096, 4096, torch.bfloat16)
    clean_res = residual.clone()
    expected_y = installed_plugin("fused_add_rmsnorm").reference((x, clean_res.clone(), w), {})
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    tuner = fresh_tuner("fused_add_rmsnorm")
    y = tuner(x, residual, w)
    assert tuner.stats.benchmarks > 1
    # Exactly one residual += x happened, despite dozens of benchmark reps.
    assert torch.equal(residual, (clean_res.float() + x.float()).to(torch.bfloat16))
    assert rel_err(y, expected_y) < 1e-2
