"""One knob's effect on the fused MoE: the served and the default config of each cell, each against itself
with ``--set NAME=VALUE``, timed side by side on a GPU.

Per model shape and M bucket: the config lookup serves and the op's default, and each of them with the
knob set (``--set TMA=true`` reads the weight tiles by TMA), four configs bound to the same inputs,
checked against the float32 reference (an error over 2 % ends the run; a variant the op refuses,
such as ``TAILS=2`` on 16-row tiles, is skipped and shown as n/a; a value no config takes ends the run
before any cell), and timed in ``--rounds`` rounds of rotating order as
``moe_bench.py`` times (CUDA-graph replays, median). The table gives each variant's time over its
base's (below 1: the knob is faster) and, as the run's noise, the rounds' spread of the base.

    python plugins/flyreg-moe/bench/moe_knob_ab.py --set TMA=true [--shapes NAME ...] [--M 1 2 ...]
        [--rounds 4] --json ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch

import flyreg
from flyreg.plugin import Config, Device
from flyreg_moe import space, triton_moe
from flyreg_moe.cpu import fused_moe_reference
from flyreg_moe.ops import MODEL_SHAPES, make_moe_inputs

from flyreg_moe_bench.moe_bench import rel_err, timed_in_rounds


def knob(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` with VALUE parsed as JSON (``true``, ``4``), else kept as a string."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


def with_knob(config: Config, name: str, value: Any) -> Config:
    return Config({**config.kwargs, name: value}, **config.hints)


#: A config every valid value of a knob fits (128-row tiles take TAILS=2); a value it refuses is a typo.
PROBE = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1}
#: Largest error against the float32 reference a timed config may have (bf16 keeps 8 bits).
TOLERANCE = 2e-2


def check_knob(name: str, value: Any, flag: str = "--set") -> None:
    """SystemExit naming the knob when the op would refuse it on any config (``TMA=True`` for ``TMA=true``)."""
    try:
        triton_moe.check_knobs(**{**PROBE, name: value})
    except (TypeError, ValueError) as e:
        raise SystemExit(f"{flag} {name}={value!r}: {e}") from None


def exit_on_wrong(cell: str, errs: dict[str, float]) -> None:
    """SystemExit naming each config whose relative error against the float32 reference is not under
    :data:`TOLERANCE`: a wrong answer is a bug to fix, not a time to report."""
    wrong = {k: e for k, e in errs.items() if not e < TOLERANCE}
    if wrong:
        raise SystemExit(f"{cell}: relative error over {TOLERANCE} against the float32 reference: {wrong}")


def ab_cell(name: str, M: int, knob_name: str, value: Any, rounds: int, reps: int) -> dict[str, Any]:
    E, K, N, topk = MODEL_SHAPES[name]
    spec = {"E": E, "K": K, "M": space.m_bucket(M), "N": N, "backend": "triton", "dtype": "bfloat16", "topk": topk}
    args = make_moe_inputs(M, E, N, K, topk, torch.bfloat16, "cuda")
    ref = fused_moe_reference(*args)
    bases = {"served": flyreg.resolve_spec("fused_moe", spec, "cuda").config,
             "default": space.triton_default(spec, Device.of("cuda"))}
    configs = {**bases, **{f"{k}+knob": with_knob(c, knob_name, value) for k, c in bases.items()}}
    runs, skipped = {}, {}
    for k, c in configs.items():
        try:
            runs[k] = triton_moe.bind_fused_moe(*args, **c.kwargs, **c.hints)
        except ValueError as e:  # the knob does not fit this config (TAILS=2 on 16-row tiles)
            skipped[k] = str(e)
    errs = {k: rel_err(run(*args), ref) for k, run in runs.items()}
    exit_on_wrong(f"{name} M={M}", errs)
    times, hows = timed_in_rounds({k: (lambda run=run: run(*args)) for k, run in runs.items()}, rounds, reps)
    ms = {k: statistics.median(t) for k, t in times.items()}

    def ratio(base: str) -> float | None:
        return ms[f"{base}+knob"] / ms[base] if f"{base}+knob" in ms else None

    return {"model": name, "M": M, "configs": {k: c.to_json() for k, c in configs.items()}, "ms": ms,
            "round_ms": times, "timing": {k: sorted(h) for k, h in hows.items()}, "rel_err": errs,
            "skipped": skipped, "served_ratio": ratio("served"), "default_ratio": ratio("default"),
            "noise": (max(times["served"]) - min(times["served"])) / ms["served"]}


def _ratio(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", dest="knob", type=knob, required=True, help="NAME=VALUE, e.g. TMA=true")
    p.add_argument("--shapes", nargs="*", default=list(MODEL_SHAPES), choices=list(MODEL_SHAPES))
    p.add_argument("--M", nargs="*", type=int, default=list(space.M_BUCKETS))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", required=True)
    a = p.parse_args()
    name, value = a.knob
    check_knob(name, value)
    rows: list[dict[str, Any]] = []
    print(f"{torch.cuda.get_device_name()}: {name}={value!r} over each config without it (below 1: faster)")
    print("model | M | served | default | base spread | worst rel err | served config", flush=True)
    for model in a.shapes:
        for M in a.M:
            r = ab_cell(model, M, name, value, a.rounds, a.reps)
            rows.append(r)
            print(f"{model} | {M} | {_ratio(r['served_ratio'])} | {_ratio(r['default_ratio'])} | {r['noise']:.1%} | "
                  f"{max(r['rel_err'].values()):.2e} | {r['configs']['served']}", flush=True)
            with open(a.json, "w", encoding="utf-8") as f:
                json.dump({"knob": {name: value}, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
            torch.cuda.empty_cache()  # the cell's weights are free once it returns


if __name__ == "__main__":
    main()
