"""RMSNorm bandwidth on a GPU: flyreg tuned vs its default vs torch, torch.compile and Liger.

Bytes per call count x read + y written + weight read. Every number is measured in this
run, side by side, against the device-to-device copy bandwidth of the same run.

    python benchmarks/rmsnorm_bandwidth.py [--M 1 32 256 4096 32768] [--N 1024 ... 16384] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch

import flyreg
from flyreg.bench import do_bench
from flyreg.registry import REGISTRY

DEFAULT_N = (1024, 1536, 2048, 2880, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 12288, 16384)


def copy_tbps() -> float:
    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    dst = torch.empty_like(src)
    do_bench(lambda: dst.copy_(src), 3, 200, device="cuda")  # about 1 s of load: clocks up before anything counts
    ms = do_bench(lambda: dst.copy_(src), 3, 20, device="cuda").median
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e12


def candidates(x: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[], Any]]:
    plugin = REGISTRY.plugin("rmsnorm")
    tuner = flyreg.op("rmsnorm")
    spec = plugin.specialize((x, w), {})
    default_launch = plugin.build(plugin.default(spec), spec)
    default_hints = plugin.default(spec).hints
    fns: dict[str, Callable[[], Any]] = {
        "flyreg": lambda: tuner(x, w, eps=1e-6),
        "default": lambda: default_launch(x, w, eps=1e-6, **default_hints),
        "torch": lambda: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6),
    }
    compiled = _compiled()
    if compiled is not None:
        fns["compile"] = lambda: compiled(x, (x.shape[-1],), w, 1e-6)
    liger = _liger()
    if liger is not None:
        fns["liger"] = lambda: liger(x, w, 1e-6)
    return fns


_COMPILED: Any = None


def _compiled() -> Any:
    global _COMPILED
    if _COMPILED is None:
        try:
            _COMPILED = torch.compile(torch.nn.functional.rms_norm, dynamic=False)
        except Exception:  # torch.compile unavailable: leave the column out
            _COMPILED = False
    return _COMPILED or None


def _liger() -> Any:
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return None
    return lambda x, w, eps: LigerRMSNormFunction.apply(x, w, eps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", type=int, nargs="+", default=[1, 32, 256, 4096, 32768])
    ap.add_argument("--N", type=int, nargs="+", default=list(DEFAULT_N))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    copy = copy_tbps()
    print(f"device {torch.cuda.get_device_name()}, copy {copy:.2f} TB/s, dtype {args.dtype}")
    rows = []
    for M in args.M:
        for N in args.N:
            x = torch.randn(M, N, device="cuda", dtype=dtype)
            w = torch.rand(N, device="cuda", dtype=dtype) + 0.5
            nbytes = (2 * M * N + N) * x.element_size()
            res = flyreg.resolve("rmsnorm", x, w, eps=1e-6)
            row: dict[str, Any] = {"M": M, "N": N, "config": repr(res.config), "source": res.origin}
            for name, fn in candidates(x, w).items():
                try:
                    ms = do_bench(fn, 10, 50, device="cuda").median
                except Exception as e:  # a peer failing on a shape leaves its cell empty
                    row[name] = None
                    row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:120]
                    continue
                row[name] = nbytes / (ms * 1e-3) / 1e12
                row[f"{name}_us"] = ms * 1e3
            rows.append(row)
            cells = " ".join(f"{k}={row[k]:.2f}" if row.get(k) else f"{k}=-"
                             for k in ("flyreg", "default", "torch", "compile", "liger"))
            peers = [row[k] for k in ("torch", "compile", "liger") if row.get(k)]
            worst = min(row["flyreg"] / p for p in peers) if peers and row.get("flyreg") else float("nan")
            print(f"M={M:<6} N={N:<6} {cells} TB/s  flyreg {100 * row['flyreg'] / copy:.1f}% of copy, "
                  f"vs best peer {worst:.2f}x, {row['source']} {row['config']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_tbps": copy, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
