"""The ``fused_moe`` op, declared (the object this distribution's entry point names): Triton kernels on a CUDA
tensor, the torch implementation on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flyreg.plugin import Axis, Work, declare

from . import cpu, space
from .checks import check_moe

#: (E, K, N, topk) of the model shapes tuned on a GPU.
MODEL_SHAPES = {"Mixtral-8x7B": (8, 4096, 14336, 2), "Qwen3-30B-A3B": (128, 2048, 768, 8),
                "DeepSeek-V2-Lite": (64, 2048, 1408, 6), "gpt-oss-20b": (32, 2880, 2880, 4)}
#: The specs ``flyreg tune`` tunes: the model shapes at every M bucket on a GPU, a small shape on the CPU (seconds).
WORKLOADS = {device: [{"E": E, "K": K, "M": m, "N": N, "dtype": "bfloat16", "topk": topk}
                      for E, K, N, topk in shapes for m in rows]
             for device, shapes, rows in (("cuda", MODEL_SHAPES.values(), space.M_BUCKETS),
                                          ("cpu", [(8, 128, 160, 2)], (4, 32)))}
#: The spec axes besides the backend.
AXES = (Axis("E", int, low=1), Axis("K", int, low=1),
        Axis("M", int, ordered=True, values=space.M_BUCKETS, buckets=space.M_BUCKETS, low=0),
        Axis("N", int, low=1), Axis("dtype", str, values=("bfloat16", "float16")), Axis("topk", int, low=1))


def _key(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, tw: torch.Tensor, ids: torch.Tensor) -> dict[str, Any]:
    M, K, N, E, topk, _ = check_moe(x, w1, w2, tw, ids)
    return {"E": E, "K": K, "M": space.m_bucket(M), "N": N, "dtype": x.dtype, "topk": topk}


def _bind(*args: Any, **options: Any) -> Any:
    from . import triton_moe  # Triton only where it runs

    return triton_moe.bind_fused_moe(*args, **options)


def make_moe_inputs(M: int, E: int, N: int, K: int, topk: int, dtype: torch.dtype, device: Any,
                    seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random call arguments on ``device``: every stage near unit variance, each token routed to ``topk`` experts
    (distinct, so ``topk`` is at most ``E``: a ValueError otherwise)."""
    if topk > E:
        raise ValueError(f"topk must be at most E (a token's experts are distinct), got topk={topk}, E={E}")
    kw = {"generator": torch.Generator(device=device).manual_seed(seed), "device": device}
    w1, w2 = (torch.empty(s, dtype=dtype, device=device) for s in ((E, 2 * N, K), (E, K, N)))
    for e in range(E):  # an expert at a time: the float32 draw held at once is one expert's, not all of them
        w1[e], w2[e] = (torch.randn(w.shape[1:], **kw) * w.shape[2] ** -0.5 for w in (w1, w2))
    x, (top, ids) = torch.randn((M, K), **kw), torch.randn((M, E), **kw).topk(topk)
    return x.to(dtype), w1, w2, torch.softmax(top, dim=1), ids.to(torch.int32)


def _make_inputs(spec: dict[str, Any], device: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    return make_moe_inputs(*space.shape(spec), getattr(torch, str(spec["dtype"])), device, seed)  # a routing a seed


def _work(spec: dict[str, Any]) -> Work:
    M, _, N, K, topk = space.shape(spec)
    return Work(flops=6 * M * topk * N * K)  # a pair: 2 * 2N * K flops in GEMM 1 (gate and up), 2 * N * K in GEMM 2


fused_moe = declare(
    name="fused_moe", schema="(Tensor x, Tensor w1, Tensor w2, Tensor topk_weights, Tensor topk_ids) -> Tensor",
    output_like="x", version="1", strategy="local", config_dir=Path(__file__).resolve().parent / "configs",
    description="mixture of experts: sum over top-k of weight * w2[e] @ (silu(w1 gate @ x) * (w1 up @ x))",
    key=_key, axes=AXES, bind=_bind, configs=space.triton_configs, default=space.triton_default,
    cpu=cpu.fused_moe_cpu, cpu_configs=space.cpu_configs, cpu_default=space.cpu_default,
    reference=cpu.fused_moe_reference, workloads=WORKLOADS, make_inputs=_make_inputs, work=_work)
