"""The fused MoE on the GPU: routing, GEMM 1, GEMM 2 and the top-k reduction, bound once per call signature.

:func:`bind_fused_moe` checks a call, sizes every grid from the shapes alone (:func:`.routing.padded_rows`)
and compiles the kernels; the launcher it returns allocates the call's buffers and launches six
kernels (seven unfused), none of which waits on the host, so a CUDA graph can capture the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton

from flyreg.triton import compiled_launcher, hints, interpreted

from . import gemm_kernels as gk
from . import routing
from .checks import check_ids, check_moe

#: Columns a reduction (and an unfused SiLU-and-mul) program covers at most.
REDUCE_BLOCK = 1024
#: Knobs that must be powers of two, and their smallest values (tl.dot needs 16 rows, columns and depth).
POW2_KNOBS = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}


def check_knobs(BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, GROUP_M: int, SPLIT_K: int) -> None:
    """ValueError naming the first knob that is not a power of two of at least 16 (tile sizes) or >= 1."""
    for name, value in (("BLOCK_M", BLOCK_M), ("BLOCK_N", BLOCK_N), ("BLOCK_K", BLOCK_K)):
        if isinstance(value, bool) or not isinstance(value, int) or value < POW2_KNOBS[name] or value & (value - 1):
            raise ValueError(f"fused_moe: {name} must be a power of two >= {POW2_KNOBS[name]}, got {value!r}")
    for name, value in (("GROUP_M", GROUP_M), ("SPLIT_K", SPLIT_K)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"fused_moe: {name} must be an int >= 1, got {value!r}")


def _capturing(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _aligned(n: int) -> int:
    return -(-n // 16) * 16


def bind_fused_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, *, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, GROUP_M: int, SPLIT_K: int,
                   num_warps: int | None = None, num_stages: int | None = None,
                   fused_silu: bool = True) -> Callable[..., torch.Tensor]:
    """The launcher of calls shaped like this one: ``run(x, w1, w2, topk_weights, topk_ids) -> out [M, K]``.

    Checks the call (the ids' values too, unless a CUDA graph is being captured) and compiles here.
    ``fused_silu=False`` runs GEMM 1 over all 2N columns and SiLU-and-mul as a kernel of its own.
    """
    M, K, N, E, topk, x_stride = check_moe(x, w1, w2, topk_weights, topk_ids)
    check_knobs(BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K)
    if not _capturing(topk_ids):
        check_ids(topk_ids, E)
    dtype, device = x.dtype, x.device
    if M == 0:
        return lambda x, w1, w2, topk_weights, topk_ids: torch.empty((0, K), dtype=dtype, device=device)
    P = M * topk
    rows = routing.padded_rows(P, E, BLOCK_M)
    tiles_m = rows // BLOCK_M
    e_p2 = max(16, routing.next_pow2(E))
    chunk = routing.chunk_size(E)
    chunks = triton.cdiv(P, chunk)
    fill = triton.cdiv(rows, chunks)
    # One int32 workspace: sorted pair ids, the tiles' experts, the used rows, the chunk counts.
    at_expert = _aligned(rows)
    at_used = at_expert + _aligned(tiles_m)
    at_counts = at_used + 16
    ws_len = at_counts + chunks * e_p2
    width = N if fused_silu else 2 * N
    k_tiles = triton.cdiv(N, BLOCK_K)
    split = max(1, min(SPLIT_K, k_tiles))
    per_split = triton.cdiv(k_tiles, split)
    split = triton.cdiv(k_tiles, per_split)  # no split left without work
    partial = split > 1
    y_dtype = torch.float32 if partial else dtype
    reduce_block = min(REDUCE_BLOCK, routing.next_pow2(K))
    upcast = interpreted() and dtype == torch.bfloat16

    def buffers() -> tuple[torch.Tensor, ...]:
        ws = torch.empty(ws_len, dtype=torch.int32, device=device)
        gu = torch.empty((P, width), dtype=dtype, device=device)
        h = gu if fused_silu else torch.empty((P, N), dtype=dtype, device=device)
        y = torch.empty((split, P, K), dtype=y_dtype, device=device)
        return (ws[:rows], ws[at_expert:at_expert + tiles_m], ws[at_used:at_used + 1], ws[at_counts:], gu, h, y,
                torch.empty((M, K), dtype=dtype, device=device))

    s_ids, b_exp, used, counts, gu, h, y, out = buffers()
    ids, tw = topk_ids.view(-1), topk_weights.view(-1)
    plain = hints(num_warps=4)
    tile_hints = hints(num_warps, num_stages)
    count = compiled_launcher(routing._count_kernel, (chunks,), (ids, counts, s_ids, P, E, rows, fill),
                              {"CHUNK": chunk, "E_P2": e_p2, "FILL": routing.FILL_BLOCK}, plain, device)
    offsets = compiled_launcher(routing._offsets_kernel, (1,), (counts, b_exp, used, chunks, tiles_m, BLOCK_M),
                                {"E_P2": e_p2, "SCAN": routing.SCAN_ROWS, "LABEL": routing.LABEL_TILES}, plain,
                                device)
    scatter = compiled_launcher(routing._scatter_kernel, (chunks,), (ids, counts, s_ids, P, E),
                                {"CHUNK": chunk, "E_P2": e_p2}, plain, device)
    gate_up = compiled_launcher(
        gk._gate_up_kernel, (tiles_m * triton.cdiv(width, BLOCK_N),),
        (x, w1, gu, s_ids, b_exp, used, P, tiles_m, GROUP_M, topk, x_stride, N, K),
        {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, "FUSED": fused_silu,
         "EVEN_K": K % BLOCK_K == 0, "EVEN_N": width % BLOCK_N == 0, "UPCAST": upcast}, tile_hints, device)
    silu_mul = None if fused_silu else compiled_launcher(
        gk._silu_mul_kernel, (P, triton.cdiv(N, REDUCE_BLOCK)), (gu, h, P, N), {"BLOCK": REDUCE_BLOCK}, plain, device)
    down = compiled_launcher(
        gk._down_kernel, (tiles_m * triton.cdiv(K, BLOCK_N), split),
        (h, w2, y, s_ids, b_exp, used, tw, P, tiles_m, GROUP_M, split, per_split, N, K),
        {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, "PARTIAL": partial,
         "EVEN_K": N % BLOCK_K == 0, "EVEN_N": K % BLOCK_N == 0, "UPCAST": upcast}, tile_hints, device)
    reduce = compiled_launcher(gk._reduce_kernel, (M, triton.cdiv(K, reduce_block)), (y, ids, out, M, topk, split, E, K),
                               {"BLOCK": reduce_block}, plain, device)

    def run(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
            topk_ids: torch.Tensor) -> torch.Tensor:
        s_ids, b_exp, used, counts, gu, h, y, out = buffers()
        ids, tw = topk_ids.view(-1), topk_weights.view(-1)
        count(ids, counts, s_ids, P, E, rows, fill)
        offsets(counts, b_exp, used, chunks, tiles_m, BLOCK_M)
        scatter(ids, counts, s_ids, P, E)
        gate_up(x, w1, gu, s_ids, b_exp, used, P, tiles_m, GROUP_M, topk, x_stride, N, K)
        if silu_mul is not None:
            silu_mul(gu, h, P, N)
        down(h, w2, y, s_ids, b_exp, used, tw, P, tiles_m, GROUP_M, split, per_split, N, K)
        reduce(y, ids, out, M, topk, split, E, K)
        return out

    return run


def fused_moe_triton(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, **knobs: Any) -> torch.Tensor:
    """One call: :func:`bind_fused_moe` with these knobs and hints, then its launcher."""
    return bind_fused_moe(x, w1, w2, topk_weights, topk_ids, **knobs)(x, w1, w2, topk_weights, topk_ids)
