"""What checking the expert ids on every call costs (``FLYREG_MOE_CHECK_IDS=1``), per model shape and M.

The check reads the ids' minimum and maximum back to the host, so each call waits for the work queued
before it: its cost is wall time, not device time. Per cell, the same bound call is run eagerly ``--calls``
times without the check and with it (bound again with the setting on), in alternating rounds, and the
median wall time per call (queue drained at the end) is reported. A CUDA graph never checks: capture
skips it.

    python -m flyreg_moe_bench.check_ids_cost [--shapes NAME ...] [--M 1 16 ...] [--calls 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from flyreg.plugin import Device
from flyreg_moe import space, triton_moe
from flyreg_moe.checks import CHECK_IDS_ENV
from flyreg_moe.ops import MODEL_SHAPES, make_moe_inputs


def wall_us(run: Callable[..., Any], args: tuple[Any, ...], calls: int) -> float:
    """Wall microseconds per eager call over ``calls`` calls, the device drained at the end."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        run(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def bind(args: tuple[Any, ...], config: Any, checked: bool) -> Callable[..., Any]:
    old = os.environ.get(CHECK_IDS_ENV)
    os.environ[CHECK_IDS_ENV] = "1" if checked else "0"
    try:
        return triton_moe.bind_fused_moe(*args, **config.kwargs, **config.hints)
    finally:
        if old is None:
            del os.environ[CHECK_IDS_ENV]
        else:
            os.environ[CHECK_IDS_ENV] = old


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=list(MODEL_SHAPES), choices=list(MODEL_SHAPES))
    p.add_argument("--M", nargs="*", type=int, default=[1, 16, 256])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    print(f"{torch.cuda.get_device_name()}: model | M | unchecked us/call | checked us/call | added us/call",
          flush=True)
    rows = []
    for name in a.shapes:
        E, K, N, topk = MODEL_SHAPES[name]
        for M in a.M:
            args = make_moe_inputs(M, E, N, K, topk, torch.bfloat16, "cuda")
            spec = {"E": E, "K": K, "M": space.m_bucket(M), "N": N, "backend": "triton", "dtype": "bfloat16",
                    "topk": topk}
            config = space.triton_default(spec, Device.of("cuda"))
            runs = {False: bind(args, config, False), True: bind(args, config, True)}
            times: dict[bool, list[float]] = {False: [], True: []}
            for r in range(a.rounds):
                for checked in ((False, True) if r % 2 == 0 else (True, False)):
                    runs[checked](*args)
                    times[checked].append(wall_us(runs[checked], args, a.calls))
            row = {"model": name, "M": M, "config": str(config),
                   "unchecked_us": statistics.median(times[False]), "checked_us": statistics.median(times[True])}
            rows.append(row)
            print(f"{name} | {M} | {row['unchecked_us']:.1f} | {row['checked_us']:.1f} | "
                  f"{row['checked_us'] - row['unchecked_us']:.1f}", flush=True)
            del args, runs
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
