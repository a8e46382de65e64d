"""Measure flyreg's hot path: key building, steady-state call overhead and ``import flyreg``.

Runs on the CPU by default; ``--device cuda`` puts the tensors on the GPU. Every number is
the median over ``--runs`` runs of ``--calls`` calls each. Example::

    python benchmarks/hot_path.py --calls 20000 --runs 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

IMPORT_PROBE = """
import json, sys, time
t0 = time.perf_counter()
import flyreg
dt = time.perf_counter() - t0
print(json.dumps({"ms": dt * 1e3, "heavy": {m: m in sys.modules for m in ("torch", "click", "rich", "pluggy")}}))
"""


def per_call_us(fn: Callable[[], Any], calls: int, runs: int) -> float:
    """Median over ``runs`` of the mean time of one ``fn()`` across ``calls`` calls, in microseconds."""
    fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def key_costs(device: str, calls: int, runs: int) -> dict[str, float]:
    import torch

    from flyreg import BuildCache, Config

    x = torch.randn(64, 128, device=device)
    w = torch.randn(128, device=device)
    tuner = _tuner(BuildCache(), Config)
    tuner(x, w)  # resolved: what follows finds the key in memory
    return {
        "persistent key + memory hit (resolve)": per_call_us(lambda: tuner.resolve(x, w), calls, runs),
        "tuner fast key, 2 tensors + 1 kwarg (is_bound)": per_call_us(lambda: tuner.is_bound(x, w, eps=1e-6), calls, runs),
        "tuner fast key, 2 tensors (is_bound)": per_call_us(lambda: tuner.is_bound(x, w), calls, runs),
    }


def _tuner(build_cache: Any, config_cls: Any, launch: Callable[..., Any] | None = None) -> Any:
    import flyreg

    def build(config: Any, spec: dict[str, Any]) -> Callable[..., Any]:
        return launch if launch is not None else (lambda x, w: x)

    return flyreg.autotune_builder(
        "hot_path_bench", build, lambda x, w, eps=1e-6: {"n_cols": int(x.shape[-1])},
        [config_cls({"BLOCK": 128})], lambda spec: config_cls({"BLOCK": 128}), build_cache=build_cache,
    )


def call_overhead(device: str, calls: int, runs: int) -> dict[str, float]:
    import torch

    from flyreg import BuildCache, Config

    x = torch.randn(64, 128, device=device)
    w = torch.randn(128, device=device)

    def launch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x

    tuner = _tuner(BuildCache(), Config, launch)
    assert tuner(x, w) is x and tuner.resolve(x, w).source == "memory"
    direct = per_call_us(lambda: launch(x, w), calls, runs)
    tuned = per_call_us(lambda: tuner(x, w), calls, runs)
    tuned_kw = per_call_us(lambda: tuner(x, w, eps=1e-6), calls, runs)
    return {"launch called directly": direct, "flyreg tuner, positional": tuned,
            "flyreg tuner, + eps= kwarg (filtered)": tuned_kw}


def import_cost(runs: int) -> tuple[float, dict[str, bool], float | None]:
    """Median wall ms of ``import flyreg`` in a fresh interpreter, the heavy modules it pulled in,
    and flyreg's cumulative ``-X importtime`` in ms."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    samples, heavy = [], {}
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, check=True, env=env)
        data = json.loads(out.stdout)
        samples.append(data["ms"])
        heavy = data["heavy"]
    probe = subprocess.run([sys.executable, "-X", "importtime", "-c", "import flyreg"], capture_output=True,
                           text=True, check=True, env=env)
    cumulative = None
    for line in probe.stderr.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2] == "flyreg":
            cumulative = int(parts[1]) / 1e3
    return statistics.median(samples), heavy, cumulative


def table(title: str, rows: dict[str, float], unit: str = "us") -> str:
    width = max(len(k) for k in rows)
    lines = [title, "-" * (width + 14)]
    lines += [f"{k:<{width}}  {v:9.2f} {unit}" for k, v in rows.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="torch device of the tensors (cpu or cuda)")
    parser.add_argument("--calls", type=int, default=20000, help="calls per timed run")
    parser.add_argument("--runs", type=int, default=7, help="timed runs; the median is reported")
    parser.add_argument("--import-runs", type=int, default=5, help="fresh interpreters timing `import flyreg`")
    args = parser.parse_args(argv)

    import_ms, heavy, cumulative = import_cost(args.import_runs)
    import torch

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, device {args.device}, "
          f"{args.calls} calls x {args.runs} runs (median)\n")
    print(table("key building (per key)", key_costs(args.device, args.calls, args.runs)))
    print()
    overhead = call_overhead(args.device, args.calls, args.runs)
    overhead["overhead (tuner - direct)"] = overhead["flyreg tuner, positional"] - overhead["launch called directly"]
    print(table("steady-state call, trivial launch returning its input (per call)", overhead))
    print()
    rows = {"import flyreg (wall, fresh interpreter)": import_ms}
    if cumulative is not None:
        rows["import flyreg (-X importtime, cumulative)"] = cumulative
    print(table("import", rows, "ms"))
    print("modules imported by `import flyreg`: " + ", ".join(f"{m}={'yes' if v else 'no'}" for m, v in heavy.items()))


if __name__ == "__main__":
    main()
