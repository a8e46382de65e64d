"""The fused-MoE table of docs/performance.md and the issue's target lines, from ``moe_bench.py``'s JSON.

    python plugins/flyreg-moe/bench/moe_table.py plugins/flyreg-moe/bench/results/moe_bench_bf16.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

#: Models whose M >= 2048 cells must reach DENSE_SHARE of the dense bound.
DENSE_MODELS = ("Mixtral-8x7B", "gpt-oss-20b")
DENSE_SHARE = 0.6
#: At most this M, flyreg must be at least as fast as torch; above it, at least ABOVE_SHARE of it.
SMALL_M = 1024
ABOVE_SHARE = 0.9
#: Where the default is more than DEFAULT_OFF behind the tuned config, tuned must be TUNED_GAIN faster.
DEFAULT_OFF = 0.05
TUNED_GAIN = 1.2


def short(config: str) -> str:
    return (config.removeprefix("Config(").removesuffix(")").replace("BLOCK_", "").replace("num_stages", "stages")
            .replace("num_warps", "warps").replace("GROUP_M", "G").replace("SPLIT_K", "split"))


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| model | M | tuned TFLOP/s | default | torch | dense bound | tuned / torch | tuned / dense | "
           "tuned / default | tuned config |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['M']} | {r['tuned_tflops']:.1f} | {r['default_tflops']:.1f} | "
                   f"{r['torch_tflops']:.1f} | {r['dense_tflops']:.1f} | {r['tuned_tflops'] / r['torch_tflops']:.2f}x | "
                   f"{r['tuned_tflops'] / r['dense_tflops']:.0%} | {r['default_ms'] / r['tuned_ms']:.2f}x | "
                   f"{short(r['tuned_config'])} |")
    return out


def targets(rows: list[dict[str, Any]]) -> list[str]:
    def cells(pred: Any) -> str:
        return ", ".join(f"{r['model']} M={r['M']}" for r in rows if pred(r)) or "none"

    vs_torch = lambda r: r["tuned_tflops"] / r["torch_tflops"]  # noqa: E731
    small = [r for r in rows if r["M"] <= SMALL_M]
    large = [r for r in rows if r["M"] > SMALL_M]
    dense = [r for r in rows if r["model"] in DENSE_MODELS and r["M"] >= 2048]
    off = [r for r in rows if r["default_ms"] / r["tuned_ms"] > 1 + DEFAULT_OFF]
    return [
        f"- at least torch at M <= {SMALL_M}: {sum(vs_torch(r) >= 1 for r in small)} of {len(small)} "
        f"(below: {cells(lambda r: r['M'] <= SMALL_M and vs_torch(r) < 1)})",
        f"- at least {ABOVE_SHARE:.0%} of torch above M = {SMALL_M}: "
        f"{sum(vs_torch(r) >= ABOVE_SHARE for r in large)} of {len(large)} "
        f"(below: {cells(lambda r: r['M'] > SMALL_M and vs_torch(r) < ABOVE_SHARE)})",
        f"- at least {DENSE_SHARE:.0%} of the dense bound at M >= 2048 on {' and '.join(DENSE_MODELS)}: "
        f"{sum(r['tuned_tflops'] / r['dense_tflops'] >= DENSE_SHARE for r in dense)} of {len(dense)} "
        f"(below: {cells(lambda r: r in dense and r['tuned_tflops'] / r['dense_tflops'] < DENSE_SHARE)})",
        f"- default more than {DEFAULT_OFF:.0%} behind tuned: {len(off)} cells; tuned at least {TUNED_GAIN}x there: "
        f"{sum(r['default_ms'] / r['tuned_ms'] >= TUNED_GAIN for r in off)}",
        f"- tuned slower than the default by more than {DEFAULT_OFF:.0%}: "
        f"{cells(lambda r: r['tuned_ms'] / r['default_ms'] > 1 + DEFAULT_OFF)}",
        *noise(rows),
    ]


def noise(rows: list[dict[str, Any]]) -> list[str]:
    """The run's own noise: tuned / default where both are the same config, and the rounds' spread."""
    same = [r["default_ms"] / r["tuned_ms"] for r in rows if short(r["tuned_config"]) == short(r["default_config"])]
    out = [f"- tuned / default where the tuned config is the default: {min(same):.2f} to {max(same):.2f}x "
           f"over {len(same)} cells"] if same else []
    spreads = [max(t) / min(t) - 1 for r in rows for k, t in r.items() if k.endswith("_round_ms") and len(t) > 1]
    if spreads:
        spreads.sort()
        out.append(f"- spread of an implementation's rounds in a cell (slowest / fastest - 1): median "
                   f"{spreads[len(spreads) // 2]:.1%}, largest {spreads[-1]:.1%}")
    return out


def main() -> None:
    data = json.load(open(sys.argv[1], encoding="utf-8"))
    print("\n".join([*table(data["rows"]), "", *targets(data["rows"])]))


if __name__ == "__main__":
    main()
