"""Probe: why a search and the bandwidth benchmark time the same RMSNorm config differently.

    python plugins/flyreg-rmsnorm/bench/weight_residency.py

Times configs four ways with the same replay: the benchmark's fresh inputs and one shared weight;
the same with a weight copy per set; copies of one call as a search makes them (x and the weight
cloned per set, as many sets as span twice the L2, at most 64); and those copies with one shared weight.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

from flyreg_rmsnorm_bench.rmsnorm_bandwidth import (EPS, bound, call_bytes, main_on_cuda, replay_calls,  # noqa: E402
                               rotating_inputs, steady_ms, weight_copies)

CASES = {"4096x1536": [(2048, 1, 4), (2048, 4, 16), (2048, 2, 8)], "4096x2048": [(2048, 1, 4), (2048, 4, 16)],
         "256x8192": [(8192, 1, 8), (8192, 2, 8)]}


def main() -> None:
    from flyreg import Config
    from flyreg_rmsnorm.ops import rmsnorm as plugin  # the op's plugin object, as its entry point names it

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rotate = 1 << (2 * l2 - 1).bit_length()  # twice the L2, rounded up to a power of two
    for shape, knobs in CASES.items():
        M, N = (int(v) for v in shape.split("x"))
        xs, _, w = rotating_inputs(M, N, torch.bfloat16)
        ws = weight_copies(w, len(xs))
        viewed = (xs[0].numel() + w.numel()) * xs[0].element_size()
        n = max(1, min(64, -(-rotate // viewed)))
        sets = [(xs[0], w)] + [(xs[0].clone(), w.clone()) for _ in range(n - 1)]
        spec = plugin.specialize((xs[0], w), {})
        print(f"== {shape}: {len(xs)} fresh sets, {n} search sets, default {plugin.default(spec)}")
        for bn, rows, nw in knobs:
            config = Config({"BLOCK_N": bn, "ROWS": rows}, num_warps=nw)
            b = bound(plugin, config, spec, xs[0], w)
            variants = {
                "fresh x, one w": [lambda x=x: b(x, w, EPS) for x in xs],
                "fresh x, w per set": [lambda x=x, v=v: b(x, v, EPS) for x, v in zip(xs, ws)],
                "search copies": [lambda x=x, v=v: b(x, v, EPS) for x, v in sets],
                "search x, one w": [lambda x=x: b(x, w, EPS) for x, _ in sets],
            }
            times: dict[str, list[float]] = {k: [] for k in variants}
            for r in range(3):
                for k in (variants if r % 2 == 0 else reversed(variants)):
                    fns = variants[k]
                    times[k].append(steady_ms(fns, replay_calls(call_bytes(xs[0]), len(fns)), 9))
            print(f"  {str(config):56s} " + "  ".join(f"{k}: {statistics.median(v) * 1e3:6.2f}"
                                                     for k, v in times.items()))


if __name__ == "__main__":
    main_on_cuda("weight_residency", main)
