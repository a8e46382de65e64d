"""Triton grouped GEMMs and the top-k reduction of the fused MoE.

Both GEMMs walk the routing's row tiles (:mod:`.routing`), each ``BLOCK_M`` slots of ``sorted_ids`` of one expert;
a slot's pair ``p`` reads row ``p // topk`` of x (GEMM 1) or row ``p`` of h (GEMM 2), and a padding slot reads row
0 (nothing with ``MASK_PAD``) and stores nothing. Programs walk ``GROUP_M`` row tiles per column tile, so a group
shares its weight tile in L2.
GEMM 1 (:func:`_gate_up_kernel`): ``h[p] = silu(x[m] @ w1[e, :N].T) * (x[m] @ w1[e, N:].T)`` in one program. GEMM 2
(:func:`_down_kernel`): ``y[p] = topk_weights[p] * h[p] @ w2[e].T``, the reduction over N optionally split
``SPLIT_K`` ways (a second grid axis) into float32 partials. :func:`_reduce_kernel`: ``out[m] = sum_j sum_s
y_s[m * topk + j]`` over the routed pairs. With ``TMA``, ``W1`` (``W2``) is a tensor descriptor over w1 as
[E * 2N, K] rows (w2 as [E * K, N]) in [BLOCK_N, BLOCK_K] blocks, zero-filled past the reduction's end. With
``ONE_DOT`` GEMM 1 multiplies gate and up columns in one dot of 2 BLOCK_N columns (one wgmma twice as wide on
Hopper), its TMA descriptor over w1 as [E * 2, N, K] in [2, BLOCK_N, BLOCK_K] blocks. GROUP_M and SPLIT_K are
runtime arguments, so configs that differ only in them share one binary."""

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


@triton.jit
def _load_rows(a_ptr, valid, k_ok, EVEN_K: tl.constexpr, MASK_PAD: tl.constexpr):
    # A tile of gathered rows (k_ok: its columns in range, unused where EVEN_K). Padding slots point at row 0; with
    # MASK_PAD they read zeros without a load.
    if EVEN_K:
        if MASK_PAD:
            return tl.load(a_ptr, mask=valid[:, None], other=0.0)
        return tl.load(a_ptr)
    if MASK_PAD:
        return tl.load(a_ptr, mask=valid[:, None] & k_ok[None, :], other=0.0)
    return tl.load(a_ptr, mask=k_ok[None, :], other=0.0)


@triton.jit
def _load_weights(b_ptr, k_ok, EVEN_K: tl.constexpr):
    # A [BLOCK_K, columns] weight tile by pointers; steps past the reduction's end read zeros.
    if EVEN_K:
        return tl.load(b_ptr)
    return tl.load(b_ptr, mask=k_ok[:, None], other=0.0)


