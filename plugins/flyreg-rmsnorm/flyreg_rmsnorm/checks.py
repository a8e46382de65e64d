"""Input validation shared by the Triton and CPU RMSNorm backends.

Layout rule: the last dim must have stride 1 (any stride when N == 1) and the leading dims must collapse into one
row dimension with a single row stride, so ``big[:, :N]`` and ``big[:, :, :N]`` slices are accepted without a copy;
anything else (e.g. transposed leading dims) is a ValueError, never copied. ``weight`` must be contiguous.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

#: Dtypes accepted for x, residual and weight (all compute is in float32).
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


#: Validated shape facts of an ``rmsnorm`` call, and of a ``fused_add_rmsnorm`` call.
NormArgs = NamedTuple("NormArgs", [("M", int), ("N", int), ("x_stride", int), ("eps", float)])
FusedArgs = NamedTuple("FusedArgs", [("M", int), ("N", int), ("x_stride", int), ("r_stride", int), ("eps", float)])


def _check_tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must have a floating dtype float16, bfloat16 or float32, got {t.dtype}")
    return t


def check_eps(eps: object) -> float:
    """Return ``eps`` as a float; it must be a finite, non-negative real number."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    eps = float(eps)
    if not math.isfinite(eps) or eps < 0.0:
        raise ValueError(f"eps must be a finite non-negative float, got {eps!r}")
    return eps


def row_layout(t: torch.Tensor, name: str, *, writable: bool = False) -> tuple[int, int]:
    """Return ``(M, row_stride)`` of ``t`` seen as an ``(M, N)`` matrix with unit column stride.

    Raises ValueError naming ``name`` if the leading dims do not collapse into one row
    dimension, or (``writable``) if distinct rows would overlap in memory.
    """
    shape, strides, n = t.shape, t.stride(), t.shape[-1]
    if n != 1 and strides[-1] != 1:
        raise ValueError(f"{name} must have stride 1 in its last dim, got strides {tuple(strides)} "
                         f"for shape {tuple(shape)}")
    m, collapsible = 1, True
    row_stride = -1  # stride of the innermost leading dim of size > 1
    span = 0  # stride the next outer leading dim of size > 1 must have
    for size, stride in zip(reversed(shape[:-1]), reversed(strides[:-1])):
        m *= size
        if size == 1:
            continue
        if row_stride < 0:
            row_stride = stride
        elif stride != span:
            collapsible = False
        span = stride * size
    if m <= 1:
        return m, n
    if not collapsible:
        raise ValueError(f"{name} has leading dims that cannot be viewed as one row dimension "
                         f"(shape {tuple(shape)}, strides {tuple(strides)}); pass {name}.contiguous()")
    if writable and row_stride < n:
        raise ValueError(f"{name} is written in place, so its rows must not overlap; got row stride {row_stride} < N={n}")
    return m, row_stride


def _check_x(x: object, weight: object) -> tuple[torch.Tensor, torch.Tensor, int]:
    x = _check_tensor(x, "x")
    weight = _check_tensor(weight, "weight")
    if x.dim() == 0:
        raise ValueError("x must have at least 1 dim (rows x N), got a 0-dim tensor")
    n = x.shape[-1]
    if n == 0:
        raise ValueError(f"x must have a non-empty last dim N, got shape {tuple(x.shape)}")
    if weight.device != x.device:
        raise ValueError(f"weight must be on x's device {x.device}, got {weight.device}")
    if weight.dim() != 1 or weight.shape[0] != n:
        raise ValueError(f"weight must be 1-D of length N={n} (x's last dim), got shape {tuple(weight.shape)}")
    if n != 1 and weight.stride(0) != 1:
        raise ValueError(f"weight must be contiguous, got stride {weight.stride(0)}")
    return x, weight, n


def check_rmsnorm(x: object, weight: object, eps: object) -> NormArgs:
    """Validate an ``rmsnorm(x, weight, eps)`` call and return its shape facts."""
    x, weight, n = _check_x(x, weight)
    eps = check_eps(eps)
    m, x_stride = row_layout(x, "x")
    return NormArgs(m, n, x_stride, eps)


def check_fused_add(x: object, residual: object, weight: object, eps: object) -> FusedArgs:
    """Validate a ``fused_add_rmsnorm(x, residual, weight, eps)`` call and return its shape facts."""
    x, weight, n = _check_x(x, weight)
    residual = _check_tensor(residual, "residual")
    if residual.device != x.device:
        raise ValueError(f"residual must be on x's device {x.device}, got {residual.device}")
    if residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    if residual.dtype != x.dtype:
        raise TypeError(f"residual must have x's dtype {x.dtype}, got {residual.dtype}")
    eps = check_eps(eps)
    m, x_stride = row_layout(x, "x")
    _, r_stride = row_layout(residual, "residual", writable=True)
    return FusedArgs(m, n, x_stride, r_stride, eps)
