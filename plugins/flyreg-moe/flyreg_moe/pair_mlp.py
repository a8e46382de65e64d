"""The pair path of the fused MoE (knob ``PAIR_MLP``): for a few tokens, each (token, expert) pair's whole MLP in
one program per chunk of N, no routing, no tensor cores, both weights read once per pair.

:func:`_pair_mlp_kernel`, a program per (pair, chunk of ``BLOCK_N`` of N): ``h = silu(x @ gate) * (x @ up)`` over
its chunk (products kept in float32 along K, summed once), rounded to x's dtype and scaled by the pair's weight, then
``w2[e][:, chunk] @ h`` for every output column, stored as float32 at (pair, chunk). :func:`_pair_sum_kernel`, a
program per (token, column tile), sums a token's partials (the same order on every call) and writes ``out``. A pair
whose expert is outside [0, E) stores zeros. Gate and up rows past N are read at row 0 (in bounds); w2's columns are
read as one contiguous run per row (16-byte vectors), past N as zeros, so those rows add nothing."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from flyreg.triton import compiled_launcher, dependent_start, hints

from .checks import Launch, MoEArgs
from .space import next_pow2

SUM_COLS, SUM_PARTS = 32, 128  #: Output columns a summing program covers, and partials it loads at once.


@triton.jit(do_not_specialize=["E"])
def _pair_mlp_kernel(X, W1, W2, Y, IDS, TW, E, topk, x_stride, N, K,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N_DOWN: tl.constexpr,
                     EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_OUT: tl.constexpr, PDL: tl.constexpr,
                     STAGES: tl.constexpr):
    dependent_start(PDL)
    pair, chunk = tl.program_id(0), tl.program_id(1)
    e = tl.load(IDS + pair).to(tl.int64)
    y_row = Y + (pair.to(tl.int64) * tl.num_programs(1) + chunk) * K
    outs = tl.arange(0, BLOCK_N_DOWN)
    if (e < 0) | (e >= E):
        for o0 in range(0, K, BLOCK_N_DOWN):
            tl.store(y_row + o0 + outs, tl.zeros([BLOCK_N_DOWN], dtype=tl.float32), mask=o0 + outs < K)
        return
    token = (pair // topk).to(tl.int64)
    weight = tl.load(TW + pair)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    x_ptr = X + token * x_stride + ks
    col = tl.where(col_ok, cols, 0)
    g_ptr = W1 + ((e * 2 * N + col) * K)[:, None] + ks[None, :]  # int64 offsets, e being int64
    u_ptr = W1 + ((e * 2 * N + N + col) * K)[:, None] + ks[None, :]
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        if EVEN_K:
            a = tl.load(x_ptr).to(tl.float32)
            g = tl.load(g_ptr)
            u = tl.load(u_ptr)
        else:
            k_ok = ks < K - k0
            a = tl.load(x_ptr, mask=k_ok, other=0.0).to(tl.float32)
            g = tl.load(g_ptr, mask=k_ok[None, :], other=0.0)
            u = tl.load(u_ptr, mask=k_ok[None, :], other=0.0)
        acc_g += g.to(tl.float32) * a[None, :]
        acc_u += u.to(tl.float32) * a[None, :]
        x_ptr += BLOCK_K
        g_ptr += BLOCK_K
        u_ptr += BLOCK_K
    gate, up = tl.sum(acc_g, axis=1), tl.sum(acc_u, axis=1)
    h = (gate * tl.sigmoid(gate) * up).to(X.dtype.element_ty).to(tl.float32) * weight
    # w2[e] is [K, N]: a tile of output columns (rows of w2) by this chunk of N, indexed by cols itself (not the
    # clamped col) so that Triton sees each row's run as contiguous and loads it in 16-byte vectors.
    w_ptr = W2 + e * K * N + (outs.to(tl.int64) * N)[:, None] + cols[None, :]
    for o0 in tl.range(0, K, BLOCK_N_DOWN, num_stages=STAGES):
        if EVEN_OUT:
            if EVEN_N:
                w = tl.load(w_ptr)
            else:
                w = tl.load(w_ptr, mask=col_ok[None, :], other=0.0)
            tl.store(y_row + o0 + outs, tl.sum(w.to(tl.float32) * h[None, :], axis=1))
        else:
            o_ok = o0 + outs < K
            w = tl.load(w_ptr, mask=o_ok[:, None] & col_ok[None, :], other=0.0)
            tl.store(y_row + o0 + outs, tl.sum(w.to(tl.float32) * h[None, :], axis=1), mask=o_ok)
        w_ptr += BLOCK_N_DOWN * N


@triton.jit
def _pair_sum_kernel(Y, OUT, parts, K, COLS: tl.constexpr, PARTS: tl.constexpr, PDL: tl.constexpr):
    dependent_start(PDL)  # waits for the pair programs' partials
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    rows = tl.arange(0, PARTS)
    total = tl.zeros([COLS], dtype=tl.float32)
    tile = Y + (token * parts + rows.to(tl.int64))[:, None] * K + cols[None, :]  # a token's partials: consecutive rows
    for p0 in range(0, parts, PARTS):
        y = tl.load(tile, mask=(rows < parts - p0)[:, None] & (cols < K)[None, :], other=0.0)
        total += tl.sum(y, axis=0)
        tile += PARTS * K
    tl.store(OUT + token * K + cols, total.to(OUT.dtype.element_ty), mask=cols < K)


def constexprs(K: int, N: int, topk: int, BLOCK_N: int, BLOCK_K: int, BLOCK_N_DOWN: int, num_stages: int | None,
               pdl: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The constexprs of :func:`_pair_mlp_kernel` and of :func:`_pair_sum_kernel` for this shape and config."""
    return ({"BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, "BLOCK_N_DOWN": BLOCK_N_DOWN, "EVEN_K": K % BLOCK_K == 0,
             "EVEN_N": N % BLOCK_N == 0, "EVEN_OUT": K % BLOCK_N_DOWN == 0, "PDL": pdl, "STAGES": num_stages or 3},
            {"COLS": SUM_COLS, "PARTS": min(SUM_PARTS, next_pow2(topk * triton.cdiv(N, BLOCK_N))), "PDL": pdl})


