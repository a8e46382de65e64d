"""Measure what recording (``flyreg.record`` / ``FLYREG_RECORD``) adds to the steady-state call.

Off and on alternate round by round in one process (a round: ``--calls`` calls), the order
flipping every round, so drift in the machine's speed hits both alike; the ratio on / off is reported
per case as the median of the rounds' ratios and the ratio of the fastest rounds. Cases: a
tuner whose launch returns its input (the hot path alone), and on CUDA also RMSNorm's Triton
launch on a small bf16 input (host-bound). Example::

    python benchmarks/record_overhead.py --device cuda --calls 5000 --rounds 101
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def timed(fn: Callable[[], Any], calls: int) -> float:
    """Seconds per call of ``fn`` over ``calls`` calls."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def compare(fn: Callable[[], Any], calls: int, rounds: int, record_file: Path) -> dict[str, float]:
    """Per-call microseconds off and on, and their ratios: rounds of ``calls`` calls each way, in the
    order off-on, on-off, off-on, ... (so neither always runs first)."""
    import flyreg

    def on_round() -> float:
        with flyreg.record(record_file):
            fn()  # the first call of each signature while recording resolves it again (a memory hit)
            return timed(fn, calls)

    def off_round() -> float:
        fn()
        return timed(fn, calls)

    off, on = [], []
    for i in range(rounds):
        if i % 2:
            on.append(on_round())
            off.append(off_round())
        else:
            off.append(off_round())
            on.append(on_round())
    ratios = [b / a for a, b in zip(off, on)]
    return {"off us": statistics.median(off) * 1e6, "on us": statistics.median(on) * 1e6,
            "ratio (median of rounds)": statistics.median(ratios), "ratio (fastest rounds)": min(on) / min(off)}


def trivial_case(device: str) -> Callable[[], Any]:
    """A tuner of two tensors whose launch returns its input: the hot path and nothing else."""
    import torch

    import flyreg

    x = torch.randn(64, 128, device=device)
    w = torch.randn(128, device=device)

    def launch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x

    tuner = flyreg.autotune_builder("record_overhead_trivial", lambda config, spec: launch,
                                    lambda x, w: {"n": int(x.shape[-1])}, [flyreg.Config({"B": 1})],
                                    lambda spec: flyreg.Config({"B": 1}), build_cache=flyreg.BuildCache())
    return lambda: tuner(x, w)


def rmsnorm_case(device: str) -> Callable[[], Any] | None:
    """RMSNorm's launch on a 32 x 4096 bf16 input (host-bound), where the plugin is installed."""
    import torch

    import flyreg

    try:
        op = flyreg.op("rmsnorm")
    except LookupError:
        return None
    x = torch.randn(32, 4096, device=device, dtype=torch.bfloat16)
    w = torch.rand(4096, device=device, dtype=torch.bfloat16) + 0.5
    return lambda: op(x, w)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="torch device of the tensors (cpu or cuda)")
    parser.add_argument("--calls", type=int, default=5000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=101, help="rounds, each off and on")
    args = parser.parse_args(argv)

    if os.environ.get("FLYREG_RECORD"):
        sys.exit("unset FLYREG_RECORD: this benchmark turns recording on and off itself")
    import torch

    cases = {"trivial launch (hot path only)": trivial_case(args.device)}
    if args.device.startswith("cuda"):
        rms = rmsnorm_case(args.device)
        if rms is not None:
            cases["rmsnorm 32x4096 bf16"] = rms
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, device {args.device}"
          f"{' (' + torch.cuda.get_device_name(args.device) + ')' if args.device.startswith('cuda') else ''}, "
          f"{args.calls} calls x {args.rounds} rounds each way\n")
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in cases.items():
            row = compare(fn, args.calls, args.rounds, Path(tmp) / "record.sqlite3")
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            print(f"{name}: off {row['off us']:.3f} us, on {row['on us']:.3f} us per call; on / off = "
                  f"{row['ratio (median of rounds)']:.4f} (median of rounds), "
                  f"{row['ratio (fastest rounds)']:.4f} (fastest rounds)")


if __name__ == "__main__":
    main()
