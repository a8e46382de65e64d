"""The decode path of the fused MoE (knob ``DECODE``): two launches, no routing, each selected expert's weights
read once per token tile. The rows of a tile are the tokens themselves (M up to ``BLOCK_M``), not sorted pairs.

GEMM 1 (:func:`_decode_gate_up_kernel`), a program per (selected expert, column tile, token tile): each finds the
selected experts from the ids (a presence vector, in expert order) and takes the one its first grid index ranks; it
stores ``h = topk_weight * silu(x @ gate) * (x @ up)`` for the tokens that chose the expert, at the row of their first
pair with it (a token naming one expert twice has its weights summed). Program 0 also writes the list of selected
experts and zeroes GEMM 2's arrival counters. GEMM 2 (:func:`_decode_down_kernel`), a program per (output column tile,
selected expert, token tile): it stores its float32 product at the rows of its expert's pairs, then counts itself in on
its (column tile, token tile); the last to arrive sums each token's pairs in top-k order (a fixed order, whichever
program comes last) and writes ``out``. A pair whose expert is outside [0, E) is never computed and adds nothing."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from flyreg.triton import compiled_launcher, dependent_start, hints, interpreted

from .checks import Launch, MoEArgs
from .gemm_kernels import _mma
from .routing import chunk_size
from .space import next_pow2


@triton.jit
def _token_ids(IDS, m, M, topk, TOPK_P2: tl.constexpr):
    # The ids of tokens m as a [tokens, TOPK_P2] tile (-1 past M and topk), and the slot index j.
    j = tl.arange(0, TOPK_P2)
    return tl.load(IDS + m[:, None] * topk + j[None, :], mask=(m < M)[:, None] & (j < topk)[None, :], other=-1), j


@triton.jit
def _token_pairs(ids, j, m, e, topk, TOPK_P2: tl.constexpr):
    # For tokens m (their ids tile) and expert e: whether each chose e, and the pair index of its first choice.
    match = ids == e
    first = tl.min(tl.where(match, j[None, :], TOPK_P2), axis=1)
    return first < TOPK_P2, m * topk + tl.where(first < TOPK_P2, first, 0), match


@triton.jit(do_not_specialize=["M", "P", "E", "topk", "n_counts"])
def _decode_gate_up_kernel(X, W1, H, IDS, TW, EXPERTS, COUNTS, M, P, E, topk, n_counts, x_stride, N, K,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           E_P2: tl.constexpr, CHUNK: tl.constexpr, TOPK_P2: tl.constexpr, COUNTS_P2: tl.constexpr,
                           EVEN_K: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    dependent_start(PDL)
    slot = tl.program_id(0)
    experts = tl.arange(0, E_P2)
    present = tl.zeros([E_P2], dtype=tl.int32)
    for c0 in range(0, P, CHUNK):
        pairs = c0 + tl.arange(0, CHUNK)
        ids = tl.load(IDS + pairs, mask=pairs < P, other=-1).to(tl.int32)
        hot = (ids[:, None] == experts[None, :]) & ((ids >= 0) & (ids < E))[:, None]
        present = tl.maximum(present, tl.max(hot.to(tl.int32), axis=0))
    rank = tl.cumsum(present, axis=0) - 1
    count = tl.sum(present, axis=0)
    if (slot == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0):
        tl.store(EXPERTS, count)
        tl.store(EXPERTS + 1 + rank, experts, mask=present > 0)
        c = tl.arange(0, COUNTS_P2)
        tl.store(COUNTS + c, tl.zeros([COUNTS_P2], dtype=tl.int32), mask=c < n_counts)
    if slot >= count:
        return
    e = tl.sum(tl.where((present > 0) & (rank == slot), experts, 0), axis=0)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    tok_ids, j = _token_ids(IDS, m, M, topk, TOPK_P2)
    chosen, pair, match = _token_pairs(tok_ids, j, m, e, topk, TOPK_P2)
    weight = tl.sum(tl.load(TW + m[:, None] * topk + j[None, :], mask=match, other=0.0), axis=1)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    a_ptr = X + (tl.where(m < M, m, 0).to(tl.int64) * x_stride)[:, None] + ks[None, :]
    g_ptr = W1 + e.to(tl.int64) * (2 * N * K) + (tl.where(col_ok, cols, 0).to(tl.int64) * K)[None, :] + ks[:, None]
    u_ptr = g_ptr + N * K
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptr)
            g = tl.load(g_ptr)
            u = tl.load(u_ptr)
        else:
            k_ok = ks < K - k0
            a = tl.load(a_ptr, mask=k_ok[None, :], other=0.0)
            g = tl.load(g_ptr, mask=k_ok[:, None], other=0.0)
            u = tl.load(u_ptr, mask=k_ok[:, None], other=0.0)
        acc_g = _mma(a, g, acc_g, UPCAST)
        acc_u = _mma(a, u, acc_u, UPCAST)
        a_ptr += BLOCK_K
        g_ptr += BLOCK_K
        u_ptr += BLOCK_K
    h = acc_g * tl.sigmoid(acc_g) * acc_u * weight[:, None]
    out = H + (pair.to(tl.int64) * N)[:, None] + cols[None, :]
    tl.store(out, h.to(H.dtype.element_ty), mask=chosen[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["M", "E", "topk"])
def _decode_down_kernel(H, W2, Y, OUT, IDS, EXPERTS, COUNTS, M, E, topk, N, K,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        TOPK_P2: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, UPCAST: tl.constexpr,
                        PDL: tl.constexpr):
    dependent_start(PDL)  # GEMM 2 may start while GEMM 1 ends (a programmatic dependent), and waits for it here
    slot = tl.program_id(1)
    count = tl.load(EXPERTS)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < K
    out_mask = (m < M)[:, None] & col_ok[None, :] if not EVEN_N else (m < M)[:, None]
    out_ptr = OUT + (m.to(tl.int64) * K)[:, None] + cols[None, :]
    if slot >= count:
        if (slot == 0) & (count == 0):  # no pair names an expert in range: out is zero
            tl.store(out_ptr, tl.zeros([BLOCK_M, BLOCK_N], dtype=OUT.dtype.element_ty), mask=out_mask)
        return
    e = tl.load(EXPERTS + 1 + slot)
    ks = tl.arange(0, BLOCK_K)
    tok_ids, j = _token_ids(IDS, m, M, topk, TOPK_P2)
    chosen, pair, _ = _token_pairs(tok_ids, j, m, e, topk, TOPK_P2)
    a_ptr = H + (pair.to(tl.int64) * N)[:, None] + ks[None, :]
    b_ptr = W2 + e.to(tl.int64) * (K * N) + (tl.where(col_ok, cols, 0).to(tl.int64) * N)[None, :] + ks[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, N, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptr, mask=chosen[:, None], other=0.0)
            b = tl.load(b_ptr)
        else:
            k_ok = ks < N - k0
            a = tl.load(a_ptr, mask=chosen[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptr, mask=k_ok[:, None], other=0.0)
        acc = _mma(a, b, acc, UPCAST)
        a_ptr += BLOCK_K
        b_ptr += BLOCK_K
    y_cols = (pair.to(tl.int64) * K)[:, None] + cols[None, :]
    tl.store(Y + y_cols, acc, mask=chosen[:, None] & col_ok[None, :])
    tl.debug_barrier()  # every thread's partial is stored before the program counts itself in
    counter = COUNTS + tl.program_id(2) * tl.num_programs(0) + tl.program_id(0)
    if tl.atomic_add(counter, 1, sem="acq_rel") == count - 1:
        total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        row = m.to(tl.int64) * topk
        for jj in tl.static_range(TOPK_P2):
            ok = (m < M) & (m * 0 + jj < topk)
            idj = tl.load(IDS + row + jj, mask=ok, other=-1)
            keep = ok & (idj >= 0) & (idj < E)
            for j2 in tl.static_range(jj):  # a repeated expert counts once, at its first pair
                keep = keep & (tl.load(IDS + row + j2, mask=ok, other=-1) != idj)
            total += tl.load(Y + ((row + jj) * K)[:, None] + cols[None, :], mask=keep[:, None] & col_ok[None, :],
                             other=0.0, cache_modifier=".cg")
        tl.store(out_ptr, total.to(OUT.dtype.element_ty), mask=out_mask)


def constexprs(M: int, K: int, N: int, E: int, topk: int, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int,
               BLOCK_N_DOWN: int, upcast: bool, pdl: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The constexprs of GEMM 1's and GEMM 2's launches for these sizes and knobs (what makes each binary)."""
    n_counts, topk_p2 = triton.cdiv(K, BLOCK_N_DOWN) * triton.cdiv(M, BLOCK_M), next_pow2(topk)
    return ({"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, "E_P2": max(16, next_pow2(E)),
             "CHUNK": chunk_size(E), "TOPK_P2": topk_p2, "COUNTS_P2": next_pow2(n_counts), "EVEN_K": K % BLOCK_K == 0,
             "UPCAST": upcast, "PDL": pdl},
            {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N_DOWN, "BLOCK_K": BLOCK_K, "TOPK_P2": topk_p2,
             "EVEN_K": N % BLOCK_K == 0, "EVEN_N": K % BLOCK_N_DOWN == 0, "UPCAST": upcast, "PDL": pdl})


