"""The ``fused_moe`` op plugin: Triton kernels on a CUDA tensor, the torch implementation on the CPU.

Found through the entry point in this distribution's pyproject.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from flyreg.plugin import Axis, Config, Launch, OpRecord, Work, hookimpl

from . import space
from .checks import check_moe

#: The tuned artifacts installed with this package.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
ARG_NAMES = ("x", "w1", "w2", "topk_weights", "topk_ids")
#: (E, K, N, topk) of the model shapes tuned on a GPU: Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V2-Lite, gpt-oss-20b.
MODEL_SHAPES = {
    "Mixtral-8x7B": (8, 4096, 14336, 2),
    "Qwen3-30B-A3B": (128, 2048, 768, 8),
    "DeepSeek-V2-Lite": (64, 2048, 1408, 6),
    "gpt-oss-20b": (32, 2880, 2880, 4),
}
#: Small shapes tuned on the CPU, so ``flyreg tune`` runs end to end there in seconds.
CPU_SHAPES = ((8, 128, 160, 2),)
CPU_M = (4, 32)
DTYPES = ("bfloat16", "float16")


def _backend_on(device: str) -> str:
    """The backend a call on ``device`` (``"cpu"`` or ``"cuda"``) runs."""
    return "triton" if device == "cuda" else "cpu"


AXES = (
    Axis("E", int, low=1),
    Axis("K", int, low=1),
    Axis("M", int, ordered=True, values=space.M_BUCKETS, buckets=space.M_BUCKETS, low=0),
    Axis("N", int, low=1),
    Axis("backend", str, values=("triton", "cpu"), device_default=_backend_on),
    Axis("dtype", str, values=DTYPES),
    Axis("topk", int, low=1),
)
SPEC_AXES = tuple(a.name for a in AXES)


def _args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The five arguments of a call, positional or by name; TypeError naming what is missing or extra."""
    extra = set(kwargs) - set(ARG_NAMES)
    if extra:
        raise TypeError(f"fused_moe got unexpected keyword arguments {sorted(extra)}; it takes {list(ARG_NAMES)}")
    named = dict(zip(ARG_NAMES, args))
    if len(args) > len(ARG_NAMES):
        raise TypeError(f"fused_moe takes {len(ARG_NAMES)} arguments {list(ARG_NAMES)}, got {len(args)}")
    for k, v in kwargs.items():
        if k in named:
            raise TypeError(f"fused_moe got argument {k!r} twice")
        named[k] = v
    missing = [n for n in ARG_NAMES if n not in named]
    if missing:
        raise TypeError(f"fused_moe is missing arguments {missing}")
    return tuple(named[n] for n in ARG_NAMES)


def _on_triton(spec: dict[str, Any]) -> bool:
    """Whether ``spec`` is for the Triton backend; a spec missing an axis is a clear ValueError."""
    missing = [a for a in SPEC_AXES if a not in spec]
    if missing:
        raise ValueError(f"fused_moe spec {spec} lacks axes {missing}; it needs {list(SPEC_AXES)}")
    if spec["backend"] not in ("triton", "cpu"):
        raise ValueError(f"fused_moe spec 'backend' must be 'triton' or 'cpu', got {spec['backend']!r}")
    return spec["backend"] == "triton"


@hookimpl
def specialize(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    x, w1, w2, tw, ids = _args(args, kwargs)
    M, K, N, E, topk, _ = check_moe(x, w1, w2, tw, ids)
    return {"E": E, "K": K, "M": space.m_bucket(M), "N": N, "backend": _backend_on(x.device.type),
            "dtype": str(x.dtype).removeprefix("torch."), "topk": topk}


@hookimpl
def build(config: Config, spec: dict[str, Any]) -> Launch | Callable[..., Any]:
    knobs = config.kwargs
    if _on_triton(spec):
        from . import triton_moe

        def launch(*args: Any, num_warps: int | None = None, num_stages: int | None = None, **kw: Any) -> Any:
            return triton_moe.fused_moe_triton(*_args(args, kw), num_warps=num_warps, num_stages=num_stages,
                                               **knobs)

        def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
            hint = {k: v for k, v in kwargs.items() if k in ("num_warps", "num_stages")}
            call = {k: v for k, v in kwargs.items() if k not in hint}
            run = triton_moe.bind_fused_moe(*_args(args, call), **hint, **knobs)
            return lambda *a, **kw: run(*_args(a, kw))

        return Launch(launch, bind)
    from . import cpu

    group = knobs["EXPERT_GROUP"]

    def launch_cpu(*args: Any, **kw: Any) -> torch.Tensor:
        return cpu.fused_moe_cpu(*_args(args, kw), EXPERT_GROUP=group)

    return launch_cpu


@hookimpl
def configs(spec: dict[str, Any]) -> list[Config]:
    return space.triton_configs(spec) if _on_triton(spec) else space.cpu_configs(spec)


@hookimpl
def default(spec: dict[str, Any]) -> Config:
    return space.triton_default(spec) if _on_triton(spec) else space.cpu_default(spec)


@hookimpl
def workloads(device: str) -> list[dict[str, Any]]:
    if device.startswith("cuda"):
        return [{"E": E, "K": K, "M": m, "N": N, "backend": "triton", "dtype": "bfloat16", "topk": topk}
                for E, K, N, topk in MODEL_SHAPES.values() for m in space.M_BUCKETS]
    return [{"E": E, "K": K, "M": m, "N": N, "backend": "cpu", "dtype": "bfloat16", "topk": topk}
            for E, K, N, topk in CPU_SHAPES for m in CPU_M]


def make_moe_inputs(M: int, E: int, N: int, K: int, topk: int, dtype: torch.dtype, device: Any,
                    seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random call arguments, drawn on ``device``: unit-variance activations, weights scaled so every
    stage stays near unit variance, each token routed to ``topk`` distinct experts with softmax weights."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device=device) * scale).to(dtype)

    logits = torch.randn((M, E), generator=g, device=device)
    top, ids = torch.topk(logits, topk, dim=1)
    return (randn(M, K), randn(E, 2 * N, K, scale=K ** -0.5), randn(E, K, N, scale=N ** -0.5),
            torch.softmax(top, dim=1), ids.to(torch.int32))


@hookimpl
def make_inputs(spec: dict[str, Any], device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    M, E, N, K, topk = space.shape(spec)
    return make_moe_inputs(M, E, N, K, topk, getattr(torch, str(spec["dtype"])), device), {}


@hookimpl
def reference(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    from .cpu import fused_moe_reference

    return fused_moe_reference(*_args(args, kwargs))


@hookimpl
def work(spec: dict[str, Any]) -> Work:
    # Both GEMMs: 2*N*K per pair for GEMM 1 (gate and up, 2N rows) and 2*N*K for GEMM 2, each pair M*topk.
    M, _E, N, K, topk = space.shape(spec)
    return Work(flops=6 * M * topk * N * K)


@hookimpl
def describe() -> OpRecord:
    return OpRecord(
        description="mixture of experts: sum over top-k of weight * w2[e] @ (silu(w1 gate @ x) * (w1 up @ x))",
        version="1", arg_names=ARG_NAMES, axes=AXES, config_dir=CONFIG_DIR, strategy="local",
        torch_schema="(Tensor x, Tensor w1, Tensor w2, Tensor topk_weights, Tensor topk_ids) -> Tensor",
        output_like="x")
