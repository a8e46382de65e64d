"""The fused MoE in plain torch (the CPU backend), and the float32 reference.

Knob ``EXPERT_GROUP``: experts computed per step, each step's runs of rows padded to its longest and both GEMMs run
as batched matmuls (one expert a step pads nothing but dispatches E times). As on Triton, the GEMMs and the top-k sum
accumulate in float32 and SiLU-and-mul is rounded once to x's dtype (here all in float32: bf16 CPU matmuls are slow)."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from .checks import check_ids, check_moe


@torch.no_grad()
def fused_moe_cpu(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, *, EXPERT_GROUP: int) -> torch.Tensor:
    """``out[m] = sum_j topk_weights[m, j] * w2[e] @ (silu(w1[e, :N] @ x[m]) * (w1[e, N:] @ x[m]))``, e = topk_ids[m, j]."""
    M, K, N, E, topk, _ = check_moe(x, w1, w2, topk_weights, topk_ids)
    if isinstance(EXPERT_GROUP, bool) or not isinstance(EXPERT_GROUP, int) or EXPERT_GROUP < 1:
        raise ValueError(f"fused_moe: EXPERT_GROUP must be a positive int, got {EXPERT_GROUP!r}")
    check_ids(topk_ids, E)
    acc = torch.zeros((M, K), dtype=torch.float32, device=x.device)
    experts = topk_ids.reshape(-1).long()
    order = torch.argsort(experts, stable=True)  # pairs grouped by expert
    counts = torch.bincount(experts, minlength=E).tolist()
    starts, weights = [0, *itertools.accumulate(counts)], topk_weights.reshape(-1)
    for g0 in range(0, E, EXPERT_GROUP):
        group = [e for e in range(g0, min(g0 + EXPERT_GROUP, E)) if counts[e]]
        if not group:
            continue
        run = max(counts[e] for e in group)
        # [G, run] pair indices; padding repeats the run's first pair and is dropped below.
        pairs = torch.stack([F.pad(order[starts[e]:starts[e + 1]], (0, run - counts[e]), value=int(order[starts[e]]))
                             for e in group])
        idx = torch.tensor(group, device=x.device)
        h = torch.bmm(x[pairs // topk].float(), w1[idx].float().transpose(1, 2))
        act = (F.silu(h[..., :N]) * h[..., N:]).to(x.dtype).float()
        y = torch.bmm(act, w2[idx].float().transpose(1, 2)) * weights[pairs].unsqueeze(-1)
        keep = torch.arange(run, device=x.device)[None, :] < torch.tensor([counts[e] for e in group])[:, None]
        acc.index_add_(0, (pairs // topk)[keep], y[keep])
    return acc.to(x.dtype)


@torch.no_grad()
def fused_moe_reference(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor) -> torch.Tensor:
    """The result in float32 from the float32 inputs, with no intermediate rounding (the correctness gate's)."""
    M, K, N, E, topk, _ = check_moe(x, w1, w2, topk_weights, topk_ids)
    out = torch.zeros((M, K), dtype=torch.float32, device=x.device)
    for e in torch.unique(topk_ids).tolist():
        rows, slots = (topk_ids == e).nonzero(as_tuple=True)
        h = x[rows].float() @ w1[e].float().T
        y = (F.silu(h[:, :N]) * h[:, N:]) @ w2[e].float().T
        out.index_add_(0, rows, y * topk_weights[rows, slots].unsqueeze(1))
    return out
