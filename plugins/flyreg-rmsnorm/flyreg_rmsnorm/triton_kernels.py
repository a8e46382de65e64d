"""Triton kernels for RMSNorm and fused residual-add + RMSNorm.

Knobs (constexpr):

* ``BLOCK_N``: columns per tile, a power of two. ``BLOCK_N >= N`` keeps the whole row in
  registers (one pass over memory); smaller values loop over the row in chunks twice
  (sum of squares, then normalize), re-reading the row (x, and for fused-add also the
  not-yet-updated residual), mostly from L2.
* ``ROWS``: rows per program, a power of two; the tile is ``ROWS x BLOCK_N``.

All math is in float32 and rounded once at the end: ``y = (x * rstd) * float(weight)``,
stored in x's dtype. A row whose float32 sum of squares overflows (|x| above about 1.8e19 / sqrt(N);
bfloat16 and float32 rows only) gets the float64 reference's answer instead of zeros, from its squares
scaled by 2**-80, in one of two ways (``RESCUE``, chosen per tile by :func:`rescue_mode`):

* ``RESCUE_AFTER``: after the tile's stores, if some row of the tile overflowed, those rows are read
  again and normalized from their scaled sum (:func:`_rescue`). Only the test is on the common path;
  the rescue's loops stay rolled, and the kernel is compiled with at most the registers that keep the
  rescue-free kernel's blocks a SM (:func:`_capped`).
* ``RESCUE_IN_SUM``: for tiles whose rows are spread over warps, where that test would cost the whole
  block a cross-warp reduction and two barriers, the scaled squares are summed in the same reduction
  as the plain ones, and a row whose plain sum overflowed takes its rstd from the scaled sum.

Both give the float64 reference's answer to float32 rounding; they differ in cost, and in the last bits of a
row whose plain sum lies within a factor 2 below float32's largest value, in a tile where another row
overflowed. ``fused_add_rmsnorm_triton`` stores ``residual + x`` (summed in float32, rounded to residual's
dtype) into ``residual`` and normalizes that stored, rounded value.

On Hopper and later both launch as programmatic dependents (``launch_pdl``, :func:`flyreg.triton.pdl_supported`).
Every address is the base pointer plus one element index, int32 where every index fits (:func:`needs_int64`);
rows of stride N are indexed with the constexpr N. The chunked path's first pass (for its second) and both
paths' weight load with ``evict_last``. Each of these, measured: ``docs/decisions.md``, "The RMSNorm kernels".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from flyreg.triton import compiled_launcher, compiled_registers, dependent_start, hints, interpreted, resolve_pdl

from .checks import check_eps, check_fused_add, check_rmsnorm


@triton.jit
def _first_row(ROWS: tl.constexpr, OFF64: tl.constexpr):
    # This program's first row: int32 where every element offset fits, else int64.
    pid = tl.program_id(0)
    if OFF64:
        pid = pid.to(tl.int64)
    return pid * ROWS


@triton.jit
def _rows(ROWS: tl.constexpr, OFF64: tl.constexpr):
    return _first_row(ROWS, OFF64) + tl.arange(0, ROWS)


#: Largest finite float32; a sum of squares above it overflowed.
_F32_MAX: tl.constexpr = tl.constexpr(3.4028234663852886e38)
#: 2**-80: squares of rows scaled by it cannot overflow, and for a row whose plain sum did, the squares
#: that underflow are below float32's precision of the sum.
_SCALE: tl.constexpr = tl.constexpr(2.0**-80)
#: The rescue rewrites rows whose scaled sum reaches 2**127 (2**-33 scaled): every row whose plain sum
#: overflowed, whatever the order the two sums were added in.
_RESCUED_FROM: tl.constexpr = tl.constexpr(2.0**-33)
#: ``.pragma "nounroll"`` opens each loop of the rescue: ptxas would otherwise unroll it up to the
#: register limit, which costs every launch occupancy. Only a kernel compiled to PTX runs that assembly.
_NO_UNROLL: tl.constexpr = tl.constexpr(not interpreted() and torch.version.hip is None)


#: How a kernel rescues rows whose sum of squares overflowed (module docstring; ``.value`` is the int).
NO_RESCUE: tl.constexpr = tl.constexpr(0)
RESCUE_AFTER: tl.constexpr = tl.constexpr(1)
RESCUE_IN_SUM: tl.constexpr = tl.constexpr(2)


@triton.jit
def _add_pairs(a, b, c, d):
    return a + c, b + d


@triton.jit
def _squares(v, IN_SUM: tl.constexpr):
    # v**2, and with IN_SUM (v * _SCALE)**2 too (else v, unused).
    if IN_SUM:
        vs = v * _SCALE
        return v * v, vs * vs
    else:
        return v * v, v


@triton.jit
def _accumulate(acc, acc_scaled, v, IN_SUM: tl.constexpr):
    # The chunked pass's running squares of v, and with IN_SUM its scaled squares.
    sq, sq_scaled = _squares(v, IN_SUM)
    if IN_SUM:
        return acc + sq, acc_scaled + sq_scaled
    else:
        return acc + sq, acc_scaled


@triton.jit
def _row_rstd(sq, sq_scaled, N: tl.constexpr, eps, IN_SUM: tl.constexpr):
    # (sum of squares, rstd) of each row; with IN_SUM a row whose plain sum overflowed takes the scaled sum's rstd.
    if IN_SUM:
        ss, ss_scaled = tl.reduce((sq, sq_scaled), 1, _add_pairs)
        rescued = tl.rsqrt(ss_scaled / N + eps * _SCALE * _SCALE) * _SCALE
        return ss, tl.where(ss > _F32_MAX, rescued, tl.rsqrt(ss / N + eps))
    else:
        ss = tl.sum(sq, axis=1)
        return ss, tl.rsqrt(ss / N + eps)


@triton.jit
def _overflowed(ss):
    # Whether the sum of squares of some row of the tile overflowed (a NaN row did not: it stays NaN).
    return tl.max((ss > _F32_MAX).to(tl.int32), axis=0) > 0


@triton.jit
def _rescue(V, W, Y, M, stride_v, eps, first_row, N: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
            V_DENSE: tl.constexpr):
    # Rewrites y of the tile's rows whose scaled sum of squares reaches _RESCUED_FROM, from V (the stored row
    # that was normalized) read again and scaled by _SCALE, in chunks of at most BLOCK_N (so no offset passes
    # the tile's, which needs_int64 bounds) and 128 elements.
    CHUNK: tl.constexpr = BLOCK_N if BLOCK_N < 128 else 128
    tl.debug_barrier()  # the tile's stores (y, and the fused op's residual) are visible to every thread
    cols = tl.arange(0, CHUNK)
    for row in tl.range(first_row, tl.minimum(first_row + ROWS, M)):
        if _NO_UNROLL:  # inline here, first in the loop: a call would open it with a debug label
            tl.inline_asm_elementwise('.pragma "nounroll";', "=r,r", [row], dtype=tl.int32, is_pure=False, pack=1)
        v_row = row * (N if V_DENSE else stride_v)
        acc = tl.zeros([CHUNK], dtype=tl.float32)
        for start in tl.range(0, N, CHUNK):
            if _NO_UNROLL:
                tl.inline_asm_elementwise('.pragma "nounroll";', "=r,r", [row], dtype=tl.int32, is_pure=False,
                                          pack=1)
            c = start + cols
            v = tl.load(V + (v_row + c), mask=c < N, other=0.0).to(tl.float32) * _SCALE
            acc += v * v
        ss = tl.sum(acc, axis=0)
        if ss >= _RESCUED_FROM:
            rstd = tl.rsqrt(ss / N + eps * _SCALE * _SCALE) * _SCALE
            for start in tl.range(0, N, CHUNK):
                if _NO_UNROLL:
                    tl.inline_asm_elementwise('.pragma "nounroll";', "=r,r", [row], dtype=tl.int32, is_pure=False,
                                              pack=1)
                c = start + cols
                v = tl.load(V + (v_row + c), mask=c < N, other=0.0).to(tl.float32)
                w = tl.load(W + c, mask=c < N, other=0.0).to(tl.float32)
                tl.store(Y + (row * N + c), (v * rstd * w).to(Y.dtype.element_ty), mask=c < N)


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
    PDL: tl.constexpr, OFF64: tl.constexpr, X_DENSE: tl.constexpr, RESCUE: tl.constexpr,
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
        sq, sq_scaled = _squares(x, RESCUE == RESCUE_IN_SUM)
        ss, rstd = _row_rstd(sq, sq_scaled, N, eps, RESCUE == RESCUE_IN_SUM)
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + (y_row + cols[None, :]), y.to(Y.dtype.element_ty), mask=mask)
        if RESCUE == RESCUE_AFTER:
            if _overflowed(ss):
                _rescue(X, W, Y, M, stride_x, eps, _first_row(ROWS, OFF64), N, BLOCK_N, ROWS, X_DENSE)
    else:
        # Pass 1 keeps the row in L2 (evict_last) for pass 2, which reads it for the last time.
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        acc_scaled = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_mask & (c < N)[None, :]
            x = tl.load(X + (x_row + c[None, :]), mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            acc, acc_scaled = _accumulate(acc, acc_scaled, x, RESCUE == RESCUE_IN_SUM)
        ss, rstd = _row_rstd(acc, acc_scaled, N, eps, RESCUE == RESCUE_IN_SUM)
        rstd = rstd[:, None]
        for start in range(0, N, BLOCK_N):
            c = start + cols
            col_mask = c < N
            mask = row_mask & col_mask[None, :]
            x = tl.load(X + (x_row + c[None, :]), mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(W + c, mask=col_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            y = x * rstd * w[None, :]
            tl.store(Y + (y_row + c[None, :]), y.to(Y.dtype.element_ty), mask=mask)
        if RESCUE == RESCUE_AFTER:
            if _overflowed(ss):
                _rescue(X, W, Y, M, stride_x, eps, _first_row(ROWS, OFF64), N, BLOCK_N, ROWS, X_DENSE)


@triton.jit(do_not_specialize=["M"])
def _fused_add_rmsnorm_kernel(
    X, R, W, Y, M, stride_x, stride_r, eps,
    N: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_PASS: tl.constexpr, MASK_ROWS: tl.constexpr,
    PDL: tl.constexpr, OFF64: tl.constexpr, X_DENSE: tl.constexpr, R_DENSE: tl.constexpr, RESCUE: tl.constexpr,
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
        sq, sq_scaled = _squares(v, RESCUE == RESCUE_IN_SUM)
        ss, rstd = _row_rstd(sq, sq_scaled, N, eps, RESCUE == RESCUE_IN_SUM)
        y = v * rstd[:, None] * w[None, :]
        tl.store(Y + (y_row + cols[None, :]), y.to(Y.dtype.element_ty), mask=mask)
        if RESCUE == RESCUE_AFTER:
            if _overflowed(ss):
                _rescue(R, W, Y, M, stride_r, eps, _first_row(ROWS, OFF64), N, BLOCK_N, ROWS, R_DENSE)
    else:
        # Pass 1 only reads; pass 2 recomputes the (identically rounded) sum and stores it.
        # So no thread ever reads a residual element that another thread wrote (but _rescue, after a barrier).
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        acc_scaled = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_mask & (c < N)[None, :]
            x = tl.load(X + (x_row + c[None, :]), mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            r = tl.load(R + (r_row + c[None, :]), mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            v = (r + x).to(R.dtype.element_ty).to(tl.float32)
            acc, acc_scaled = _accumulate(acc, acc_scaled, v, RESCUE == RESCUE_IN_SUM)
        ss, rstd = _row_rstd(acc, acc_scaled, N, eps, RESCUE == RESCUE_IN_SUM)
        rstd = rstd[:, None]
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
        if RESCUE == RESCUE_AFTER:
            if _overflowed(ss):
                _rescue(R, W, Y, M, stride_r, eps, _first_row(ROWS, OFF64), N, BLOCK_N, ROWS, R_DENSE)


#: Hopper's registers a SM, warps a SM and blocks a SM; Triton's warps a program when a config sets none.
_SM_REGS, _SM_WARPS, _SM_BLOCKS = 65536, 64, 32
_DEFAULT_WARPS = 4


def _blocks_per_sm(regs: int, warps: int) -> int:
    # Blocks of ``warps`` warps a SM holds at ``regs`` registers a thread (allocated 8 at a time), shared memory aside.
    return min(_SM_REGS // (-(-regs // 8) * 8 * 32 * warps), _SM_WARPS // warps, _SM_BLOCKS)


def _occupancy_cap(regs: int, warps: int) -> int:
    """The most registers a thread may take while a SM holds as many blocks as at ``regs``."""
    return max(r for r in range(regs, 256) if _blocks_per_sm(r, warps) == _blocks_per_sm(regs, warps))


#: Bytes a thread loads at once (Triton's widest vector), which sets how many columns a warp spans.
_VECTOR_BYTES = 16


def rescue_mode(dtype: torch.dtype, BLOCK_N: int, ROWS: int, num_warps: int | None) -> int:
    """The ``RESCUE`` of a tile: none for float16 (its sum of squares cannot overflow); ``RESCUE_IN_SUM`` where
    the tile's rows are spread over warps, which is where Triton's layout leaves fewer than ``num_warps`` (two or
    more) warps along a row of ``BLOCK_N`` columns (each warp spans at most 32 vectors of 16 bytes);
    ``RESCUE_AFTER`` elsewhere. Every mode gives the same answers; the choice only moves the cost."""
    if dtype == torch.float16:
        return NO_RESCUE.value
    warps = _DEFAULT_WARPS if num_warps is None else num_warps
    spread = ROWS > 1 and warps > 1 and BLOCK_N < warps * 32 * (_VECTOR_BYTES // dtype.itemsize)
    return (RESCUE_IN_SUM if spread else RESCUE_AFTER).value


def _capped(kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], consts: dict[str, Any],
            options: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``options``, for a ``RESCUE_AFTER`` kernel on an NVIDIA GPU with ``maxnreg`` capped at the most registers that
    keep the blocks a SM of ``kernel`` without the rescue (or at the caller's, if fewer): unpinned or pinned at that
    count, ptxas delays the common path's loads (``docs/decisions.md``, "The overflow rescue, per tile")."""
    if (consts["RESCUE"] != RESCUE_AFTER.value or device.type != "cuda" or torch.version.hip is not None
            or interpreted()):
        return options
    base = compiled_registers(kernel, grid, args, {**consts, "RESCUE": NO_RESCUE.value}, options, device)
    cap = _occupancy_cap(base, options.get("num_warps", _DEFAULT_WARPS))
    return {**options, "maxnreg": min(cap, options.get("maxnreg") or cap)}


