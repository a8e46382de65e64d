"""The fused MoE on the GPU, bound once per call signature: :func:`bind_fused_moe` checks a call, sizes every grid
from the shapes alone (:class:`.routing.RoutingPlan`) and compiles the kernels; its launcher allocates the
call's buffers and launches six kernels (three of routing, GEMM 1, GEMM 2, the top-k reduction), none of which
waits on the host, so a CUDA graph can capture the call; with the knob ``DECODE``, the two of :mod:`.decode`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton

from flyreg.triton import ALIGN, compiled_launcher, hints, interpreted

from . import gemm_kernels as gk
from . import decode, routing, space
from .checks import check_ids, check_ids_every_call, check_moe

#: Columns a reduction program covers at most.
REDUCE_BLOCK = 1024
#: The least tile size (tl.dot needs 16 rows, columns and depth).
MIN_TILE = 16


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_knobs(BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, GROUP_M: int, SPLIT_K: int, TMA: bool = False,
                TAILS: int = 0, BLOCK_N_DOWN: int | None = None, DECODE: bool = False) -> None:
    """ValueError naming the first knob that is not a power of two >= 16 (tile sizes; BLOCK_N_DOWN may be None),
    an int >= 1 (GROUP_M, SPLIT_K), a bool (TMA, DECODE), or 0, 1 or 2 with BLOCK_M >> TAILS >= 16 (TAILS)."""
    for name, value in (("BLOCK_M", BLOCK_M), ("BLOCK_N", BLOCK_N), ("BLOCK_K", BLOCK_K),
                        ("BLOCK_N_DOWN", BLOCK_N if BLOCK_N_DOWN is None else BLOCK_N_DOWN)):
        if not _int(value) or value < MIN_TILE or value & (value - 1):
            raise ValueError(f"fused_moe: {name} must be a power of two >= {MIN_TILE}, got {value!r}")
    for name, value in (("GROUP_M", GROUP_M), ("SPLIT_K", SPLIT_K)):
        if not _int(value) or value < 1:
            raise ValueError(f"fused_moe: {name} must be an int >= 1, got {value!r}")
    for name, flag in (("TMA", TMA), ("DECODE", DECODE)):
        if not isinstance(flag, bool):
            raise ValueError(f"fused_moe: {name} must be a bool, got {flag!r}")
    if not _int(TAILS) or TAILS not in space.TAILS or BLOCK_M >> TAILS < MIN_TILE:
        raise ValueError(f"fused_moe: TAILS must be 0, 1 or 2 with BLOCK_M >> TAILS >= {MIN_TILE}, "
                         f"got TAILS={TAILS!r} with BLOCK_M={BLOCK_M}")


def _capturing(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def tma_hardware(device: torch.device) -> bool:
    """Whether TMA can read weight tiles on ``device``: an NVIDIA GPU of compute capability 9.0 or later
    (Hopper), or the interpreter's CPU tensors (it emulates the descriptors)."""
    if device.type != "cuda":
        return True
    return torch.version.hip is None and torch.cuda.get_device_capability(device)[0] >= 9


def _tma_aligned(w1: torch.Tensor, w2: torch.Tensor) -> bool:
    return (w1.data_ptr() | w2.data_ptr()) % ALIGN == 0


