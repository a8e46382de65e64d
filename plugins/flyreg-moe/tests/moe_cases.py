"""What the fused-MoE tests share: an independent float32 reference, random calls with chosen routings, the
model shapes, and the marks for tests that need Triton or a GPU."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F

try:
    from flyreg_moe import triton_moe
except ImportError:  # triton not installed
    triton_moe = None

HAS_CUDA = torch.cuda.is_available()
TRITON_OK = triton_moe is not None and (HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1")
needs_triton = pytest.mark.skipif(not TRITON_OK, reason="triton not importable, or no GPU and no interpreter")
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
gpu = pytest.mark.gpu
DEVICE = "cuda" if HAS_CUDA else "cpu"
#: (E, K, N, topk) of the model shapes the gpu tests run.
MODEL = {"Mixtral-8x7B": (8, 4096, 14336, 2), "Qwen3-30B-A3B": (128, 2048, 768, 8),
         "DeepSeek-V2-Lite": (64, 2048, 1408, 6), "gpt-oss-20b": (32, 2880, 2880, 4)}

#: Relative Frobenius error allowed against the float32 reference, by dtype (bf16 keeps 8 bits).
TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


def triton_call(*args: torch.Tensor, **knobs: Any) -> torch.Tensor:
    """One call on the Triton path: the launcher bound with these knobs and hints, called once."""
    return triton_moe.bind_fused_moe(*args, **knobs)(*args)


def reference(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, tw: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """out[m] = sum_j tw[m, j] * w2[e] @ (silu(w1[e, :N] @ x[m]) * (w1[e, N:] @ x[m])), token by token in float32."""
    N = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for m in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[m, j])
            h = w1[e].float() @ x[m].float()
            out[m] += tw[m, j] * (w2[e].float() @ (F.silu(h[:N]) * h[N:]))
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def call(M: int, E: int, N: int, K: int, topk: int, dtype: torch.dtype = torch.bfloat16, device: str = "cpu",
         routing: str = "random", seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Fresh random arguments. ``routing``: ``random`` (distinct experts a token), ``one`` (every pair to
    expert E - 1), ``skewed`` (experts 0 and 1 only, so the others get no token)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w1 = (torch.randn(E, 2 * N, K, generator=g) * K ** -0.5).to(dtype)
    w2 = (torch.randn(E, K, N, generator=g) * N ** -0.5).to(dtype)
    tw = torch.rand(M, topk, generator=g) + 0.1
    if routing == "random":
        ids = torch.argsort(torch.rand(M, E, generator=g), dim=1)[:, :topk]
    elif routing == "one":
        ids = torch.full((M, topk), E - 1)
    else:
        ids = torch.randint(0, 2, (M, topk), generator=g)
    return tuple(t.to(device) for t in (x, w1, w2, tw, ids.to(torch.int32)))
