"""The two RMSNorm op plugins: ``rmsnorm`` and ``fused_add_rmsnorm``.

Found through the entry points in this distribution's pyproject. On a CUDA tensor the Triton
kernels run; on the CPU the torch implementation with its own knob.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from flyreg.plugin import Axis, Config, Launch, OpRecord, Work, hookimpl

from . import space
from .checks import check_fused_add, check_rmsnorm

#: The tuned artifacts installed with this package.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
#: Row counts (bucket values), widths and dtypes tuned by default on a GPU.
GPU_N = (128, 512, 1024, 1536, 2048, 2880, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 12288, 16384)
GPU_DTYPES = ("bfloat16", "float16", "float32")
#: A small grid, so ``flyreg tune`` runs end to end on a CPU in well under two minutes.
CPU_N = (1024, 4096)
CPU_M = (32, 256)
CPU_DTYPES = ("float32", "bfloat16")


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _backend_on(device: str) -> str:
    """The backend a call on ``device`` (``"cpu"`` or ``"cuda"``) runs."""
    return "triton" if device == "cuda" else "cpu"


#: The spec axes; M is a row count rounded up to its bucket.
AXES = (
    Axis("M", int, ordered=True, values=space.ROW_BUCKETS, buckets=space.row_bucket, low=0),
    Axis("N", int, low=1),
    Axis("backend", str, values=("triton", "cpu"), device_default=_backend_on),
    Axis("dtype", str, values=GPU_DTYPES),
)
SPEC_AXES = tuple(a.name for a in AXES)


def _on_triton(spec: dict[str, Any]) -> bool:
    """Whether ``spec`` is for the Triton backend; a spec missing an axis is a clear ValueError."""
    missing = [a for a in SPEC_AXES if a not in spec]
    if missing:
        raise ValueError(f"RMSNorm spec {spec} lacks axes {missing}; it needs {list(SPEC_AXES)}")
    if spec["backend"] not in ("triton", "cpu"):
        raise ValueError(f"RMSNorm spec 'backend' must be 'triton' or 'cpu', got {spec['backend']!r}")
    return spec["backend"] == "triton"


class RMSNormOp:
    """Hooks of one RMSNorm op; ``fused`` selects ``fused_add_rmsnorm``."""

    def __init__(self, fused: bool) -> None:
        self.fused = fused
        self.name = "fused_add_rmsnorm" if fused else "rmsnorm"
        self.arg_names = ("x", "residual", "weight", "eps") if fused else ("x", "weight", "eps")
        self._signature = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in self.arg_names[:-1]]
            + [inspect.Parameter("eps", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=1e-6)]
        )

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.name}{self._signature}: {e}") from None
        bound.apply_defaults()
        return bound.arguments

    @hookimpl
    def specialize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        a = self._bind(args, kwargs)
        if self.fused:
            facts = check_fused_add(a["x"], a["residual"], a["weight"], a["eps"])
        else:
            facts = check_rmsnorm(a["x"], a["weight"], a["eps"])
        x = a["x"]
        return {"N": facts.N, "dtype": _dtype_name(x), "M": space.row_bucket(facts.M),
                "backend": _backend_on(x.device.type)}

    @hookimpl
    def build(self, config: Config, spec: dict[str, Any]) -> Launch | Callable[..., Any]:
        knobs = config.kwargs
        if _on_triton(spec):
            from . import triton_kernels as tk

            tile = {"BLOCK_N": knobs["BLOCK_N"], "ROWS": knobs["ROWS"]}
            run, bind = (tk.fused_add_rmsnorm_triton, tk.bind_fused_add_rmsnorm) if self.fused else \
                (tk.rmsnorm_triton, tk.bind_rmsnorm)
            return Launch(functools.partial(run, **tile),
                          lambda args, kwargs: bind(*args, **kwargs, **tile))
        from . import cpu

        return functools.partial(cpu.fused_add_rmsnorm_cpu if self.fused else cpu.rmsnorm_cpu,
                                 ROW_BLOCK=knobs["ROW_BLOCK"])

    @hookimpl
    def configs(self, spec: dict[str, Any]) -> list[Config]:
        return space.triton_configs(spec) if _on_triton(spec) else space.cpu_configs(spec)

    @hookimpl
    def default(self, spec: dict[str, Any]) -> Config:
        return space.triton_default(spec) if _on_triton(spec) else space.cpu_default(spec)

    @hookimpl
    def workloads(self, device: str) -> list[dict[str, Any]]:
        if device.startswith("cuda"):
            grid = [(m, n, d) for d in GPU_DTYPES for n in GPU_N for m in space.ROW_BUCKETS]
            backend = "triton"
        else:
            grid = [(m, n, d) for d in CPU_DTYPES for n in CPU_N for m in CPU_M]
            backend = "cpu"
        return [{"M": m, "N": n, "backend": backend, "dtype": d} for m, n, d in grid]

    @hookimpl
    def make_inputs(self, spec: dict[str, Any], device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        dtype = getattr(torch, str(spec["dtype"]))
        shape = (int(spec.get("M", 1)), int(spec["N"]))
        x = torch.randn(shape, dtype=dtype, device=device)
        weight = torch.rand(shape[1], dtype=dtype, device=device) + 0.5
        if self.fused:
            return (x, torch.randn(shape, dtype=dtype, device=device), weight), {"eps": 1e-6}
        return (x, weight), {"eps": 1e-6}

    @hookimpl
    def reference(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        a = self._bind(args, kwargs)
        x = a["x"]
        if self.fused:
            r = a["residual"]
            summed = (r.double() + x.double()).to(r.dtype)
            r.copy_(summed)  # the search passes a private copy: candidates' residual updates get checked
            src = summed.double()
        else:
            src = x.double()
        norm = torch.rsqrt(src.square().mean(dim=-1, keepdim=True) + a["eps"])
        return src * norm * a["weight"].double()

    @hookimpl
    def work(self, spec: dict[str, Any]) -> Work:
        """Bytes of one call of ``spec``'s row bucket: x read and y written (the fused op also reads and
        writes the residual), the weight read once."""
        size = getattr(torch, str(spec["dtype"])).itemsize
        rows = int(spec["M"]) * int(spec["N"]) * size
        return Work(bytes=(4 if self.fused else 2) * rows + int(spec["N"]) * size)

    @hookimpl
    def describe(self) -> OpRecord:
        what = "residual += x in place, then RMSNorm of it" if self.fused else "y = x / rms(x) * weight"
        args = ", ".join(f"Tensor {n}" for n in self.arg_names[:-1])
        return OpRecord(description=what, version="3", structural=["BLOCK_N", "ROWS", "ROW_BLOCK"],
                        arg_names=self.arg_names, restore_value=["residual"] if self.fused else [], axes=AXES,
                        config_dir=CONFIG_DIR, torch_schema=f"({args}, float eps=1e-06) -> Tensor", output_like="x")


rmsnorm = RMSNormOp(fused=False)
fused_add_rmsnorm = RMSNormOp(fused=True)
