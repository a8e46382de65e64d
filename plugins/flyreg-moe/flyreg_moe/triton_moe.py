"""The fused MoE on the GPU, bound once per call signature: :func:`bind_fused_moe`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton

from flyreg.triton import ALIGN, compiled_launcher, hints, interpreted, resolve_pdl

from . import decode, gemm_kernels as gk, pair_mlp, routing, space
from .checks import Launch, check_ids, check_knobs, check_moe, ids_checked

REDUCE_BLOCK = 1024  #: Columns a reduction program covers at most.


def tma_hardware(device: torch.device) -> bool:
    """Whether ``device`` has TMA: an NVIDIA GPU from Hopper (9.0) on, or the interpreter's CPU (it emulates TMA)."""
    return device.type != "cuda" or (torch.version.hip is None and torch.cuda.get_device_capability(device)[0] >= 9)


def _tma_aligned(w1: torch.Tensor, w2: torch.Tensor) -> bool:
    return (w1.data_ptr() | w2.data_ptr()) % ALIGN == 0


def _weight_descriptors(w1: torch.Tensor, w2: torch.Tensor, block_n: int, block_n_down: int,
                        block_k: int, one_dot: bool = False) -> tuple[Any, Any]:
    """Host-side tensor descriptors of the weights, as :mod:`.gemm_kernels` reads them with ``TMA``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    E, two_n, K = w1.shape
    gate_up = (TensorDescriptor.from_tensor(w1.view(E * 2, two_n // 2, K), [2, block_n, block_k]) if one_dot else
               TensorDescriptor.from_tensor(w1.view(E * two_n, K), [block_n, block_k]))
    return (gate_up,
            TensorDescriptor.from_tensor(w2.view(E * K, two_n // 2), [block_n_down, block_k]))


def bind_fused_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, *, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, GROUP_M: int, SPLIT_K: int,
                   TMA: bool = False, TAILS: int = 0, BLOCK_N_DOWN: int | None = None,
                   DECODE: bool = False, PAIR_MLP: bool = False, ONE_DOT: bool = False, MASK_PAD: bool = False,
                   num_warps: int | None = None, num_stages: int | None = None, pdl: bool | None = None) -> Launch:
    """Launcher ``run(x, w1, w2, topk_weights, topk_ids) -> out [M, K]`` for calls shaped like this one, with the knobs
    of :mod:`.space`, checked and compiled here: four launches (the routing, two GEMMs, the top-k reduction; five where
    the routing counts in a launch of its own) with grids from the shapes alone and no waits on the host, so a CUDA
    graph can capture a call. Each is a programmatic dependent where ``pdl`` (default: where
    :func:`flyreg.triton.pdl_supported`; True elsewhere is a ValueError): the first waits for the launch queued before
    the call, which must itself have waited if it was one. The ids' values are checked here, and on every call with
    ``FLYREG_MOE_CHECK_IDS=1`` (:func:`.checks.ids_checked`). ``TMA`` reads weight tiles by descriptors where
    :func:`.space.tma_fits` the shapes, the device has it (:func:`tma_hardware`) and a call's weights are 16-byte
    aligned (else pointer loads, compiled here too). ``DECODE``: the two launches of :mod:`.decode` on the BLOCK_ knobs
    (the others are checked and unused). ``PAIR_MLP``: the two launches of :mod:`.pair_mlp` on BLOCK_N, BLOCK_K and
    BLOCK_N_DOWN (the others are checked and unused). On the grouped path, two knobs no space offers yet (built to be
    timed, ``moe_knob_ab.py --set``): ``ONE_DOT`` computes GEMM 1's gate and up columns in one dot twice as wide,
    ``MASK_PAD`` has padding slots read nothing rather than row 0."""
    shape = M, K, N, E, topk, x_stride = check_moe(x, w1, w2, topk_weights, topk_ids)
    check_knobs(BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, TMA, TAILS, BLOCK_N_DOWN, DECODE, PAIR_MLP, ONE_DOT,
                MASK_PAD)
    check_ids(topk_ids, E)
    bn_down, dtype, device = BLOCK_N if BLOCK_N_DOWN is None else BLOCK_N_DOWN, x.dtype, x.device
    pdl = resolve_pdl(device, pdl)  # each launch waits for the one before it, whose last programs it overlaps
    if M == 0:
        return lambda x, w1, w2, topk_weights, topk_ids: torch.empty((0, K), dtype=dtype, device=device)
    if DECODE:
        return ids_checked(decode.bind_decode(x, w1, w2, topk_weights, topk_ids, shape, BLOCK_M, BLOCK_N, BLOCK_K,
                                              bn_down, num_warps, num_stages, pdl), E)
    if PAIR_MLP:
        return ids_checked(pair_mlp.bind_pair_mlp(x, w1, w2, topk_weights, topk_ids, shape, BLOCK_N, BLOCK_K, bn_down,
                                                  num_warps, num_stages, pdl), E)
    P, k_tiles, reduce_block = M * topk, triton.cdiv(N, BLOCK_K), min(REDUCE_BLOCK, space.next_pow2(K))
    plan = routing.RoutingPlan.of(P, E, BLOCK_M, TAILS)
    tiles_m, per_split = plan.tiles, triton.cdiv(k_tiles, max(1, min(SPLIT_K, k_tiles)))
    split = triton.cdiv(k_tiles, per_split)  # no split left without work
    consts = {"BLOCK_M": BLOCK_M, "BLOCK_K": BLOCK_K, "UPCAST": interpreted() and dtype == torch.bfloat16,
              "TAILS": TAILS, "PDL": pdl, "MASK_PAD": MASK_PAD}

    def launch_args(x: torch.Tensor, wa: Any, wb: Any, tw: torch.Tensor,
                    ids: torch.Tensor) -> tuple[tuple[Any, ...], ...]:
        # A call's fresh buffers, as the arguments of the routing, GEMM 1 (weights wa), GEMM 2 (wb) and the reduction.
        v, ids, h = plan.workspace(device), ids.view(-1), torch.empty((P, N), dtype=dtype, device=device)
        y = torch.empty((split, P, K), dtype=torch.float32 if split > 1 else dtype, device=device)
        out = torch.empty((M, K), dtype=dtype, device=device)
        return ((ids, v), (x, wa, h, v.sorted_ids, v.block_expert, v.table, P, tiles_m, GROUP_M, topk, x_stride, N, K),
                (h, wb, y, v.sorted_ids, v.block_expert, v.table, tw.view(-1), P, tiles_m, GROUP_M, split, per_split,
                 N, K), (y, ids, out, M, topk, split, E, K))

    routed, up, down, reduced = launch_args(x, w1, w2, topk_weights, topk_ids)
    route = plan.launcher(*routed, pdl=pdl)

    def gemms(tma: bool, wa: Any, wb: Any) -> tuple[Callable[..., None], Callable[..., None]]:
        # GEMM 1 and GEMM 2 launchers, with weight tiles by TMA (wa, wb: descriptors) or by pointers (w1, w2).
        return (compiled_launcher(gk._gate_up_kernel, (tiles_m * triton.cdiv(N, BLOCK_N),), (x, wa, *up[2:]),
                                  {**consts, "BLOCK_N": BLOCK_N, "EVEN_K": K % BLOCK_K == 0,
                                   "EVEN_N": N % BLOCK_N == 0, "TMA": tma, "ONE_DOT": ONE_DOT},
                                  hints(num_warps, num_stages, pdl), device),
                compiled_launcher(gk._down_kernel, (tiles_m * triton.cdiv(K, bn_down), split), (down[0], wb, *down[2:]),
                                  {**consts, "BLOCK_N": bn_down, "PARTIAL": split > 1, "EVEN_K": N % BLOCK_K == 0,
                                   "EVEN_N": K % bn_down == 0, "TMA": tma}, hints(num_warps, num_stages, pdl), device))

    tma = TMA and space.tma_fits(E, N, K, x.element_size()) and tma_hardware(device) and _tma_aligned(w1, w2)
    # Both are compiled here, so a later call whose weights TMA cannot read never compiles (in a graph capture, say).
    launchers = {False: gemms(False, w1, w2)}
    if tma:
        launchers[True] = gemms(True, *_weight_descriptors(w1, w2, BLOCK_N, bn_down, BLOCK_K, ONE_DOT))
    reduce = compiled_launcher(gk._reduce_kernel, (M, triton.cdiv(K, reduce_block)), reduced,
                               {"BLOCK": reduce_block, "TOPK_P2": space.next_pow2(topk), "PDL": pdl},
                               hints(num_warps=4, pdl=pdl), device)

    def run(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
            topk_ids: torch.Tensor) -> torch.Tensor:
        on = tma and _tma_aligned(w1, w2)
        weights = _weight_descriptors(w1, w2, BLOCK_N, bn_down, BLOCK_K, ONE_DOT) if on else (w1, w2)
        calls = launch_args(x, *weights, topk_weights, topk_ids)
        for launch, args in zip((route, *launchers[on], reduce), calls):
            launch(*args)
        return calls[3][2]  # the reduction's out

    return ids_checked(run, E)