def bind_pair_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, shape: MoEArgs, BLOCK_N: int, BLOCK_K: int, BLOCK_N_DOWN: int,
                  num_warps: int | None, num_stages: int | None, pdl: bool) -> Launch:
    """Pair-path launcher ``run(x, w1, w2, topk_weights, topk_ids) -> out [M, K]`` for ``shape`` (checked by the
    caller), compiled here: two launches, programmatic dependents where ``pdl``. A call holds M * topk * cdiv(N,
    BLOCK_N) * K float32 partials, which is why the space offers the path to a few rows only."""
    (M, K, N, E, topk, x_stride), dtype, device = shape, x.dtype, x.device
    P, chunks = M * topk, triton.cdiv(N, BLOCK_N)

    def launch_args(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, tw: torch.Tensor,
                    ids: torch.Tensor) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        y = torch.empty((P, chunks, K), dtype=torch.float32, device=device)
        out = torch.empty((M, K), dtype=dtype, device=device)
        return (x, w1, w2, y, ids.view(-1), tw.view(-1), E, topk, x_stride, N, K), (y, out, topk * chunks, K)

    mlp_args, sum_args = launch_args(x, w1, w2, topk_weights, topk_ids)
    mlp_consts, sum_consts = constexprs(K, N, topk, BLOCK_N, BLOCK_K, BLOCK_N_DOWN, num_stages, pdl)
    mlp = compiled_launcher(_pair_mlp_kernel, (P, chunks), mlp_args, mlp_consts, hints(num_warps, num_stages, pdl=pdl),
                            device)
    total = compiled_launcher(_pair_sum_kernel, (M, triton.cdiv(K, SUM_COLS)), sum_args, sum_consts,
                              hints(num_warps=4, pdl=pdl), device)

    def run(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
            topk_ids: torch.Tensor) -> torch.Tensor:
        mlp_args, sum_args = launch_args(x, w1, w2, topk_weights, topk_ids)
        mlp(*mlp_args)
        total(*sum_args)
        return sum_args[1]

    return run