def _weight_descriptors(w1: torch.Tensor, w2: torch.Tensor, block_n: int, block_n_down: int,
                        block_k: int) -> tuple[Any, Any]:
    """Host-side tensor descriptors of w1 as [E * 2N, K] rows in [block_n, block_k] blocks and of w2 as
    [E * K, N] rows in [block_n_down, block_k] blocks."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    E, two_n, K = w1.shape
    return (TensorDescriptor.from_tensor(w1.view(E * two_n, K), [block_n, block_k]),
            TensorDescriptor.from_tensor(w2.view(E * K, two_n // 2), [block_n_down, block_k]))


def bind_fused_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, *, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, GROUP_M: int, SPLIT_K: int,
                   TMA: bool = False, TAILS: int = 0, BLOCK_N_DOWN: int | None = None,
                   DECODE: bool = False, num_warps: int | None = None,
                   num_stages: int | None = None) -> Callable[..., torch.Tensor]:
    """The launcher of calls shaped like this one, ``run(x, w1, w2, topk_weights, topk_ids) -> out [M, K]``, with
    the knobs :mod:`.space` describes, checked and compiled here. The ids' values are checked here outside CUDA-graph
    capture, and on every such call with ``FLYREG_MOE_CHECK_IDS=1`` (:func:`.checks.check_ids_every_call`).
    ``TMA`` reads the weight tiles by descriptors where :func:`.space.tma_fits` the shapes, the device has TMA
    (:func:`tma_hardware`) and a call's weights are 16-byte aligned (the others take pointer loads, compiled here
    too). ``DECODE`` takes BLOCK_M, BLOCK_N, BLOCK_N_DOWN and BLOCK_K; the other knobs are checked and unused."""
    M, K, N, E, topk, x_stride = check_moe(x, w1, w2, topk_weights, topk_ids)
    check_knobs(BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, TMA, TAILS, BLOCK_N_DOWN, DECODE)
    bn_down = BLOCK_N if BLOCK_N_DOWN is None else BLOCK_N_DOWN
    if not _capturing(topk_ids):
        check_ids(topk_ids, E)
    dtype, device = x.dtype, x.device
    if M == 0:
        return lambda x, w1, w2, topk_weights, topk_ids: torch.empty((0, K), dtype=dtype, device=device)
    if DECODE:
        run = decode.bind_decode(x, w1, w2, topk_weights, topk_ids, M=M, K=K, N=N, E=E, topk=topk, x_stride=x_stride,
                                 BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, BLOCK_N_DOWN=bn_down,
                                 num_warps=num_warps, num_stages=num_stages)
        return _checked(run, E) if check_ids_every_call() else run
    P = M * topk
    plan = routing.RoutingPlan.of(P, E, BLOCK_M, TAILS)
    tiles_m, k_tiles = plan.tiles, triton.cdiv(N, BLOCK_K)
    per_split = triton.cdiv(k_tiles, max(1, min(SPLIT_K, k_tiles)))
    split = triton.cdiv(k_tiles, per_split)  # no split left without work
    reduce_block = min(REDUCE_BLOCK, routing.next_pow2(K))
    consts = {"BLOCK_M": BLOCK_M, "BLOCK_K": BLOCK_K, "UPCAST": interpreted() and dtype == torch.bfloat16,
              "TAILS": TAILS}
    tile_hints = hints(num_warps, num_stages)

    def launch_args(x: torch.Tensor, wa: Any, wb: Any, tw: torch.Tensor,
                    ids: torch.Tensor) -> tuple[tuple[Any, ...], ...]:
        # A call's fresh buffers, as the arguments of the routing, GEMM 1 (weights wa), GEMM 2 (wb) and the reduction.
        v, ids = plan.workspace(device), ids.view(-1)
        h = torch.empty((P, N), dtype=dtype, device=device)
        y = torch.empty((split, P, K), dtype=torch.float32 if split > 1 else dtype, device=device)
        out = torch.empty((M, K), dtype=dtype, device=device)
        return ((ids, v), (x, wa, h, v.sorted_ids, v.block_expert, v.table, P, tiles_m, GROUP_M, topk, x_stride, N, K),
                (h, wb, y, v.sorted_ids, v.block_expert, v.table, tw.view(-1), P, tiles_m, GROUP_M, split, per_split,
                 N, K), (y, ids, out, M, topk, split, E, K))

    routed, up, down, reduced = launch_args(x, w1, w2, topk_weights, topk_ids)
    route = plan.launcher(*routed)

    def gemms(tma: bool, wa: Any, wb: Any) -> tuple[Callable[..., None], Callable[..., None]]:
        # GEMM 1 and GEMM 2 launchers, with weight tiles by TMA (wa, wb: descriptors) or by pointers (w1, w2).
        return (compiled_launcher(gk._gate_up_kernel, (tiles_m * triton.cdiv(N, BLOCK_N),), (x, wa, *up[2:]),
                                  {**consts, "BLOCK_N": BLOCK_N, "EVEN_K": K % BLOCK_K == 0,
                                   "EVEN_N": N % BLOCK_N == 0, "TMA": tma}, tile_hints, device),
                compiled_launcher(gk._down_kernel, (tiles_m * triton.cdiv(K, bn_down), split), (down[0], wb, *down[2:]),
                                  {**consts, "BLOCK_N": bn_down, "PARTIAL": split > 1, "EVEN_K": N % BLOCK_K == 0,
                                   "EVEN_N": K % bn_down == 0, "TMA": tma}, tile_hints, device))

    tma = TMA and space.tma_fits(E, N, K, x.element_size()) and tma_hardware(device) and _tma_aligned(w1, w2)
    # Both are compiled here, so a later call whose weights TMA cannot read never compiles (in a graph capture, say).
    launchers = {False: gemms(False, w1, w2)}
    if tma:
        launchers[True] = gemms(True, *_weight_descriptors(w1, w2, BLOCK_N, bn_down, BLOCK_K))
    reduce = compiled_launcher(gk._reduce_kernel, (M, triton.cdiv(K, reduce_block)), reduced, {"BLOCK": reduce_block},
                               hints(num_warps=4), device)

    def run(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
            topk_ids: torch.Tensor) -> torch.Tensor:
        on = tma and _tma_aligned(w1, w2)
        weights = _weight_descriptors(w1, w2, BLOCK_N, bn_down, BLOCK_K) if on else (w1, w2)
        routed, up, down, reduced = launch_args(x, *weights, topk_weights, topk_ids)
        gate_up_kernel, down_kernel = launchers[on]
        route(*routed)
        gate_up_kernel(*up)
        down_kernel(*down)
        reduce(*reduced)
        return reduced[2]

    return _checked(run, E) if check_ids_every_call() else run


def _checked(run: Callable[..., torch.Tensor], E: int) -> Callable[..., torch.Tensor]:
    """``run`` checking the ids' values on every call outside CUDA-graph capture (a sync a call)."""

    def checked(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
        if not _capturing(topk_ids):
            check_ids(topk_ids, E)
        return run(x, w1, w2, topk_weights, topk_ids)

    return checked


def fused_moe_triton(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, **knobs: Any) -> torch.Tensor:
    """One call: :func:`bind_fused_moe` with these knobs and hints, then its launcher."""
    return bind_fused_moe(x, w1, w2, topk_weights, topk_ids, **knobs)(x, w1, w2, topk_weights, topk_ids)
