"""The RMSNorm ops ``rmsnorm`` and ``fused_add_rmsnorm`` (this distribution's entry points), declared: the Triton
kernels on a CUDA tensor, the torch implementation with its own knob on the CPU."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from flyreg.plugin import Axis, DeclaredOp, Work, declare

from . import cpu, space
from .checks import check_fused_add, check_rmsnorm

#: Widths and dtypes tuned by default on a GPU (at every row bucket), and the small grid of a CPU run.
GPU_N = (128, 512, 1024, 1536, 2048, 2880, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 12288, 16384)
GPU_DTYPES = ("bfloat16", "float16", "float32")
WORKLOADS = {"cuda": [{"M": m, "N": n, "dtype": d} for d in GPU_DTYPES for n in GPU_N for m in space.ROW_BUCKETS],
             "cpu": [{"M": m, "N": n, "dtype": d} for d in ("float32", "bfloat16") for n in (1024, 4096)
                     for m in (32, 256)]}
#: The spec axes besides the backend; M is a row count rounded up to its bucket.
AXES = (Axis("M", int, ordered=True, values=space.ROW_BUCKETS, buckets=space.row_bucket, low=0),
        Axis("N", int, low=1), Axis("dtype", str, values=GPU_DTYPES))
SPEC_AXES = ("M", "N", "backend", "dtype")


def _key(x: torch.Tensor, *rest: Any) -> dict[str, Any]:
    facts = check_fused_add(x, *rest) if len(rest) == 3 else check_rmsnorm(x, *rest)
    return {"M": space.row_bucket(facts.M), "N": facts.N, "dtype": x.dtype}


def _bind(fused: bool, *args: Any, BLOCK_N: int, ROWS: int, num_warps: int | None = None,
          num_stages: int | None = None) -> Callable[..., torch.Tensor]:
    from . import triton_kernels as tk  # Triton only where it runs
    bind = tk.bind_fused_add_rmsnorm if fused else tk.bind_rmsnorm
    return bind(*args, BLOCK_N=BLOCK_N, ROWS=ROWS, num_warps=num_warps, num_stages=num_stages)


def _reference(x: torch.Tensor, *rest: Any) -> torch.Tensor:
    *residual, weight, eps = rest
    src = x.double()
    if residual:  # the search passes a private copy: candidates' residual updates get checked
        src = residual[0].copy_((residual[0].double() + src).to(residual[0].dtype)).double()
    return src * torch.rsqrt(src.square().mean(dim=-1, keepdim=True) + eps) * weight.double()


def _make_inputs(fused: bool, spec: dict[str, Any], device: str) -> tuple[Any, ...]:
    dtype, shape = getattr(torch, str(spec["dtype"])), (int(spec.get("M", 1)), int(spec["N"]))
    x = torch.randn(shape, dtype=dtype, device=device)
    weight = torch.rand(shape[1], dtype=dtype, device=device) + 0.5
    return (x, torch.randn(shape, dtype=dtype, device=device), weight, 1e-6) if fused else (x, weight, 1e-6)


def _work(fused: bool, spec: dict[str, Any]) -> Work:
    """Bytes a call of the spec's row bucket moves: x read, y written (and the residual both), the weight read."""
    size = getattr(torch, str(spec["dtype"])).itemsize
    return Work(bytes=(4 if fused else 2) * int(spec["M"]) * int(spec["N"]) * size + int(spec["N"]) * size)


def _declared(fused: bool) -> DeclaredOp:
    args = "Tensor x, Tensor residual, Tensor weight" if fused else "Tensor x, Tensor weight"
    return declare(
        name="RMSNorm", schema=f"({args}, float eps=1e-06) -> Tensor", output_like="x", version="3",
        description="residual += x in place, then RMSNorm of it" if fused else "y = x / rms(x) * weight",
        key=_key, axes=AXES, bind=functools.partial(_bind, fused), reference=_reference,
        configs=space.triton_configs, default=space.triton_default, cpu_configs=space.cpu_configs,
        cpu=cpu.fused_add_rmsnorm_cpu if fused else cpu.rmsnorm_cpu, cpu_default=space.cpu_default,
        workloads=WORKLOADS, make_inputs=functools.partial(_make_inputs, fused), work=functools.partial(_work, fused),
        structural=["BLOCK_N", "ROWS", "ROW_BLOCK"], restore_value=["residual"] if fused else [],
        config_dir=Path(__file__).resolve().parent / "configs")


rmsnorm = _declared(fused=False)
fused_add_rmsnorm = _declared(fused=True)
