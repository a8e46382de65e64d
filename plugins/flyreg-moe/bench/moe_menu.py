"""Times a fixed menu of tile configs on every shipped fused-MoE workload: the data behind the no-search default.

For each model shape and M bucket, each menu tile (``MENU``) that the spec's space offers is timed
twice with GEMM 2 unsplit and, where the default would split it, split as the default splits
(``space.default_split``), in two rounds of rotating order, as ``moe_bench.py`` times (CUDA-graph
replays, median); the row keeps the median of the rounds. Also times the spec's current default
and the config lookup serves. ``--knobs`` times each menu tile again with each given set of knobs
(``--knobs TMA=true TMA=true,TAILS=2``), where the spec's space offers it (a set the space never
offers, such as ``TMA=false``, adds nothing).

    python plugins/flyreg-moe/bench/moe_menu.py [--shapes NAME ...] [--M 1 2 ...] [--knobs SET ...]
        --json menu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch

import flyreg
from flyreg.plugin import Config, Device
from flyreg_moe import space, triton_moe
from flyreg_moe.ops import MODEL_SHAPES, make_moe_inputs

from flyreg_moe_bench.moe_bench import timed_in_rounds
from flyreg_moe_bench.moe_knob_ab import check_knob, knob

#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, GROUP_M): the tiles that won somewhere on the H200
#: (the last four: the winners at 32 and 64 rows an expert once tails were offered).
MENU = [(16, 64, 128, 4, 4, 1), (16, 128, 128, 4, 3, 1), (32, 64, 128, 4, 4, 8), (32, 128, 64, 4, 4, 16),
        (32, 128, 64, 4, 3, 16), (64, 128, 64, 8, 4, 4), (64, 128, 64, 4, 5, 16), (64, 128, 64, 4, 4, 16),
        (64, 256, 64, 8, 3, 1), (64, 256, 64, 8, 4, 4), (128, 128, 64, 8, 3, 8), (128, 128, 64, 8, 4, 8),
        (128, 256, 64, 8, 3, 8), (128, 128, 64, 4, 4, 8), (32, 128, 128, 4, 2, 4), (32, 128, 128, 4, 3, 4),
        (64, 128, 64, 4, 4, 1), (64, 128, 64, 8, 5, 16)]


def knob_set(text: str) -> dict[str, Any]:
    """``NAME=VALUE,...`` with each VALUE parsed as JSON (``TMA=true,TAILS=2``), each NAME once."""
    pairs = [knob(part) for part in text.split(",")]
    names = [name for name, _ in pairs]
    if len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"a knob set names each knob once, got {text!r}")
    return dict(pairs)


def menu_configs(spec: dict[str, Any], knob_sets: Sequence[Mapping[str, Any]] = ()) -> list[Config]:
    """The menu's tiles the space of ``spec`` offers, unsplit and split as the default splits, each also
    with every set of ``knob_sets`` the space offers it with."""
    offered = set(space.triton_configs(spec))
    out: list[Config] = []
    for bm, bn, bk, warps, stages, group in MENU:
        for extra in ({}, *knob_sets):
            for split in sorted({1, space.default_split(spec, bm, bn, bk, extra.get("BLOCK_N_DOWN"))}):
                c = Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "SPLIT_K": split,
                            **extra}, num_warps=warps, num_stages=stages)
                if c in offered and c not in out:
                    out.append(c)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=list(MODEL_SHAPES), choices=list(MODEL_SHAPES))
    p.add_argument("--M", nargs="*", type=int, default=list(space.M_BUCKETS))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--knobs", nargs="*", type=knob_set, default=[], help="NAME=VALUE,... sets, e.g. TMA=true,TAILS=2")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    for extra in a.knobs:
        for name, value in extra.items():
            check_knob(name, value, "--knobs")
    rows: list[dict[str, Any]] = []
    for name in a.shapes:
        E, K, N, topk = MODEL_SHAPES[name]
        for M in a.M:
            spec = {"E": E, "K": K, "M": M, "N": N, "backend": "triton", "dtype": "bfloat16", "topk": topk}
            args = make_moe_inputs(M, E, N, K, topk, torch.bfloat16, "cuda")
            configs = menu_configs(spec, a.knobs)
            served = flyreg.resolve_spec("fused_moe", spec, "cuda").config
            default = space.triton_default(spec, Device.of("cuda"))
            configs += [c for c in dict.fromkeys((default, served)) if c not in configs]
            runs = {c: triton_moe.bind_fused_moe(*args, **c.kwargs, **c.hints) for c in configs}
            times, _ = timed_in_rounds({c: (lambda c=c: runs[c](*args)) for c in configs}, 2, a.reps)
            ms = {c: statistics.median(t) for c, t in times.items()}
            best = min(ms.values())
            rows.append({"model": name, "M": M, "E": E, "K": K, "N": N, "topk": topk,
                         "served": served.to_json(), "default": default.to_json(),
                         "times": [{"config": c.to_json(), "ms": t} for c, t in ms.items()]})
            print(f"{name} M={M}: {len(configs)} configs, best {best * 1e3:.1f} us, default {ms[default] / best:.3f}x, "
                  f"served {ms[served] / best:.3f}x", flush=True)
            with open(a.json, "w", encoding="utf-8") as f:
                json.dump(rows, f, indent=1)
            runs.clear()
            args = ()  # the cell's weights go before the next cell's are made
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