def _check_knobs(BLOCK_N: int, ROWS: int) -> None:
    for name, value in (("BLOCK_N", BLOCK_N), ("ROWS", ROWS)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two, got {value!r}")


#: Largest element offset the kernels index in int32.
INT32_MAX = 2**31 - 1


def needs_int64(M: int, N: int, BLOCK_N: int, ROWS: int, *row_strides: int) -> bool:
    """Whether some element offset a launch computes (masked-off rows and columns of its last tiles
    included, so nothing wraps) exceeds :data:`INT32_MAX`, so the kernel must index in int64."""
    last_row = -(-M // ROWS) * ROWS - 1
    last_col = -(-N // BLOCK_N) * BLOCK_N - 1
    return last_row * max((N, *row_strides)) + last_col > INT32_MAX


def _constexprs(M: int, N: int, BLOCK_N: int, ROWS: int, pdl: bool, x_stride: int,
                r_stride: int | None = None, *, rescue: int) -> dict[str, int | bool]:
    """The constexprs of a launch of :func:`_rmsnorm_kernel` (x's row stride) or, with the
    residual's row stride too, of :func:`_fused_add_rmsnorm_kernel`; ``rescue`` is its :func:`rescue_mode`."""
    strides = (x_stride,) if r_stride is None else (x_stride, r_stride)
    dense = {"X_DENSE": x_stride == N, **({} if r_stride is None else {"R_DENSE": r_stride == N})}
    # No row mask when the programs cover M exactly (one row per program, always): with N a constexpr,
    # a one-row whole-row tile then has no mask at all.
    mask_rows = M % ROWS != 0
    return {"N": N, "BLOCK_N": BLOCK_N, "ROWS": ROWS, "ONE_PASS": BLOCK_N >= N, "MASK_ROWS": mask_rows,
            "PDL": pdl, "OFF64": needs_int64(M, N, BLOCK_N, ROWS, *strides), **dense, "RESCUE": rescue}


def _output_alloc(x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """How a bound launcher allocates y for calls shaped like ``x``: contiguous, x's shape and dtype."""
    if x.is_contiguous():
        return torch.empty_like  # the cheapest allocation (about 1 us less than torch.empty(shape, ...))
    shape, dtype, device = x.shape, x.dtype, x.device
    return lambda _: torch.empty(shape, dtype=dtype, device=device)


def _launcher(kernel: Any, tensors: tuple[torch.Tensor, ...], M: int, N: int, strides: tuple[int, ...], eps: float,
              BLOCK_N: int, ROWS: int, num_warps: int | None, num_stages: int | None,
              pdl: bool | None) -> tuple[Callable[..., None] | None, Callable[[torch.Tensor], torch.Tensor]]:
    """``kernel`` compiled for a checked call of ``tensors`` (x first; None without rows), and y's allocation."""
    _check_knobs(BLOCK_N, ROWS)
    x = tensors[0]
    pdl = resolve_pdl(x.device, pdl)
    alloc = _output_alloc(x)
    if M == 0:  # no rows: nothing to launch
        return None, alloc
    probe = torch.empty(1, dtype=x.dtype, device=x.device)  # stands in for y: fresh, so aligned like every y
    grid, args = ((M + ROWS - 1) // ROWS,), (*tensors, probe, M, *strides, eps)
    consts = _constexprs(M, N, BLOCK_N, ROWS, pdl, *strides, rescue=rescue_mode(x.dtype, BLOCK_N, ROWS, num_warps))
    options = _capped(kernel, grid, args, consts, hints(num_warps, num_stages, pdl), x.device)
    return compiled_launcher(kernel, grid, args, consts, options, x.device), alloc


def bind_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, BLOCK_N: int, ROWS: int,
                 num_warps: int | None = None, num_stages: int | None = None,
                 pdl: bool | None = None) -> Callable[..., torch.Tensor]:
    """:func:`rmsnorm_triton` specialized to calls like this one (same dtypes, shapes, strides, devices and eps):
    the checks, the launch arithmetic and the compile run here, once. The launcher takes ``(x, weight, eps)``;
    another ``eps`` is checked on its call. ``pdl``: a programmatic dependent (default: where supported)."""
    M, N, x_stride, eps_f = check_rmsnorm(x, weight, eps)
    launch, alloc = _launcher(_rmsnorm_kernel, (x, weight), M, N, (x_stride,), eps_f, BLOCK_N, ROWS, num_warps,
                              num_stages, pdl)
    if launch is None:
        return lambda x, weight, eps=eps_f: alloc(x)

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
    launch, alloc = _launcher(_fused_add_rmsnorm_kernel, (x, residual, weight), M, N, (x_stride, r_stride), eps_f,
                              BLOCK_N, ROWS, num_warps, num_stages, pdl)
    if launch is None:
        return lambda x, residual, weight, eps=eps_f: alloc(x)

    def run(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = eps_f) -> torch.Tensor:
        y = alloc(x)
        launch(x, residual, weight, y, M, x_stride, r_stride, eps_f if eps == eps_f else check_eps(eps))
        return y

    return run


def _once(bind: Callable[..., Callable[..., torch.Tensor]]) -> Callable[..., torch.Tensor]:
    """One call of what ``bind`` binds: bound to its arguments, then launched on them."""
    return lambda *args, **options: bind(*args, **options)(*args)


#: ``rmsnorm_triton(x, weight, eps=1e-6, *, BLOCK_N, ROWS, num_warps=None, num_stages=None)``: x / rms(x) * weight;
#: ``fused_add_rmsnorm_triton(x, residual, weight, eps=1e-6, ...)``: residual += x in place, then its RMSNorm.
rmsnorm_triton = _once(bind_rmsnorm)
fused_add_rmsnorm_triton = _once(bind_fused_add_rmsnorm)
