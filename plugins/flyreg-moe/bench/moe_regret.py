"""Budgeted local search against exhaustive search on fused-MoE specs: the winner's regret and each search's time.

For each spec, the exhaustive search (``effort="full"``, every config of the space) runs first and
writes its artifact to ``--out`` (so a ``flyreg tune`` into the same directory afterwards skips the
spec); then the budgeted local search (``effort="quick"``, at most 15 % of the space, ``--budget``
seconds before its final round) runs on the same inputs. Neither reads the tuning journal. The two
winners are then timed side by side, as ``moe_bench.py`` times (CUDA graph replays), in
``--rounds`` alternating pairs: regret = local winner's time / exhaustive winner's time - 1
(median over the pairs). The searches' wall times include binding (compiles) and the final round.

    python plugins/flyreg-moe/bench/moe_regret.py --out DIR [--budget 2] [--json regret.json] [--only MODEL:M]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

import flyreg
from flyreg_moe import triton_moe
from flyreg_moe.ops import MODEL_SHAPES, make_moe_inputs

from flyreg_moe_bench.moe_bench import time_ms

#: (model, M): spaces of 122 to 244 configs, so the exhaustive search stays affordable.
SPECS = [("Mixtral-8x7B", 1), ("Mixtral-8x7B", 2), ("Qwen3-30B-A3B", 1), ("DeepSeek-V2-Lite", 1),
         ("gpt-oss-20b", 1), ("gpt-oss-20b", 2)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="artifact dir for the exhaustive winners")
    p.add_argument("--budget", type=float, default=2.0, help="seconds the local search may take before its final round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    p.add_argument("--only", action="append", default=[], metavar="MODEL:M",
                   help="run only these specs of the sample (repeatable), e.g. gpt-oss-20b:1")
    a = p.parse_args()
    sample = {f"{name}:{M}" for name, M in SPECS}
    for want in a.only:
        if want not in sample:
            p.error(f"--only {want}: not a spec of the sample ({', '.join(f'{n}:{m}' for n, m in SPECS)})")
    specs = [(name, M) for name, M in SPECS if not a.only or f"{name}:{M}" in a.only]
    op = flyreg.op("fused_moe")
    rows: list[dict[str, Any]] = []
    for name, M in specs:
        E, K, N, topk = MODEL_SHAPES[name]
        args = make_moe_inputs(M, E, N, K, topk, torch.bfloat16, "cuda")
        t0 = time.perf_counter()
        full = op.tune(*args, out_dir=a.out, search_options={"effort": "full", "resume": False})
        full_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        local = op.tune(*args, emit=False, search_options={"effort": "quick", "budget_s": a.budget, "resume": False})
        local_s = time.perf_counter() - t0
        runs = {k: triton_moe.bind_fused_moe(*args, **r.winner.kwargs, **r.winner.hints)
                for k, r in (("full", full), ("local", local))}
        ratios = []
        for i in range(a.rounds):
            order = ("full", "local") if i % 2 == 0 else ("local", "full")
            t = {k: time_ms(lambda k=k: runs[k](*args), 7)[0] for k in order}
            ratios.append(t["local"] / t["full"])
        row = {"model": name, "M": M, "space": full.tried, "full_s": full_s, "local_s": local_s,
               "local_tried": local.tried, "full_winner": str(full.winner), "local_winner": str(local.winner),
               "regret": statistics.median(ratios) - 1, "full_winner_ms": full.winner_ms}
        rows.append(row)
        print(f"{name} M={M}: exhaustive {full.tried} configs in {full_s:.1f}s, local {local.tried} in {local_s:.1f}s, "
              f"regret {row['regret']:+.2%} ({full.winner} vs {local.winner})", flush=True)
        if a.json:
            with open(a.json, "w", encoding="utf-8") as f:
                json.dump(rows, f, indent=1)
    print(f"total: exhaustive {sum(r['full_s'] for r in rows):.1f}s, local {sum(r['local_s'] for r in rows):.1f}s, "
          f"worst regret {max(r['regret'] for r in rows):+.2%}", flush=True)


if __name__ == "__main__":
    main()
