"""CPU (plain torch) RMSNorm and fused residual-add + RMSNorm.

Knob ``ROW_BLOCK``: rows normalized per step. Each step copies a block into a float32 work buffer and makes a few
passes over it, so small blocks stay in cache but pay Python and dispatch overhead per step, while large blocks
amortize that overhead but stream through memory once per pass. Semantics match the Triton backend exactly.
"""

from __future__ import annotations

import torch

from .checks import check_fused_add, check_rmsnorm


def _rescale_overflowed(work: torch.Tensor, rstd: torch.Tensor, N: int, eps: float) -> None:
    """Set ``rstd`` of the rows whose float32 sum of squares overflowed, from the rows scaled by their max."""
    rows = (rstd == 0).squeeze(1) & torch.isfinite(work).all(dim=1)
    big = work[rows]
    amax = big.abs().amax(dim=1, keepdim=True)
    rstd[rows] = torch.rsqrt((big / amax).square().sum(dim=1, keepdim=True) / N + eps / (amax * amax)) / amax


def _normalize_rows(src: torch.Tensor, weight: torch.Tensor, eps: float, y: torch.Tensor, ROW_BLOCK: int,
                    residual: torch.Tensor | None = None) -> None:
    """Write rmsnorm of ``src`` (or of ``residual += src``) into ``y``, all (M, N) views."""
    M, N = src.shape
    w = weight.to(torch.float32)
    rows = min(ROW_BLOCK, M)
    # Work in y itself when it is float32; otherwise in a float32 buffer.
    buf = None if y.dtype == torch.float32 else torch.empty((rows, N), dtype=torch.float32, device=y.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=y.device)
    for start in range(0, M, rows):
        stop = min(start + rows, M)
        n = stop - start
        block = src[start:stop]
        if residual is not None:  # rounded to residual's dtype; the stored value is normalized
            block = residual[start:stop].add_(block)
        out = y[start:stop]
        work = out if buf is None else buf[:n]
        work.copy_(block)
        s = scale[:n]
        torch.linalg.vector_norm(work, 2, dim=1, keepdim=True, out=s)
        s.square_().div_(N).add_(eps).rsqrt_()
        if not bool(s.min() > 0):  # a row's sum of squares overflowed float32 (rare): redo those rows scaled
            _rescale_overflowed(work, s, N, eps)
        work.mul_(s).mul_(w)
        if buf is not None:
            out.copy_(work)


@torch.no_grad()
def rmsnorm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, ROW_BLOCK: int) -> torch.Tensor:
    """``x / sqrt(mean(x**2, -1) + eps) * weight`` in float32, returned in x's dtype and shape."""
    M, N, x_stride, eps = check_rmsnorm(x, weight, eps)
    return _normalized(x, None, weight, eps, (M, N, x_stride, 0), ROW_BLOCK)


@torch.no_grad()
def fused_add_rmsnorm_cpu(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, ROW_BLOCK: int
) -> torch.Tensor:
    """``residual += x`` in place, then return ``rmsnorm(residual, weight, eps)`` of the stored residual."""
    M, N, x_stride, r_stride, eps = check_fused_add(x, residual, weight, eps)
    return _normalized(x, residual, weight, eps, (M, N, x_stride, r_stride), ROW_BLOCK)


def _normalized(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                layout: tuple[int, int, int, int], ROW_BLOCK: int) -> torch.Tensor:
    """y of a checked call whose rows are ``(M, N, x's row stride, residual's row stride)``."""
    if isinstance(ROW_BLOCK, bool) or not isinstance(ROW_BLOCK, int) or ROW_BLOCK < 1:
        raise ValueError(f"ROW_BLOCK must be a positive int, got {ROW_BLOCK!r}")
    M, N, x_stride, r_stride = layout
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if M:
        _normalize_rows(x.as_strided((M, N), (x_stride, 1)), weight, eps, y.view(M, N), ROW_BLOCK,
                        None if residual is None else residual.as_strided((M, N), (r_stride, 1)))
    return y
