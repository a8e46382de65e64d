"""Host cost per call of the RMSNorm launch paths on a GPU, in a launch-bound shape (default 1 x 4096 bf16).

Each path is called ``--calls`` times back to back (the GPU keeps up: the kernel takes a few
microseconds, the host more), synchronized before and after; the time per call is the wall time
over the calls. Runs alternate between paths, and each path reports the median of ``--runs``.
Ratios are against (b), the bare Triton launch with the config flyreg serves for this shape.

    python plugins/flyreg-rmsnorm/bench/launch_overhead.py [--M 1] [--N 4096] [--dtype bfloat16] [--calls 20000] [--runs 5]

Paths:
  (a)  flyreg.op("rmsnorm")(x, w), steady state (key resolved, launcher bound)
  (b)  _rmsnorm_kernel[grid](...), the same kernel and config, output preallocated
  (b1) torch.empty + _rmsnorm_kernel[grid](...): (b) plus the output allocation (a) makes
  (b2) the plugin's bound launcher (bind_rmsnorm once, then called): allocation + compiled-kernel launch
  (c)  the same kernel under triton.autotune over 3 configs, its cache warm, output preallocated
  (d)  torch.ops.flyreg.rmsnorm(x, w), the torch.library custom op around (a) (flyreg.torch)
  (d1) the same custom op through its default overload (torch.ops.flyreg.rmsnorm.default)
  (e)  torch.nn.functional.rms_norm(x, (N,), w, eps)

Needs CUDA and Triton; without a GPU it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

EPS = 1e-6


def paths(M: int, N: int, dtype_name: str) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """The callables to time, keyed by their row label, and facts about the setup."""
    import torch
    import triton

    import flyreg
    from flyreg.triton import hints as launch_hints_of, pdl_supported
    from flyreg_rmsnorm import triton_kernels as tk

    dtype = getattr(torch, dtype_name)
    x = torch.randn(M, N, device="cuda", dtype=dtype)
    w = torch.rand(N, device="cuda", dtype=dtype) + 0.5
    y = torch.empty_like(x)

    tuner = flyreg.op("rmsnorm")
    res = tuner.resolve(x, w)
    block_n, rows = int(res.config.kwargs["BLOCK_N"]), int(res.config.kwargs["ROWS"])
    hints = {k: v for k, v in res.config.hints.items() if k in ("num_warps", "num_stages")}
    grid = ((M + rows - 1) // rows,)
    stride = x.stride(0)
    kernel = tk._rmsnorm_kernel
    pdl = pdl_supported(x.device)  # launched as the plugin launches it
    consts = tk._constexprs(M, N, block_n, rows, pdl, stride,
                            rescue=tk.rescue_mode(x.dtype, block_n, rows, hints.get("num_warps")))
    # as bound: a RESCUE_AFTER kernel with its register cap
    launch_hints = tk._capped(kernel, grid, (x, w, y, M, stride, EPS), consts,
                              launch_hints_of(hints.get("num_warps"), hints.get("num_stages"), pdl), x.device)

    def direct() -> Any:
        kernel[grid](x, w, y, M, stride, EPS, **consts, **launch_hints)
        return y

    def direct_alloc() -> Any:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        kernel[grid](x, w, out, M, stride, EPS, **consts, **launch_hints)
        return out

    bound = tk.bind_rmsnorm(x, w, EPS, BLOCK_N=block_n, ROWS=rows, **hints)

    def wrapper() -> Any:
        return bound(x, w, EPS)

    p2 = 1 << max(N - 1, 0).bit_length()
    auto_configs = [triton.Config({"BLOCK_N": p2, "ROWS": 1}, num_warps=nw) for nw in (4, 8, 16)]
    auto = triton.autotune(configs=auto_configs, key=["N"])(kernel)
    one_row = tk.rescue_mode(x.dtype, p2, 1, None)  # one-row tiles: the same mode at every warp count
    auto_consts = {k: v for k, v in tk._constexprs(M, N, p2, 1, False, stride, rescue=one_row).items()
                   if k not in ("BLOCK_N", "ROWS")}

    def autotuned() -> Any:
        auto[(M,)](x, w, y, M, stride, EPS, **auto_consts)
        return y

    import flyreg.torch

    packet = flyreg.torch.register("rmsnorm")
    custom = packet.default

    fns: dict[str, Callable[[], Any]] = {
        "(a)  flyreg.op('rmsnorm')(x, w)": lambda: tuner(x, w),
        "(b)  _rmsnorm_kernel[grid](...) direct": direct,
        "(b1) torch.empty + _rmsnorm_kernel[grid]": direct_alloc,
        "(b2) plugin's bound launcher, no flyreg": wrapper,
        "(c)  triton.autotune, 3 configs, warm": autotuned,
        "(d)  torch.ops.flyreg.rmsnorm(x, w)": lambda: packet(x, w),
        "(d1) the custom op's default overload": lambda: custom(x, w),
        "(e)  torch.nn.functional.rms_norm": lambda: torch.nn.functional.rms_norm(x, (N,), w, EPS),
    }
    from flyreg_rmsnorm_bench.rmsnorm_bandwidth import reference, rel_err

    ref = reference(x, w, EPS)
    bad = {}
    for name, fn in fns.items():
        err = rel_err(fn(), ref)  # also compiles, loads and (for c) autotunes, outside the timing
        if not err < 2e-2:
            bad[name] = err
    torch.cuda.synchronize()
    facts = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "shape": [M, N], "dtype": dtype_name, "flyreg_config": str(res.config), "flyreg_source": res.origin,
        "wrong_results": bad,
    }
    return fns, facts


def measure(fns: dict[str, Callable[[], Any]], calls: int, runs: int) -> dict[str, float]:
    """Median microseconds per call of each path; runs alternate between paths to spread drift."""
    import torch

    for fn in fns.values():
        for _ in range(min(calls, 500)):
            fn()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {name: statistics.median(s) for name, s in samples.items()}


def table(us: dict[str, float], base: str) -> str:
    width = max(len(k) for k in us)
    lines = [f"{'path':<{width}}  {'us/call':>8}  {'vs (b)':>7}  {'- (b) us':>8}", "-" * (width + 31)]
    for name, v in us.items():
        lines.append(f"{name:<{width}}  {v:8.2f}  {v / us[base]:6.2f}x  {v - us[base]:+8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--M", type=int, default=1, help="rows")
    parser.add_argument("--N", type=int, default=4096, help="columns")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--calls", type=int, default=20000, help="calls per timed run")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per path; the median is reported")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("launch_overhead: needs a CUDA device (torch.cuda.is_available() is False); nothing measured")
        return 0
    try:
        import triton  # noqa: F401
    except ImportError:
        print("launch_overhead: needs Triton; nothing measured")
        return 0

    t0 = time.perf_counter()
    fns, facts = paths(args.M, args.N, args.dtype)
    us = measure(fns, args.calls, args.runs)
    base = next(k for k in us if k.startswith("(b) "))
    print(f"{facts['device']}, torch {facts['torch']}, Triton {facts['triton']}; RMSNorm {args.M} x {args.N} "
          f"{args.dtype}; {args.calls} calls x {args.runs} runs (median)")
    print(f"flyreg config ({facts['flyreg_source']}): {facts['flyreg_config']}\n")
    print(table(us, base))
    if facts["wrong_results"]:
        print(f"\nWRONG RESULTS (relative error vs float64): {facts['wrong_results']}")
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**facts, "calls": args.calls, "runs": args.runs, "us_per_call": us}, f, indent=2)
    return 1 if facts["wrong_results"] else 0


if __name__ == "__main__":
    sys.exit(main())