def bind_decode(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, shape: MoEArgs, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, BLOCK_N_DOWN: int,
                num_warps: int | None, num_stages: int | None, pdl: bool) -> Launch:
    """Decode-path launcher ``run(x, w1, w2, topk_weights, topk_ids) -> out [M, K]`` for ``shape`` (checked by the
    caller), compiled here: two launches, programmatic dependents where ``pdl``."""
    (M, K, N, E, topk, x_stride), dtype, device = shape, x.dtype, x.device
    P, slots, token_tiles, col_tiles = M * topk, min(M * topk, E), triton.cdiv(M, BLOCK_M), triton.cdiv(K, BLOCK_N_DOWN)
    up_consts, down_consts = constexprs(M, K, N, E, topk, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_N_DOWN,
                                        interpreted() and dtype == torch.bfloat16, pdl)
    e_p2, n_counts = up_consts["E_P2"], col_tiles * token_tiles

    def launch_args(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, tw: torch.Tensor,
                    ids: torch.Tensor) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        # A call's fresh buffers (h, GEMM 2's products, the selected experts, arrival counters, out) in its arguments.
        h, y = torch.empty((P, N), dtype=dtype, device=device), torch.empty((P, K), dtype=torch.float32, device=device)
        experts, counts = (torch.empty(n, dtype=torch.int32, device=device) for n in (1 + e_p2, n_counts))
        out, ids = torch.empty((M, K), dtype=dtype, device=device), ids.view(-1)
        return ((x, w1, h, ids, tw.view(-1), experts, counts, M, P, E, topk, n_counts, x_stride, N, K),
                (h, w2, y, out, ids, experts, counts, M, E, topk, N, K))

    up, down_args = launch_args(x, w1, w2, topk_weights, topk_ids)
    gate_up = compiled_launcher(_decode_gate_up_kernel, (slots, triton.cdiv(N, BLOCK_N), token_tiles), up, up_consts,
                                hints(num_warps, num_stages, pdl=pdl), device)
    down = compiled_launcher(_decode_down_kernel, (col_tiles, slots, token_tiles), down_args, down_consts,
                             hints(num_warps, num_stages, pdl=pdl), device)

    def run(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
            topk_ids: torch.Tensor) -> torch.Tensor:
        up, down_args = launch_args(x, w1, w2, topk_weights, topk_ids)
        gate_up(*up)
        down(*down_args)
        return down_args[3]  # out

    return run
