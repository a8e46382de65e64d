"""Fused-MoE throughput on a GPU: flyreg tuned and default against torch's grouped GEMM and a dense cuBLAS bound.

Per model shape and M bucket, TFLOP/s counted as 6 * M * topk * N * K per call (both GEMMs):

* ``tuned``: ``flyreg.op("fused_moe")``, serving its shipped artifact (or whatever lookup gives);
* ``default``: the same kernels under the op's heuristic default config;
* ``torch``: routing in torch (a stable sort of the pairs by expert, counts by ``scatter_add``), both
  GEMMs by torch's grouped GEMM (``torch.nn.functional.grouped_mm``, else ``torch._grouped_mm``; where
  neither exists, a loop over experts of ``torch.matmul``, named ``torch-loop`` in the output), SiLU
  and mul, the routing weight and the top-k sum in torch;
* ``dense``: cuBLAS (``torch.matmul``) on one dense bf16 GEMM of GEMM 1's total size,
  [M * topk, K] x [K, 2N], counted at its own 4 * M * topk * N * K flops: the bound.

Timing: each implementation's calls are captured in one CUDA graph (host launch cost out) and the
graph replayed; time per call = replay time / calls, median of ``--reps`` replays, with enough calls
a replay for about a millisecond of work. A cell times its four implementations in ``--rounds``
rounds, each round starting further along the implementations, and reports each one's median round
(``*_round_ms`` keeps every round): being timed first in a cell costs none of them alone. The
weights (over 1 GB for every model shape) never fit the 60 MB L2, so every call streams them from
DRAM; x and the routing stay in L2 for every implementation alike. An implementation that cannot be
captured is timed with events around eager calls (``flyreg.do_bench``, L2 flushed), and the output
says so.

    python plugins/flyreg-moe/bench/moe_bench.py [--shapes NAME ...] [--M 1 2 ...] [--rounds 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F

import flyreg

from flyreg.plugin import Device
from flyreg_moe import space, triton_moe
from flyreg_moe.cpu import fused_moe_reference
from flyreg_moe.ops import MODEL_SHAPES, make_moe_inputs

GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
TORCH_NAME = "torch" if GROUPED_MM is not None else "torch-loop"
#: Device time a replay holds at least.
REPLAY_MS = 1.0


def torch_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, tw: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The MoE in torch: pairs sorted by expert, both GEMMs grouped, results put back and summed over top-k."""
    M, K = x.shape
    E, N, topk = w1.shape[0], w2.shape[2], ids.shape[1]
    flat = ids.view(-1)
    order = torch.sort(flat, stable=True).indices
    xs = x[order // topk]
    if GROUPED_MM is not None:
        counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(
            0, flat.long(), torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        h = GROUPED_MM(xs, w1.transpose(1, 2), offs=offs)
        y = GROUPED_MM(F.silu(h[:, :N]) * h[:, N:], w2.transpose(1, 2), offs=offs)
    else:
        counts = torch.bincount(flat, minlength=E).tolist()
        ys, start = [], 0
        for e, c in enumerate(counts):
            if c:
                h = xs[start:start + c] @ w1[e].T
                ys.append((F.silu(h[:, :N]) * h[:, N:]) @ w2[e].T)
            start += c
        y = torch.cat(ys)
    y = y.float() * tw.view(-1)[order, None]
    out = torch.empty_like(y)
    out[order] = y
    return out.view(M, topk, K).sum(1).to(x.dtype)


def time_ms(fn: Callable[[], Any], reps: int) -> tuple[float, str]:
    """Median ms per call: CUDA-graph replays, else events around eager calls (named in the second item)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    est = max(time.perf_counter() - t0, 1e-6) * 1e3
    calls = max(1, min(200, math.ceil(REPLAY_MS / est)))
    try:
        def body() -> None:
            for _ in range(calls):
                fn()

        return flyreg.do_bench(body, 1, reps, device="cuda", cuda_graph=True).median / calls, "graph"
    except Exception:  # not capturable: eager calls timed with events
        return statistics.median(flyreg.do_bench(fn, warmup=2, rep=reps, device="cuda").times), "eager"


def timed_in_rounds(fns: dict[Any, Callable[[], Any]], rounds: int, reps: int) -> tuple[dict[Any, list[float]],
                                                                                        dict[Any, set[str]]]:
    """Each function's ``time_ms`` in every round, and how each was timed. Round r starts r/rounds of the
    way along the functions, so no one of them is always timed first."""
    keys = list(fns)
    times: dict[Any, list[float]] = {k: [] for k in keys}
    hows: dict[Any, set[str]] = {k: set() for k in keys}
    for r in range(rounds):
        shift = r * len(keys) // rounds
        for k in keys[shift:] + keys[:shift]:
            ms, how = time_ms(fns[k], reps)
            times[k].append(ms)
            hows[k].add(how)
    return times, hows


def routed(M: int, E: int, K: int, topk: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """(x, topk_weights, topk_ids) of M fresh tokens, each routed to topk distinct experts."""
    x = torch.randn((M, K), generator=gen, device="cuda").to(torch.bfloat16)
    top, ids = torch.topk(torch.randn((M, E), generator=gen, device="cuda"), topk, dim=1)
    return x, torch.softmax(top, dim=1), ids.to(torch.int32)


def distinct_experts(ids_sets: Iterable[torch.Tensor]) -> float:
    """Distinct experts a call's ids select, averaged over input sets: the experts whose weights a call reads."""
    return statistics.mean(torch.unique(ids).numel() for ids in ids_sets)


def copy_bandwidth(repeats: int) -> float:
    """Device copy bandwidth in bytes/s (read plus written over the median time) of a 1 GiB ``copy_``, timed
    with events around eager calls: at this size launch cost does not show."""
    src = torch.empty(1 << 29, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(50):  # clocks up before anything counts
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return 2 * src.numel() * src.element_size() / statistics.median(times)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def bench_cell(name: str, shape: tuple[int, int, int, int], M: int, reps: int, rounds: int) -> dict[str, Any]:
    E, K, N, topk = shape
    dtype = torch.bfloat16
    args = make_moe_inputs(M, E, N, K, topk, dtype, "cuda")
    spec = {"E": E, "K": K, "M": space.m_bucket(M), "N": N, "backend": "triton", "dtype": "bfloat16", "topk": topk}
    op = flyreg.op("fused_moe")
    served = flyreg.resolve_spec("fused_moe", spec, "cuda")
    default = space.triton_default(spec, Device.of("cuda"))
    run_default = triton_moe.bind_fused_moe(*args, **default.kwargs, **default.hints)
    ref = fused_moe_reference(*args)
    row: dict[str, Any] = {"model": name, "E": E, "K": K, "N": N, "topk": topk, "M": M,
                           "tuned_config": str(served.config), "tuned_source": served.source,
                           "default_config": str(default), "torch_impl": TORCH_NAME}
    a = torch.randn(M * topk, K, device="cuda", dtype=dtype)
    b = torch.randn(K, 2 * N, device="cuda", dtype=dtype)
    impls = {"tuned": lambda: op(*args), "default": lambda: run_default(*args), "torch": lambda: torch_moe(*args),
             "dense": lambda: a @ b}
    for impl in ("tuned", "default", "torch"):
        row[f"{impl}_rel_err"] = rel_err(impls[impl](), ref)
    times, hows = timed_in_rounds(impls, rounds, reps)
    flops = {"dense": 4 * M * topk * N * K}
    for impl, ts in times.items():
        ms = statistics.median(ts)
        row[f"{impl}_ms"], row[f"{impl}_round_ms"] = ms, ts
        row[f"{impl}_timing"] = "+".join(sorted(hows[impl]))  # "eager+graph" if the rounds differed
        row[f"{impl}_tflops"] = flops.get(impl, 6 * M * topk * N * K) / ms / 1e9
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=list(MODEL_SHAPES), choices=list(MODEL_SHAPES))
    p.add_argument("--M", nargs="*", type=int, default=list(space.M_BUCKETS))
    p.add_argument("--reps", type=int, default=5, help="replays a timing takes the median of")
    p.add_argument("--rounds", type=int, default=4,
                   help="timings of each implementation a cell takes the median of, in rotating order")
    p.add_argument("--json", default=None, help="write the rows here")
    a = p.parse_args()
    rows = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, grouped GEMM: {TORCH_NAME}", flush=True)
    print("model | M | tuned TFLOP/s | default | torch | dense bound | tuned/torch | tuned/dense | tuned/default | "
          "config", flush=True)
    for name in a.shapes:
        for M in a.M:
            r = bench_cell(name, MODEL_SHAPES[name], M, a.reps, a.rounds)
            torch.cuda.empty_cache()  # the cell's weights are free once it returns
            rows.append(r)
            print(f"{name} | {M} | {r['tuned_tflops']:.1f} | {r['default_tflops']:.1f} | {r['torch_tflops']:.1f} | "
                  f"{r['dense_tflops']:.1f} | {r['tuned_tflops'] / r['torch_tflops']:.2f}x | "
                  f"{r['tuned_tflops'] / r['dense_tflops']:.0%} | {r['default_ms'] / r['tuned_ms']:.2f}x | "
                  f"{r['tuned_config']} ({r['tuned_source']})", flush=True)
            if a.json:
                meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                        "triton": __import__("triton").__version__, "grouped_gemm": TORCH_NAME}
                with open(a.json, "w", encoding="utf-8") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