@triton.jit(do_not_specialize=["P", "tiles_m", "group_m", "topk"])
def _gate_up_kernel(X, W1, H, SORTED, BLOCK_EXPERT, USED, P, tiles_m, group_m, topk, x_stride, N, K,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr = False,
                    TAILS: tl.constexpr = 0, PDL: tl.constexpr = False, ONE_DOT: tl.constexpr = False,
                    MASK_PAD: tl.constexpr = False):
    dependent_start(PDL)
    # x_stride stays specialized: its divisibility by 16 is what lets the x tile load in 16-byte vectors. With
    # TAILS, USED is the routing's tile table [tiles in use, each tile's first slot, each tile's slots].
    pid_m, pid_n = _tile(tl.program_id(0), tiles_m, tl.cdiv(N, BLOCK_N), group_m)
    if TAILS == 0:
        if pid_m * BLOCK_M >= tl.load(USED):
            return
        _gate_up_tile(X, W1, H, SORTED, BLOCK_EXPERT, pid_m, pid_n, 0, 0, P, topk, x_stride, N, K,
                      BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, UPCAST, TMA, False, ONE_DOT, MASK_PAD)
    else:
        if pid_m >= tl.load(USED):
            return
        start, rows = tl.load(USED + 1 + pid_m), tl.load(USED + 1 + tiles_m + pid_m)
        if rows > BLOCK_M // 2:
            _gate_up_tile(X, W1, H, SORTED, BLOCK_EXPERT, pid_m, pid_n, start, rows, P, topk, x_stride, N, K,
                          BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, UPCAST, TMA, True, ONE_DOT, MASK_PAD)
        elif TAILS == 1:
            _gate_up_tile(X, W1, H, SORTED, BLOCK_EXPERT, pid_m, pid_n, start, rows, P, topk, x_stride, N, K,
                          BLOCK_M // 2, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, UPCAST, TMA, True, ONE_DOT, MASK_PAD)
        elif rows > BLOCK_M // 4:
            _gate_up_tile(X, W1, H, SORTED, BLOCK_EXPERT, pid_m, pid_n, start, rows, P, topk, x_stride, N, K,
                          BLOCK_M // 2, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, UPCAST, TMA, True, ONE_DOT, MASK_PAD)
        else:
            _gate_up_tile(X, W1, H, SORTED, BLOCK_EXPERT, pid_m, pid_n, start, rows, P, topk, x_stride, N, K,
                          BLOCK_M // 4, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N, UPCAST, TMA, True, ONE_DOT, MASK_PAD)


@triton.jit
def _gate_up_tile(X, W1, H, SORTED, BLOCK_EXPERT, pid_m, pid_n, start, rows, P, topk, x_stride, N, K,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
                  TABLE: tl.constexpr, ONE_DOT: tl.constexpr, MASK_PAD: tl.constexpr):
    # GEMM 1 of row tile pid_m (slots as _tile_pairs takes them), output columns pid_n.
    pairs, valid, e = _tile_pairs(SORTED, BLOCK_EXPERT, pid_m, start, rows, P, BLOCK_M, TABLE)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    wcols = tl.where(col_ok, cols, 0)  # in-bounds rows of w1 for masked columns
    ks = tl.arange(0, BLOCK_K)
    a_ptr = X + ((pairs // topk).to(tl.int64) * x_stride)[:, None] + ks[None, :]
    if ONE_DOT:
        acc = _gate_up_one_dot(W1, a_ptr, ks, valid, e, pid_n, N, K, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST, TMA,
                               MASK_PAD)
    else:
        acc = _gate_up_two_dots(W1, a_ptr, ks, valid, e, pid_n, wcols, N, K, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST,
                                TMA, MASK_PAD)
    out = H + (pairs.to(tl.int64) * N)[:, None] + cols[None, :]
    mask = valid[:, None] & col_ok[None, :] if not EVEN_N else valid[:, None]
    tl.store(out, acc.to(H.dtype.element_ty), mask=mask)


@triton.jit
def _gate_up_two_dots(W1, a_ptr, ks, valid, e, pid_n, wcols, N, K, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
                      TMA: tl.constexpr, MASK_PAD: tl.constexpr):
    # silu(gate) * up of one tile, gate and up each a dot of their own (a_ptr: the tile's x rows at k = 0; wcols:
    # its columns' rows of w1, in bounds).
    if TMA:  # the tile's first gate row of w1 as [E * 2N, K]
        w_row = (e * (2 * N) + pid_n * BLOCK_N).to(tl.int32)
    else:
        g_ptr = W1 + e * (2 * N * K) + (wcols.to(tl.int64) * K)[None, :] + ks[:, None]
        u_ptr = g_ptr + N * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = ks < K - k0  # unused where EVEN_K
        a = _load_rows(a_ptr, valid, k_ok, EVEN_K, MASK_PAD)
        if TMA:
            g = W1.load([w_row, k0]).T
        else:
            g = _load_weights(g_ptr, k_ok, EVEN_K)
        acc = _mma(a, g, acc, UPCAST)
        if TMA:
            u = W1.load([w_row + N, k0]).T
        else:
            u = _load_weights(u_ptr, k_ok, EVEN_K)
        acc_u = _mma(a, u, acc_u, UPCAST)
        a_ptr += BLOCK_K
        if not TMA:
            g_ptr += BLOCK_K
            u_ptr += BLOCK_K
    return acc * tl.sigmoid(acc) * acc_u


@triton.jit
def _gate_up_one_dot(W1, a_ptr, ks, valid, e, pid_n, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
                     MASK_PAD: tl.constexpr):
    # silu(gate) * up of one tile from one dot over 2 BLOCK_N weight rows: pointer loads interleave gate and up
    # rows (column 2j gate j, 2j + 1 up j); TMA (W1 as [E * 2, N, K]) loads [2, BLOCK_N, BLOCK_K], gate rows first.
    if not TMA:
        j = tl.arange(0, 2 * BLOCK_N)
        col = pid_n * BLOCK_N + j // 2
        row = tl.where(col < N, (j % 2) * N + col, 0)
        b_ptr = W1 + e * (2 * N * K) + (row.to(tl.int64) * K)[None, :] + ks[:, None]
    acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = ks < K - k0  # unused where EVEN_K
        a = _load_rows(a_ptr, valid, k_ok, EVEN_K, MASK_PAD)
        if TMA:
            b = W1.load([(2 * e).to(tl.int32), pid_n * BLOCK_N, k0]).reshape([2 * BLOCK_N, BLOCK_K]).T
        else:
            b = _load_weights(b_ptr, k_ok, EVEN_K)
        acc = _mma(a, b, acc, UPCAST)
        a_ptr += BLOCK_K
        if not TMA:
            b_ptr += BLOCK_K
    if TMA:
        gate, up = tl.split(acc.reshape([BLOCK_M, 2, BLOCK_N]).permute(0, 2, 1))
    else:
        gate, up = tl.split(acc.reshape([BLOCK_M, BLOCK_N, 2]))
    return gate * tl.sigmoid(gate) * up


@triton.jit(do_not_specialize=["P", "tiles_m", "group_m", "split_k", "k_tiles_per_split"])
def _down_kernel(H, W2, Y, SORTED, BLOCK_EXPERT, USED, TOPK_W, P, tiles_m, group_m, split_k,
                 k_tiles_per_split, N, K,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PARTIAL: tl.constexpr,
                 EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr = False,
                 TAILS: tl.constexpr = 0, PDL: tl.constexpr = False, MASK_PAD: tl.constexpr = False):
    dependent_start(PDL)
    # Output columns are K (x's width); the reduction runs over N. PARTIAL: float32 partials per split.
    pid_m, pid_n = _tile(tl.program_id(0), tiles_m, tl.cdiv(K, BLOCK_N), group_m)
    split = tl.program_id(1)
    if TAILS == 0:
        if pid_m * BLOCK_M >= tl.load(USED):
            return
        _down_tile(H, W2, Y, SORTED, BLOCK_EXPERT, TOPK_W, pid_m, pid_n, split, 0, 0, P, k_tiles_per_split, N, K,
                   BLOCK_M, BLOCK_N, BLOCK_K, PARTIAL, EVEN_K, EVEN_N, UPCAST, TMA, False, MASK_PAD)
    else:
        if pid_m >= tl.load(USED):
            return
        start, rows = tl.load(USED + 1 + pid_m), tl.load(USED + 1 + tiles_m + pid_m)
        if rows > BLOCK_M // 2:
            _down_tile(H, W2, Y, SORTED, BLOCK_EXPERT, TOPK_W, pid_m, pid_n, split, start, rows, P, k_tiles_per_split,
                       N, K, BLOCK_M, BLOCK_N, BLOCK_K, PARTIAL, EVEN_K, EVEN_N, UPCAST, TMA, True, MASK_PAD)
        elif TAILS == 1:
            _down_tile(H, W2, Y, SORTED, BLOCK_EXPERT, TOPK_W, pid_m, pid_n, split, start, rows, P, k_tiles_per_split,
                       N, K, BLOCK_M // 2, BLOCK_N, BLOCK_K, PARTIAL, EVEN_K, EVEN_N, UPCAST, TMA, True, MASK_PAD)
        elif rows > BLOCK_M // 4:
            _down_tile(H, W2, Y, SORTED, BLOCK_EXPERT, TOPK_W, pid_m, pid_n, split, start, rows, P, k_tiles_per_split,
                       N, K, BLOCK_M // 2, BLOCK_N, BLOCK_K, PARTIAL, EVEN_K, EVEN_N, UPCAST, TMA, True, MASK_PAD)
        else:
            _down_tile(H, W2, Y, SORTED, BLOCK_EXPERT, TOPK_W, pid_m, pid_n, split, start, rows, P, k_tiles_per_split,
                       N, K, BLOCK_M // 4, BLOCK_N, BLOCK_K, PARTIAL, EVEN_K, EVEN_N, UPCAST, TMA, True, MASK_PAD)


@triton.jit
def _down_tile(H, W2, Y, SORTED, BLOCK_EXPERT, TOPK_W, pid_m, pid_n, split, start, rows, P, k_tiles_per_split, N,
               K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PARTIAL: tl.constexpr,
               EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
               TABLE: tl.constexpr, MASK_PAD: tl.constexpr):
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
        k_ok = ks < k_end - k0  # unused where EVEN_K
        a = _load_rows(a_ptr, valid, k_ok, EVEN_K, MASK_PAD)
        if TMA:
            b = W2.load([w_row, k0]).T
        else:
            b = _load_weights(b_ptr, k_ok, EVEN_K)
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
