"""The share of the rows the fused MoE's GEMMs compute that are real pairs, by row tile and tail tiles, on the CPU.

For each model shape and M, routings drawn as ``make_moe_inputs`` draws them (top-k of random logits,
seeds 0 to ``--seeds`` - 1) give each expert's pair count; an expert's run is cut into tiles of
BLOCK_M rows, and its last tile computes BLOCK_M rows, or with ``TAILS=t`` the smallest of
BLOCK_M >> t, ..., BLOCK_M that covers what is left. Printed: real pairs over computed rows, the
mean over the routings. It counts rows, not time: a tail tile still reads a whole weight tile.

    python plugins/flyreg-moe/bench/moe_padding.py [--M 256 512 1024 2048 4096] [--seeds 8]
"""

from __future__ import annotations

import argparse

import torch

from flyreg_moe.ops import MODEL_SHAPES

#: (BLOCK_M, TAILS) columns of the table.
TILINGS = ((128, 0), (128, 1), (128, 2), (64, 0), (64, 2))


def computed_rows(counts: list[int], block_m: int, tails: int) -> int:
    rows = 0
    for c in counts:
        full, rest = divmod(c, block_m)
        rows += full * block_m
        if rest:
            path = block_m >> tails
            while path < rest:
                path *= 2
            rows += path
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--M", nargs="*", type=int, default=[256, 512, 1024, 2048, 4096])
    p.add_argument("--seeds", type=int, default=8)
    a = p.parse_args()
    print("model | M | rows an expert | " + " | ".join(f"{bm} rows, TAILS={t}" for bm, t in TILINGS))
    for name, (E, K, N, topk) in MODEL_SHAPES.items():
        for M in a.M:
            shares = []
            for seed in range(a.seeds):
                logits = torch.randn((M, E), generator=torch.Generator().manual_seed(seed))
                counts = torch.bincount(torch.topk(logits, topk, dim=1).indices.flatten(), minlength=E).tolist()
                shares.append([M * topk / computed_rows(counts, bm, t) for bm, t in TILINGS])
            mean = [sum(col) / len(col) for col in zip(*shares)]
            print(f"{name} | {M} | {M * topk / E:.0f} | " + " | ".join(f"{v:.3f}" for v in mean))


if __name__ == "__main__":
    main()
