"""Triton grouped GEMMs and the top-k reduction of the fused MoE.

Both GEMMs walk the routing's row tiles (:mod:`.routing`), each ``BLOCK_M`` slots of ``sorted_ids`` of one expert;
a slot's pair ``p`` reads row ``p // topk`` of x (GEMM 1) or row ``p`` of h (GEMM 2), and a padding slot reads row
0 and stores nothing. Programs walk ``GROUP_M`` row tiles per column tile, so a group shares its weight tile in L2.
GEMM 1 (:func:`_gate_up_kernel`): ``h[p] = silu(x[m] @ w1[e, :N].T) * (x[m] @ w1[e, N:].T)`` in one program. GEMM 2
(:func:`_down_kernel`): ``y[p] = topk_weights[p] * h[p] @ w2[e].T``, the reduction over N optionally split
``SPLIT_K`` ways (a second grid axis) into float32 partials. :func:`_reduce_kernel`: ``out[m] = sum_j sum_s
y_s[m * topk + j]`` over the routed pairs. With ``TMA``, ``W1`` (``W2``) is a tensor descriptor over w1 as
[E * 2N, K] rows (w2 as [E * K, N]) in [BLOCK_N, BLOCK_K] blocks, zero-filled past the reduction's end. GROUP_M
and SPLIT_K are runtime arguments, so configs that differ only in them share one binary."""

from __future__ import annotations

import triton
import triton.language as tl

from flyreg.triton import dependent_start


@triton.jit
def _tile(pid, tiles_m, tiles_n, group_m):
    # (row tile, column tile) of program pid: GROUP_M row tiles per column tile, column-major in a group.
    width = group_m * tiles_n
    group = pid // width
    first = group * group_m
    size = tl.minimum(tiles_m - first, group_m)
    return first + (pid % width) % size, (pid % width) // size


@triton.jit
def _mma(a, b, acc, UPCAST: tl.constexpr):
    # acc + a @ b; UPCAST (Triton's interpreter, whose dot on bfloat16 is wrong) multiplies in float32.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _tile_pairs(SORTED, BLOCK_EXPERT, pid_m, start, rows, P, BLOCK_M: tl.constexpr, TABLE: tl.constexpr):
    # Row tile pid_m's pairs, which of its slots hold one (padding slots hold the sentinel P), and its expert
    # (int64): the tile's BLOCK_M rows of SORTED, or (TABLE) ``rows`` slots from ``start`` (BLOCK_M >= rows).
    i = tl.arange(0, BLOCK_M)
    if TABLE:
        pairs = tl.load(SORTED + start + i, mask=i < rows, other=P)
    else:
        pairs = tl.load(SORTED + pid_m * BLOCK_M + i)
    valid = pairs < P
    return tl.where(valid, pairs, 0), valid, tl.load(BLOCK_EXPERT + pid_m).to(tl.int64)


