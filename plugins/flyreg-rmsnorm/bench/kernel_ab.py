"""Two versions of the plugin's Triton kernels, A/B on the served configs, in one run on a GPU.

    python plugins/flyreg-rmsnorm/bench/kernel_ab.py --before OLD/triton_kernels.py [--after NEW/triton_kernels.py] [--ops rmsnorm fused_add_rmsnorm]
        [--dtype bfloat16 float32] [--M 1 32 256 4096 32768] [--N 128 ... 16384] [--rounds 4] [--json out.json]
        [--after-configs DIR]

``--before`` is an older ``flyreg_rmsnorm/triton_kernels.py`` (``git show REV:plugins/...``); "after"
is ``--after``, a variant under trial, or else the installed module. For each cell both are bound to the config this machine serves, checked
to return the same bits on fresh random rows (a change meant to leave the common path alone must),
and timed in steady state (:func:`rmsnorm_bandwidth.steady_ms`) in ``--rounds`` back-to-back pairs,
alternating which goes first. ``after`` is after's time over before's (> 1: after is slower); ``same``
is the same ratio for two launchers of the before kernel, the noise of the cell in this run.

``--after-configs DIR`` (artifacts written by ``flyreg tune --out DIR`` over the after kernels) times best
against best: where DIR holds an artifact of the cell's op and spec, after runs that config, and the bitwise
check is skipped when it differs from before's (``identical`` is then null). ``flyreg tune`` also writes
its winners into the scratch cache, which lookup serves before a shipped artifact: run with an empty
``FLYREG_CACHE_DIR`` for before to get the shipped config (``source`` in the rows says which it got).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import flyreg
from flyreg_rmsnorm import triton_kernels as installed_module

from flyreg_rmsnorm_bench.rmsnorm_bandwidth import EPS, GRID_M, GRID_N, paired_ratios, replay_calls, rotating_inputs, steady_ms

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def load_kernels(path: str, name: str = "before") -> ModuleType:
    """The kernels module at ``path``, imported inside ``flyreg_rmsnorm`` (its relative imports resolve there)."""
    spec = importlib.util.spec_from_file_location(f"flyreg_rmsnorm._kernels_{name}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--{name}: cannot import {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def binder(module: ModuleType, op: str, config: Any) -> Any:
    """``module``'s launcher of ``op`` under ``config``, bound to calls like the given arguments."""
    bind = module.bind_rmsnorm if op == "rmsnorm" else module.bind_fused_add_rmsnorm
    return lambda *args: bind(*args, EPS, **config.kwargs, **config.hints)


def spec_key(spec: dict[str, Any]) -> str:
    """``spec`` as sorted JSON without the device name: the same on every machine."""
    return json.dumps({k: v for k, v in spec.items() if k != "device_name"}, sort_keys=True)


def tuned_configs(directory: str | None) -> dict[tuple[str, str], flyreg.Config]:
    """The configs of the artifacts in ``directory``, by (op, :func:`spec_key`)."""
    out: dict[tuple[str, str], flyreg.Config] = {}
    for path in sorted(Path(directory).glob("*.json")) if directory else []:
        a = json.loads(path.read_text())
        out[(a["op"], spec_key(a["spec"]))] = flyreg.Config(a["config"]["kwargs"], **a["config"]["hints"])
    return out


def measure_cell(before: ModuleType, after: ModuleType, op: str, M: int, N: int, dtype: torch.dtype, rounds: int,
                 reps: int, tuned: dict[tuple[str, str], flyreg.Config] | None = None) -> dict[str, Any]:
    xs, _, w = rotating_inputs(M, N, dtype)
    fused = op == "fused_add_rmsnorm"
    rs = [torch.randn_like(x) for x in xs] if fused else []
    args = [(x, r, w) if fused else (x, w) for x, r in zip(xs, rs or xs)]
    res = flyreg.resolve(op, *args[0], EPS)
    after_config = (tuned or {}).get((op, spec_key(res.spec)), res.config)
    configs = {"before": res.config, "after": after_config, "before2": res.config}
    row: dict[str, Any] = {"op": op, "M": M, "N": N, "dtype": str(dtype).removeprefix("torch."),
                           "config": repr(res.config), "source": res.origin}
    if after_config != res.config:
        row["after_config"] = repr(after_config)
    runs = {}
    for name, module in (("before", before), ("after", after), ("before2", before)):
        launch = binder(module, op, configs[name])(*args[0])
        runs[name] = [lambda a=a, launch=launch: launch(*a) for a in args]
    x0 = torch.randn(M, N, device="cuda", dtype=dtype)  # the same bits out of both, fused residual included
    outs = []
    for name in ("before", "after"):
        r0 = torch.randn(M, N, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(1))
        launch = binder(before if name == "before" else after, op, configs[name])(*((x0, r0, w) if fused else (x0, w)))
        outs.append((launch(x0, r0, w) if fused else launch(x0, w), r0))
    row["identical"] = (all(torch.equal(a, b) for a, b in zip(outs[0], outs[1]))
                        if after_config == res.config else None)
    calls = replay_calls((2 + 2 * fused) * M * N * xs[0].element_size(), len(xs))
    time = lambda fns: steady_ms(fns, calls, reps)  # noqa: E731
    row["after"] = paired_ratios(runs["before"], runs["after"], rounds, time)
    row["same"] = paired_ratios(runs["before"], runs["before2"], rounds, time)
    row["before_us"] = time(runs["before"]) * 1e3
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="an older flyreg_rmsnorm/triton_kernels.py")
    ap.add_argument("--after", default=None, help="a variant of it (default: the installed module)")
    ap.add_argument("--ops", nargs="+", default=["rmsnorm", "fused_add_rmsnorm"],
                    choices=["rmsnorm", "fused_add_rmsnorm"])
    ap.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=sorted(DTYPES))
    ap.add_argument("--M", type=int, nargs="+", default=list(GRID_M))
    ap.add_argument("--N", type=int, nargs="+", default=list(GRID_N))
    ap.add_argument("--rounds", type=int, default=4, help="back-to-back pairs per cell")
    ap.add_argument("--reps", type=int, default=7, help="graph replays per timing; the median is kept")
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--after-configs", default=None, help="artifacts tuned over the after kernels: best against best")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    before = load_kernels(args.before)
    after = load_kernels(args.after, "after") if args.after else installed_module
    tuned = tuned_configs(args.after_configs)
    rows = []
    for op in args.ops:
        for dtype in args.dtype:
            for M in args.M:
                for N in args.N:
                    row = measure_cell(before, after, op, M, N, DTYPES[dtype], args.rounds, args.reps, tuned)
                    rows.append(row)
                    print(f"{op:18s} {dtype:9s} M={M:<6d} N={N:<6d} before {row['before_us']:8.2f} us"
                          f"  after/before {statistics.median(row['after']):.3f}"
                          f"  same {statistics.median(row['same']):.3f}  identical={row['identical']}", flush=True)
                    if args.json:  # after every cell: a run cut short keeps what it measured
                        Path(args.json).write_text(json.dumps(rows, indent=1))
    med = [statistics.median(r["after"]) for r in rows]
    same = [statistics.median(r["same"]) for r in rows]
    print(f"{len(rows)} cells: after/before median {statistics.median(med):.4f} (min {min(med):.3f}, "
          f"max {max(med):.3f}); before/before median {statistics.median(same):.4f} (min {min(same):.3f}, "
          f"max {max(same):.3f}); identical outputs in {sum(r['identical'] is True for r in rows)} of "
          f"{sum(r['identical'] is not None for r in rows)} with one config")


if __name__ == "__main__":
    main()
