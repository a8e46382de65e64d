"""Triton kernels for RMSNorm and fused residual-add + RMSNorm.

Knobs (constexpr):

* ``BLOCK_N``: columns per tile, a power of two. ``BLOCK_N >= N`` keeps the whole row in
  registers (one pass over memory); smaller values loop over the row in chunks twice
  (sum of squares, then normalize), re-reading the row (x, and for fused-add also the
  not-yet-updated residual), mostly from L2.
* ``ROWS``: rows per program, a power of two; the tile is ``ROWS x BLOCK_N``.

All math is in float32 and rounded once at the end: ``y = (x * rstd) * float(weight)``,
stored in x's dtype. ``fused_add_rmsnorm_triton`` stores ``residual + x`` (summed in
float32, rounded to residual's dtype) into ``residual`` and normalizes that stored,
rounded value. On a GPU of compute capability 9.0 or later (Hopper) both launch as programmatic
dependents (``launch_pdl``, see :func:`flyreg.triton.pdl_supported`): a launch may start while the kernel before
it drains, and waits for that kernel's writes (``gdc_wait``) before its first load. Every address
is the base pointer plus one element index, int32 where every index of the launch fits
(:func:`needs_int64`), int64 otherwise; rows of stride N are indexed with the constexpr N (0.4 to
0.5 % faster than a runtime stride at 32768 x 12288 bf16 on the H200, where inductor's kernel
indexes the same way).

The chunked path's first pass loads with ``evict_last`` so that its second pass finds the row in
L2 (without the hint it missed L2 once many rows were in flight, and ran about 1.5x slower than a
whole row on the H200). Both paths load the weight, which every program reads, with ``evict_last``
(the one-pass path 1.4 to 2.9 % faster for the served configs at M = 4096, N = 4096 to 8192 bf16
on the H200, each call with a weight not yet in L2).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from flyreg.triton import compiled_launcher, dependent_start, hints, resolve_pdl

from .checks import check_eps, check_fused_add, check_rmsnorm


@triton.jit
def _rows(ROWS: tl.constexpr, OFF64: tl.constexpr):
    # This program's row indices: int32 where every element offset fits, else int64.
    pid = tl.program_id(0)
    if OFF64:
        pid = pid.to(tl.int64)
    return pid * ROWS + tl.arange(0, ROWS)


# M only bounds the row mask: not specializing it (on M == 1, or on M % 16) keeps one binary for
# every row count, so the row buckets of one N share their compiles; MASK_ROWS (M % ROWS != 0) and
# OFF64 (whether M rows need int64 indices) are the bits of M a binary depends on. N is a
# constexpr: the chunk loops then have a known trip count (unrolled, their loads in flight
# together) and a full tile's column mask folds away (on the H200, up to 8 % of bandwidth for
# chunked rows at N >= 8192).
@triton.jit(do_not_specialize=["M"])
def _rmsnorm_kernel(
    X, W, Y, M, stride_x, eps,
    N: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_PASS: tl.constexpr, MASK_ROWS: tl.constexpr,
    PDL: tl.constexpr, OFF64: tl.constexpr, X_DENSE: tl.constexpr,
):
    dependent_start(PDL)
    rows = _rows(ROWS, OFF64)
    row_mask = (rows < M)[:, None] if MASK_ROWS else tl.full([ROWS, 1], True, tl.int1)
    # Element offsets: each address is X + (row offset + column). Dense rows (stride N) multiply by
    # the constexpr N, whose known factors let the compiler fold the column in.
    x_row = rows[:, None] * (N if X_DENSE else stride_x)
    y_row = rows[:, None] * N
    cols = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        col_mask = cols < N
        mask = row_mask & col_mask[None, :]
        x = tl.load(X + (x_row + cols[None, :]), mask=mask, other=0.0).to(tl.float32)
        # In flight with x, not after the sum; evict_last keeps the weight, read by every program, in L2.
        w = tl.load(W + cols, mask=col_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + (y_row + cols[None, :]), y.to(Y.dtype.element_ty), mask=mask)
    else:
        # Pass 1 keeps the row in L2 (evict_last) for pass 2, which reads it for the last time.
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_mask & (c < N)[None, :]
            x = tl.load(X + (x_row + c[None, :]), mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)[:, None]
        for start in range(0, N, BLOCK_N):
            c = start + cols
            col_mask = c < N
            mask = row_mask & col_mask[None, :]
            x = tl.load(X + (x_row + c[None, :]), mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(W + c, mask=col_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            y = x * rstd * w[None, :]
            tl.store(Y + (y_row + c[None, :]), y.to(Y.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M"])
def _fused_add_rmsnorm_kernel(
    X, R, W, Y, M, stride_x, stride_r, eps,
    N: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_PASS: tl.constexpr, MASK_ROWS: tl.constexpr,
    PDL: tl.constexpr, OFF64: tl.constexpr, X_DENSE: tl.constexpr, R_DENSE: tl.constexpr,
):
    dependent_start(PDL)
    rows = _rows(ROWS, OFF64)
    row_mask = (rows < M)[:, None] if MASK_ROWS else tl.full([ROWS, 1], True, tl.int1)
    x_row = rows[:, None] * (N if X_DENSE else stride_x)
    r_row = rows[:, None] * (N if R_DENSE else stride_r)
    y_row = rows[:, None] * N
    cols = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        col_mask = cols < N
        mask = row_mask & col_mask[None, :]
        x = tl.load(X + (x_row + cols[None, :]), mask=mask, other=0.0).to(tl.float32)
        r = tl.load(R + (r_row + cols[None, :]), mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=col_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        h = (r + x).to(R.dtype.element_ty)
        tl.store(R + (r_row + cols[None, :]), h, mask=mask)
        v = h.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(v * v, axis=1) / N + eps)
        y = v * rstd[:, None] * w[None, :]
        tl.store(Y + (y_row + cols[None, :]), y.to(Y.dtype.element_ty), mask=mask)
    else:
        # Pass 1 only reads; pass 2 recomputes the (identically rounded) sum and stores it.
        # So no thread ever reads a residual element that another thread wrote.
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_mask & (c < N)[None, :]
            x = tl.load(X + (x_row + c[None, :]), mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            r = tl.load(R + (r_row + c[None, :]), mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            v = (r + x).to(R.dtype.element_ty).to(tl.float32)
            acc += v * v
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)[:, None]
        for start in range(0, N, BLOCK_N):
            c = start + cols
            col_mask = c < N
            mask = row_mask & col_mask[None, :]
            x = tl.load(X + (x_row + c[None, :]), mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            r = tl.load(R + (r_row + c[None, :]), mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            h = (r + x).to(R.dtype.element_ty)
            tl.store(R + (r_row + c[None, :]), h, mask=mask)
            w = tl.load(W + c, mask=col_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            y = h.to(tl.float32) * rstd * w[None, :]
            tl.store(Y + (y_row + c[None, :]), y.to(Y.dtype.element_ty), mask=mask)


def _check_knobs(BLOCK_N: int, ROWS: int) -> None:
    if BLOCK_N < 1 or BLOCK_N & (BLOCK_N - 1):
        raise ValueError(f"BLOCK_N must be a power of two, got {BLOCK_N!r}")
    if ROWS < 1 or ROWS & (ROWS - 1):
        raise ValueError(f"ROWS must be a power of two, got {ROWS!r}")


#: Largest element offset the kernels index in int32.
INT32_MAX = 2**31 - 1


def needs_int64(M: int, N: int, BLOCK_N: int, ROWS: int, *row_strides: int) -> bool:
    """Whether some element offset a launch computes (masked-off rows and columns of its last tiles
    included, so nothing wraps) exceeds :data:`INT32_MAX`, so the kernel must index in int64."""
    last_row = -(-M // ROWS) * ROWS - 1
    last_col = -(-N // BLOCK_N) * BLOCK_N - 1
    return last_row * max((N, *row_strides)) + last_col > INT32_MAX


def _constexprs(M: int, N: int, BLOCK_N: int, ROWS: int, pdl: bool, x_stride: int,
                r_stride: int | None = None) -> dict[str, int | bool]:
    """The constexprs of a launch of :func:`_rmsnorm_kernel` (x's row stride) or, with the
    residual's row stride too, of :func:`_fused_add_rmsnorm_kernel`."""
    strides = (x_stride,) if r_stride is None else (x_stride, r_stride)
    dense = {"X_DENSE": x_stride == N, **({} if r_stride is None else {"R_DENSE": r_stride == N})}
    # No row mask when the programs cover M exactly (one row per program, always): with N a constexpr,
    # a one-row whole-row tile then has no mask at all.
    mask_rows = M % ROWS != 0
    return {"N": N, "BLOCK_N": BLOCK_N, "ROWS": ROWS, "ONE_PASS": BLOCK_N >= N, "MASK_ROWS": mask_rows,
            "PDL": pdl, "OFF64": needs_int64(M, N, BLOCK_N, ROWS, *strides), **dense}


def _output_alloc(x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """How a bound launcher allocates y for calls shaped like ``x``: contiguous, x's shape and dtype."""
    if x.is_contiguous():
        return torch.empty_like  # the cheapest allocation (about 1 us less than torch.empty(shape, ...))
    shape, dtype, device = x.shape, x.dtype, x.device
    return lambda _: torch.empty(shape, dtype=dtype, device=device)


def bind_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, BLOCK_N: int, ROWS: int,
                 num_warps: int | None = None, num_stages: int | None = None,
                 pdl: bool | None = None) -> Callable[..., torch.Tensor]:
    """:func:`rmsnorm_triton` specialized to calls like this one (same dtypes, shapes, strides,
    devices and eps): the checks, the launch arithmetic and the compile run here, once, not on
    every call. The returned launcher takes ``(x, weight, eps)``; another ``eps`` than the bound
    one is checked on that call. ``pdl`` launches as a programmatic dependent (default: where
    :func:`flyreg.triton.pdl_supported`)."""
    M, N, x_stride, eps_f = check_rmsnorm(x, weight, eps)
    _check_knobs(BLOCK_N, ROWS)
    pdl = resolve_pdl(x.device, pdl)
    alloc = _output_alloc(x)
    if M == 0:  # no rows: nothing to launch
        return lambda x, weight, eps=eps_f: alloc(x)
    probe = torch.empty(1, dtype=x.dtype, device=x.device)  # stands in for y: fresh, so aligned like every y
    launch = compiled_launcher(_rmsnorm_kernel, ((M + ROWS - 1) // ROWS,), (x, weight, probe, M, x_stride, eps_f),
                               _constexprs(M, N, BLOCK_N, ROWS, pdl, x_stride),
                               hints(num_warps, num_stages, pdl), x.device)

    def run(x: torch.Tensor, weight: torch.Tensor, eps: float = eps_f) -> torch.Tensor:
        y = alloc(x)
        launch(x, weight, y, M, x_stride, eps_f if eps == eps_f else check_eps(eps))
        return y

    return run


def bind_fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                           BLOCK_N: int, ROWS: int, num_warps: int | None = None,
                           num_stages: int | None = None, pdl: bool | None = None) -> Callable[..., torch.Tensor]:
    """:func:`fused_add_rmsnorm_triton` specialized to calls like this one, checked and compiled once."""
    M, N, x_stride, r_stride, eps_f = check_fused_add(x, residual, weight, eps)
    _check_knobs(BLOCK_N, ROWS)
    pdl = resolve_pdl(x.device, pdl)
    alloc = _output_alloc(x)
    if M == 0:
        return lambda x, residual, weight, eps=eps_f: alloc(x)
    probe = torch.empty(1, dtype=x.dtype, device=x.device)
    launch = compiled_launcher(_fused_add_rmsnorm_kernel, ((M + ROWS - 1) // ROWS,),
                               (x, residual, weight, probe, M, x_stride, r_stride, eps_f),
                               _constexprs(M, N, BLOCK_N, ROWS, pdl, x_stride, r_stride),
                               hints(num_warps, num_stages, pdl), x.device)

    def run(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = eps_f) -> torch.Tensor:
        y = alloc(x)
        launch(x, residual, weight, y, M, x_stride, r_stride, eps_f if eps == eps_f else check_eps(eps))
        return y

    return run


def rmsnorm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    BLOCK_N: int,
    ROWS: int,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """``x / sqrt(mean(x**2, -1) + eps) * weight`` in float32, returned in x's dtype and shape."""
    return bind_rmsnorm(x, weight, eps, BLOCK_N=BLOCK_N, ROWS=ROWS, num_warps=num_warps,
                        num_stages=num_stages)(x, weight, eps)


def fused_add_rmsnorm_triton(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    BLOCK_N: int,
    ROWS: int,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """``residual += x`` in place, then return ``rmsnorm(residual, weight, eps)`` of the stored residual."""
    bound = bind_fused_add_rmsnorm(x, residual, weight, eps, BLOCK_N=BLOCK_N, ROWS=ROWS, num_warps=num_warps,
                                   num_stages=num_stages)
    return bound(x, residual, weight, eps)