@triton.jit(do_not_specialize=["P", "tiles_m", "group_m", "topk"])
def _gate_up_kernel(X, W1, H, SORTED, BLOCK_EXPERT, USED, P, tiles_m, group_m, topk, x_stride, N, K,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr = False,
                    TAILS: tl.constexpr = 0, PDL: tl.constexpr = False):
    dependent_start(PDL)
    # x_stride stays specialized: its divisibility by 16 is what lets the x tile load in 16-byte vectors. With
    # TAILS, USED is the routing's tile table [tiles in use, each tile's first slot, each tile's slots].
    pid_m, pid_n = _tile(tl.program_id(0), tiles_m, tl.cdiv(N, BLOCK_N), group_m)
    if TAILS == 0:
        if pid_m * BLOCK_M >= tl.load(USED):
            return
        _gate_up_tile(X, W1, H, SORTED, BLOCK_EXPERT, pid_m, pid_n, 0, 0, P, topk, x_stride, N, K,
                      BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, UPCAST, TMA, False)
    else:
        if pid_m >= tl.load(USED):
            return
        start, rows = tl.load(USED + 1 + pid_m), tl.load(USED + 1 + tiles_m + pid_m)
        if rows > BLOCK_M // 2:
            _gate_up_tile(X, W1, H, SORTED, BLOCK_EXPERT, pid_m, pid_n, start, rows, P, topk, x_stride, N, K,
                          BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, UPCAST, TMA, True)
        elif TAILS == 1:
            _gate_up_tile(X, W1, H, SORTED, BLOCK_EXPERT, pid_m, pid_n, start, rows, P, topk, x_stride, N, K,
                          BLOCK_M // 2, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, UPCAST, TMA, True)
        elif rows > BLOCK_M // 4:
            _gate_up_tile(X, W1, H, SORTED, BLOCK_EXPERT, pid_m, pid_n, start, rows, P, topk, x_stride, N, K,
                          BLOCK_M // 2, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, UPCAST, TMA, True)
        else:
            _gate_up_tile(X, W1, H, SORTED, BLOCK_EXPERT, pid_m, pid_n, start, rows, P, topk, x_stride, N, K,
                          BLOCK_M // 4, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, UPCAST, TMA, True)


@triton.jit
def _gate_up_tile(X, W1, H, SORTED, BLOCK_EXPERT, pid_m, pid_n, start, rows, P, topk, x_stride, N, K,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
                  TABLE: tl.constexpr):
    # GEMM 1 of row tile pid_m (slots as _tile_pairs takes them), output columns pid_n.
    pairs, valid, e = _tile_pairs(SORTED, BLOCK_EXPERT, pid_m, start, rows, P, BLOCK_M, TABLE)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    wcols = tl.where(col_ok, cols, 0)  # in-bounds rows of w1 for masked columns
    ks = tl.arange(0, BLOCK_K)
    a_ptr = X + ((pairs // topk).to(tl.int64) * x_stride)[:, None] + ks[None, :]
    if TMA:  # the tile's first gate row of w1 as [E * 2N, K]
        w_row = (e * (2 * N) + pid_n * BLOCK_N).to(tl.int32)
    else:
        g_ptr = W1 + e * (2 * N * K) + (wcols.to(tl.int64) * K)[None, :] + ks[:, None]
        u_ptr = g_ptr + N * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptr)
        else:
            k_ok = ks < K - k0
            a = tl.load(a_ptr, mask=k_ok[None, :], other=0.0)
        if TMA:
            g = W1.load([w_row, k0]).T
        elif EVEN_K:
            g = tl.load(g_ptr)
        else:
            g = tl.load(g_ptr, mask=k_ok[:, None], other=0.0)
        acc = _mma(a, g, acc, UPCAST)
        if TMA:
            u = W1.load([w_row + N, k0]).T
        elif EVEN_K:
            u = tl.load(u_ptr)
        else:
            u = tl.load(u_ptr, mask=k_ok[:, None], other=0.0)
        acc_u = _mma(a, u, acc_u, UPCAST)
        a_ptr += BLOCK_K
        if not TMA:
            g_ptr += BLOCK_K
            u_ptr += BLOCK_K
    acc = acc * tl.sigmoid(acc) * acc_u
    out = H + (pairs.to(tl.int64) * N)[:, None] + cols[None, :]
    mask = valid[:, None] & col_ok[None, :] if not EVEN_N else valid[:, None]
    tl.store(out, acc.to(H.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["P", "tiles_m", "group_m", "split_k", "k_tiles_per_split"])
def _down_kernel(H, W2, Y, SORTED, BLOCK_EXPERT, USED, TOPK_W, P, tiles_m, group_m, split_k,
                 k_tiles_per_split, N, K,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PARTIAL: tl.constexpr,
                 EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr = False,
                 TAILS: tl.constexpr = 0, PDL: tl.constexpr = False):
    dependent_start(PDL)
    # Output columns are K (x's width); the reduction runs over N. PARTIAL: float32 partials per split.
    pid_m, pid_n = _tile(tl.program_id(0), tiles_m, tl.cdiv(K, BLOCK_N), group_m)
    split = tl.program_id(1)
    if TAILS == 0:
        if pid_m * BLOCK_M >= tl.load(USED):
            return
        _down_tile(H, W2, Y, SORTED, BLOCK_EXPERT, TOPK_W, pid_m, pid_n, split, 0, 0, P, k_tiles_per_split, N, K,
                   BLOCK_M, BLOCK_N, BLOCK_K, PARTIAL, EVEN_K, EVEN_N, UPCAST, TMA, False)
    else:
        if pid_m >= tl.load(USED):
            return
        start, rows = tl.load(USED + 1 + pid_m), tl.load(USED + 1 + tiles_m + pid_m)
        if rows > BLOCK_M // 2:
            _down_tile(H, W2, Y, SORTED, BLOCK_EXPERT, TOPK_W, pid_m, pid_n, split, start, rows, P, k_tiles_per_split,
                       N, K, BLOCK_M, BLOCK_N, BLOCK_K, PARTIAL, EVEN_K, EVEN_N, UPCAST, TMA, True)
        elif TAILS == 1:
            _down_tile(H, W2, Y, SORTED, BLOCK_EXPERT, TOPK_W, pid_m, pid_n, split, start, rows, P, k_tiles_per_split,
                       N, K, BLOCK_M // 2, BLOCK_N, BLOCK_K, PARTIAL, EVEN_K, EVEN_N, UPCAST, TMA, True)
        elif rows > BLOCK_M // 4:
            _down_tile(H, W2, Y, SORTED, BLOCK_EXPERT, TOPK_W, pid_m, pid_n, split, start, rows, P, k_tiles_per_split,
                       N, K, BLOCK_M // 2, BLOCK_N, BLOCK_K, PARTIAL, EVEN_K, EVEN_N, UPCAST, TMA, True)
        else:
            _down_tile(H, W2, Y, SORTED, BLOCK_EXPERT, TOPK_W, pid_m, pid_n, split, start, rows, P, k_tiles_per_split,
                       N, K, BLOCK_M // 4, BLOCK_N, BLOCK_K, PARTIAL, EVEN_K, EVEN_N, UPCAST, TMA, True)


@triton.jit
def _down_tile(H, W2, Y, SORTED, BLOCK_EXPERT, TOPK_W, pid_m, pid_n, split, start, rows, P, k_tiles_per_split, N,
               K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PARTIAL: tl.constexpr,
               EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
               TABLE: tl.constexpr):
    # GEMM 2 of row tile pid_m (slots as _tile_pairs takes them), output columns pid_n, reduction split ``split``.
    pairs, valid, e = _tile_pairs(SORTED, BLOCK_EXPERT, pid_m, start, rows, P, BLOCK_M, TABLE)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < K
    wcols = tl.where(col_ok, cols, 0)
    ks = tl.arange(0, BLOCK_K)
    k_first = split * k_tiles_per_split * BLOCK_K
    k_end = tl.minimum(N, k_first + k_tiles_per_split * BLOCK_K)
    a_ptr = H + (pairs.to(tl.int64) * N)[:, None] + (k_first + ks)[None, :]
    if TMA:  # the tile's first row of w2 as [E * K, N]
        w_row = (e * K + pid_n * BLOCK_N).to(tl.int32)
    else:
        b_ptr = W2 + e * (K * N) + (wcols.to(tl.int64) * N)[None, :] + (k_first + ks)[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_first, k_end, BLOCK_K):
        if not EVEN_K:
            k_ok = ks < k_end - k0
        if EVEN_K:
            a = tl.load(a_ptr)
        else:
            a = tl.load(a_ptr, mask=k_ok[None, :], other=0.0)
        if TMA:
            b = W2.load([w_row, k0]).T
        elif EVEN_K:
            b = tl.load(b_ptr)
        else:
            b = tl.load(b_ptr, mask=k_ok[:, None], other=0.0)
        acc = _mma(a, b, acc, UPCAST)
        a_ptr += BLOCK_K
        if not TMA:
            b_ptr += BLOCK_K
    acc = acc * tl.load(TOPK_W + pairs, mask=valid, other=0.0)[:, None]
    mask = valid[:, None] & col_ok[None, :] if not EVEN_N else valid[:, None]
    rows = pairs.to(tl.int64) * K
    if PARTIAL:
        tl.store(Y + split.to(tl.int64) * P * K + rows[:, None] + cols[None, :], acc, mask=mask)
    else:
        tl.store(Y + rows[:, None] + cols[None, :], acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M", "topk", "splits", "E"])
def _reduce_kernel(Y, IDS, OUT, M, topk, splits, E, K, BLOCK: tl.constexpr, TOPK_P2: tl.constexpr,
                   PDL: tl.constexpr = False):
    dependent_start(PDL)
    # out[m] = sum over the token's routed pairs and the splits of y, in float32, every pair's row loaded at once
    # (a pair whose expert is out of range was never computed: it adds nothing).
    m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < K
    j = tl.arange(0, TOPK_P2)
    e = tl.load(IDS + m * topk + j, mask=j < topk, other=-1)
    routed = (j < topk) & (e >= 0) & (e < E)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, splits):
        rows = (s * M * topk + m * topk + j) * K
        y = tl.load(Y + rows[:, None] + cols[None, :], mask=routed[:, None] & ok[None, :], other=0.0)
        acc += tl.sum(y.to(tl.float32), axis=0)
    tl.store(OUT + m * K + cols, acc.to(OUT.dtype.element_ty), mask=ok)
