"""Fused-MoE variants on a GPU: the default config against split-K, unfused SiLU-and-mul and a seeded sample of the space.

For each probed (model, M): the default config's time; the default with GEMM 2 split 1, 2, 4 and 8
ways; the default with SiLU-and-mul as a kernel of its own (GEMM 1 over all 2N columns); and
``--sample`` configs drawn (seeded) from the spec's space. Candidates are compiled on a thread pool
first (the wall time is printed), then timed one at a time as ``moe_bench.py`` times (CUDA graph
replays). Rows go to ``--json``.

    python plugins/flyreg-moe/bench/moe_variants.py [--sample 12] [--json variants.json]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from flyreg.plugin import Config
from flyreg_moe import space, triton_moe
from flyreg_moe.cpu import fused_moe_reference
from flyreg_moe.ops import MODEL_SHAPES, make_moe_inputs

from flyreg_moe_bench.moe_bench import rel_err, time_ms

PROBES = {"Mixtral-8x7B": (1, 1024, 8192), "Qwen3-30B-A3B": (1, 64, 1024), "DeepSeek-V2-Lite": (16,),
          "gpt-oss-20b": (1, 4096)}


def candidates(spec: dict[str, Any], sample: int, seed: int) -> list[tuple[str, Config, bool]]:
    """(label, config, fused SiLU) to time for ``spec``."""
    d = space.triton_default(spec)
    out = [("default", d, True), ("default unfused", d, False)]
    for s in (1, 2, 4, 8):
        if s != d.kwargs["SPLIT_K"]:
            out.append((f"default SPLIT_K={s}", Config({**d.kwargs, "SPLIT_K": s}, **d.hints), True))
    pool = space.triton_configs(spec)
    for c in random.Random(seed).sample(pool, min(sample, len(pool))):
        out.append(("sample", c, True))
    return out


def probe(name: str, M: int, sample: int, reps: int) -> list[dict[str, Any]]:
    E, K, N, topk = MODEL_SHAPES[name]
    spec = {"E": E, "K": K, "M": M, "N": N, "topk": topk}
    args = make_moe_inputs(M, E, N, K, topk, torch.bfloat16, "cuda")
    ref = fused_moe_reference(*args)
    cands = candidates(spec, sample, seed=M)

    def bind(c: tuple[str, Config, bool]) -> Any:
        try:
            return triton_moe.bind_fused_moe(*args, **c[1].kwargs, **c[1].hints, fused_silu=c[2])
        except Exception as e:  # a config that does not compile (shared memory, say) is reported, not fatal
            return e

    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        runs = list(pool.map(bind, cands))
    compile_s = time.perf_counter() - t0
    rows = []
    for (label, config, fused), run in zip(cands, runs):
        row = {"model": name, "M": M, "label": label, "config": str(config), "fused": fused,
               "space": len(space.triton_configs(spec)), "compile_s": compile_s}
        if isinstance(run, Exception):
            row["error"] = f"{type(run).__name__}: {run}"[:300]
        else:
            row["rel_err"] = rel_err(run(*args), ref)
            row["ms"], _ = time_ms(lambda: run(*args), reps)
            row["tflops"] = 6 * M * topk * N * K / row["ms"] / 1e9
        rows.append(row)
    del args, ref, runs
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sample", type=int, default=12)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    rows: list[dict[str, Any]] = []
    for name, ms in PROBES.items():
        for M in ms:
            got = probe(name, M, a.sample, a.reps)
            rows.extend(got)
            timed = [r for r in got if "ms" in r]
            best = min(timed, key=lambda r: r["ms"])
            d = next(r for r in timed if r["label"] == "default")
            print(f"{name} M={M}: space {got[0]['space']}, compile {got[0]['compile_s']:.1f}s, "
                  f"default {d['ms'] * 1e3:.1f}us {d['tflops']:.0f} TF/s, best {best['ms'] * 1e3:.1f}us "
                  f"({best['label']} {best['config']}, {d['ms'] / best['ms']:.2f}x)", flush=True)
            for r in got:
                print(f"   {r['label']:<20} {r['config']:<90} "
                      + (f"{r['ms'] * 1e3:9.1f}us err {r['rel_err']:.4f}" if "ms" in r else r["error"]), flush=True)
            if a.json:
                with open(a.json, "w", encoding="utf-8") as f:
                    json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
