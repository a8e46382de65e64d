"""Does a search rank RMSNorm configs as the bandwidth benchmark does? Its regret, shape by shape.

    python plugins/flyreg-rmsnorm/bench/search_agreement.py [--shapes 4096x3584 4096x7168 ...] [--searches 2] [--tie-band 0.005]
        [--shared-weight]

For each bf16 shape it runs ``--searches`` forced searches of ``rmsnorm`` (the tuner as
configured: steady timing, its tie band), then times every candidate the way
``rmsnorm_bandwidth.py`` does (512 MB of rotating inputs with a weight copy each, 50 calls a
replay or 200 at 16 MB or less, median of ``--reps`` replays). It prints each candidate's search time(s) and benchmark time, and the
regret of each search: the benchmark time of the config it picked over the best benchmark time.
``--tie-band`` sets the searching tuner's tie band (a tuner of the plugin's hooks and record, as the
registry builds one); ``--shared-weight`` times the benchmark side with one weight for every call, as
``rmsnorm_bandwidth.py`` did before session 6. (Session 6 also varied the search's replay length and
rotation bytes, flyreg internals this script no longer reaches.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from flyreg_rmsnorm_bench.rmsnorm_bandwidth import (EPS, bound, call_bytes, main_on_cuda, replay_calls,  # noqa: E402
                               rotating_inputs, steady_ms, weight_copies)

SHAPES = ("4096x1536", "4096x2048", "4096x3584", "4096x7168", "4096x8192", "32768x1024", "256x8192")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="MxN, bf16")
    ap.add_argument("--searches", type=int, default=2)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--tie-band", type=float, default=None)
    ap.add_argument("--shared-weight", action="store_true",
                    help="time the benchmark side with one weight for every call, not a copy per set")
    args = ap.parse_args()
    import flyreg
    from flyreg import Config
    from flyreg_rmsnorm.ops import rmsnorm as plugin  # the op's plugin object, as its entry point names it

    record = plugin.describe()
    for shape in args.shapes:
        M, N = (int(v) for v in shape.lower().split("x"))
        xs, _, w = rotating_inputs(M, N, torch.bfloat16)
        ws = weight_copies(w, len(xs), args.shared_weight)
        tuner = flyreg.op("rmsnorm")
        if args.tie_band is not None:
            tuner = flyreg.autotune_builder(
                "rmsnorm", plugin.build, lambda *a, **k: plugin.specialize(a, k), plugin.configs, plugin.default,
                structural=record.structural, arg_names=record.arg_names, reference=plugin.reference,
                timing=record.timing, tie_band=args.tie_band)
        reports = [tuner.tune(xs[0], w, EPS, emit=False) for _ in range(args.searches)]
        spec = plugin.specialize((xs[0], w), {})
        default = plugin.default(spec)
        bench: dict[Config, float] = {}
        for config, _ in reports[0].timings:
            launch = bound(plugin, config, spec, xs[0], w)
            calls = replay_calls(call_bytes(xs[0]), len(xs))
            bench[config] = steady_ms([lambda x=x, v=v, b=launch: b(x, v, EPS) for x, v in zip(xs, ws)], calls,
                                      args.reps)
        best = min(bench.values())
        searched = [{c: r.median for c, r in rep.timings} for rep in reports]
        print(f"\n== M={M} N={N}: {len(bench)} candidates, {len(xs)} benchmark sets")
        print(f"  {'config':58s} {'bench us':>8s} " + " ".join(f"{'search' + str(i):>8s}" for i in range(len(reports))))
        for c in sorted(bench, key=bench.get):
            marks = "".join("*" if rep.winner == c else " " for rep in reports) + ("d" if c == default else " ")
            print(f"  {str(c):58s} {bench[c] * 1e3:8.2f} "
                  + " ".join(f"{s[c] * 1e3:8.2f}" if c in s else f"{'-':>8s}" for s in searched)
                  + f"  {marks}")
        for i, rep in enumerate(reports):
            res = dict(rep.timings)
            fastest = min(res, key=lambda c: res[c].median)
            regret = lambda c: f"{bench[c] / best:.4f}" if c in bench else "-"  # noqa: E731
            spread = lambda c: f"{res[c].p20 * 1e3:.2f}-{res[c].p80 * 1e3:.2f} us" if c in res else "-"  # noqa: E731
            print(f"  search {i}: picked {rep.winner}, regret {regret(rep.winner)}; default regret "
                  f"{regret(default)}; fastest {fastest} p20-p80 {spread(fastest)}, default {spread(default)}")


if __name__ == "__main__":
    main_on_cuda("search_agreement", main)
