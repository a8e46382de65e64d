"""Where a fused-MoE call's device time goes: each kernel's time in the served config's call, on a GPU.

Per model shape and M bucket, the config lookup serves is bound once and called ``--calls`` times per input set
under ``torch.profiler`` (CUDA activity), the calls cycling through ``--sets`` input sets of their own routing
(one copy of the weights), so a call rarely finds its experts' weights in L2. Kernel times are summed by kernel and
divided by the calls: routing, GEMM 1, GEMM 2 and the top-k reduction (the decode
path's two kernels count as the GEMMs, its GEMM 2 summing the pairs; the pair path's first kernel, both GEMMs of
a pair in one program, counts as ``mlp``, its second as the reduction). Each GEMM is also given in TFLOP/s over
the real pairs (GEMM 1 4 * P * N * K flops, GEMM 2 2 * P * N * K, P = M * topk), beside cuBLAS
(``torch.matmul``) on a dense bf16 GEMM of the same size ([P, K] x [K, 2N] and [P, N] x [N, K]), timed as
``moe_bench.py`` times (CUDA-graph replays), and as its share of its weight floor: the selected experts' w1
(GEMM 1) or w2 (GEMM 2) bytes over the device copy bandwidth measured in the run. ``call_ms`` is the whole call
timed the same way over the same sets, so ``call_ms`` minus the kernels' sum is what launching them costs inside a
graph.

    python plugins/flyreg-moe/bench/moe_stages.py [--shapes NAME ...] [--M 1 2 ...] [--calls 20] [--sets 4]
        --json stages.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import flyreg
from flyreg_moe import space, triton_moe
from flyreg_moe.ops import MODEL_SHAPES, make_moe_inputs

from flyreg_moe_bench.moe_bench import copy_bandwidth, distinct_experts, routed, time_ms

#: Stage of each of the op's kernels (Triton names a kernel after its function).
STAGES = {"_count_kernel": "routing", "_route_kernel": "routing", "_gate_up_kernel": "gemm1", "_down_kernel": "gemm2",
          "_reduce_kernel": "reduce", "_decode_gate_up_kernel": "gemm1", "_decode_down_kernel": "gemm2",
          "_pair_mlp_kernel": "mlp", "_pair_sum_kernel": "reduce"}


def stage_of(kernel: str) -> str:
    """The stage a kernel name belongs to; ``other`` for a kernel that is not the op's (a memset, say)."""
    name = max((n for n in STAGES if n in kernel), key=len, default=None)  # "_down_kernel" is in "_decode_down_kernel"
    return STAGES[name] if name else "other"


def stage_ms(kernels: Iterable[tuple[str, float]], calls: int) -> dict[str, float]:
    """Milliseconds a call spends in each stage, from ``(kernel name, microseconds)`` records of ``calls``
    calls."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls!r}")
    out: dict[str, float] = {}
    for name, us in kernels:
        stage = stage_of(name)
        out[stage] = out.get(stage, 0.0) + us / 1e3 / calls
    return out


def profiled_kernels(fn: Callable[[], Any], calls: int) -> list[tuple[str, float]]:
    """``(kernel name, microseconds)`` of every device kernel that ``calls`` calls of ``fn`` ran."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]


def stages_cell(name: str, M: int, calls: int, reps: int, sets: int, bw: float) -> dict[str, Any]:
    E, K, N, topk = MODEL_SHAPES[name]
    P = M * topk
    spec = {"E": E, "K": K, "M": space.m_bucket(M), "N": N, "backend": "triton", "dtype": "bfloat16", "topk": topk}
    args = make_moe_inputs(M, E, N, K, topk, torch.bfloat16, "cuda")
    x, w1, w2, tw, ids = args
    gen = torch.Generator(device="cuda").manual_seed(M)
    input_sets = [(x, tw, ids)] + [routed(M, E, K, topk, gen) for _ in range(sets - 1)]
    inputs = itertools.cycle(input_sets)
    served = flyreg.resolve_spec("fused_moe", spec, "cuda").config
    run = triton_moe.bind_fused_moe(*args, **served.kwargs, **served.hints)

    def one_call() -> torch.Tensor:  # the next input set's call
        x, tw, ids = next(inputs)
        return run(x, w1, w2, tw, ids)

    ms = stage_ms(profiled_kernels(one_call, calls * sets), calls * sets)
    distinct = distinct_experts(ids for _, _, ids in input_sets)

    def dense_ms(rows: int, inner: int, cols: int) -> float:
        a = torch.randn(rows, inner, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(inner, cols, device="cuda", dtype=torch.bfloat16)
        return time_ms(lambda: a @ b, reps)[0]

    dense1, dense2 = dense_ms(P, K, 2 * N), dense_ms(P, N, K)
    call = time_ms(lambda: [one_call() for _ in range(sets)], reps)[0] / sets  # a replay takes every set
    flops = {"gemm1": 4 * P * N * K, "gemm2": 2 * P * N * K, "mlp": 6 * P * N * K}
    weight_bytes = {"gemm1": distinct * w1[0].numel() * w1.element_size(),
                    "gemm2": distinct * w2[0].numel() * w2.element_size()}
    weight_bytes["mlp"] = weight_bytes["gemm1"] + weight_bytes["gemm2"]
    floor_pct = {g: 100 * weight_bytes[g] / bw / (ms[g] * 1e-3) for g in flops if ms.get(g)}
    return {"model": name, "M": M, "config": served.to_json(), "stage_ms": ms, "call_ms": call,
            "floor_pct": floor_pct, "kernels_ms": sum(ms.values()), "dense_ms": {"gemm1": dense1, "gemm2": dense2},
            "tflops": {g: flops[g] / ms[g] / 1e9 for g in flops if ms.get(g)},
            "dense_tflops": {"gemm1": flops["gemm1"] / dense1 / 1e9, "gemm2": flops["gemm2"] / dense2 / 1e9}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=list(MODEL_SHAPES), choices=list(MODEL_SHAPES))
    p.add_argument("--M", nargs="*", type=int, default=[1024, 2048, 4096])
    p.add_argument("--calls", type=int, default=20,
                   help="profiled calls per input set a cell's kernel times are averaged over")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--sets", type=int, default=4, help="input sets (routings) the calls cycle through")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    if a.calls < 1 or a.sets < 1:
        p.error(f"--calls and --sets must be >= 1, got {a.calls} and {a.sets}")
    bw = copy_bandwidth(repeats=20)
    rows: list[dict[str, Any]] = []
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    print("model | M | call us | kernels us | routing | gemm1 | gemm2 | mlp | reduce | gemm1 TF/s (dense) | "
          "gemm2 TF/s (dense) | gemm1 % floor | gemm2 % floor | mlp % floor", flush=True)
    for model in a.shapes:
        for M in a.M:
            r = stages_cell(model, M, a.calls, a.reps, a.sets, bw)
            rows.append(r)
            s, t, d = r["stage_ms"], r["tflops"], r["dense_tflops"]
            print(f"{model} | {M} | {r['call_ms'] * 1e3:.1f} | {r['kernels_ms'] * 1e3:.1f} | "
                  + " | ".join(f"{s.get(k, 0.0) * 1e3:.1f}" for k in ("routing", "gemm1", "gemm2", "mlp", "reduce"))
                  + f" | {t.get('gemm1', 0):.0f} ({d['gemm1']:.0f}) | {t.get('gemm2', 0):.0f} ({d['gemm2']:.0f})"
                  + "".join(f" | {r['floor_pct'].get(g, 0):.0f}" for g in ("gemm1", "gemm2", "mlp")), flush=True)
            with open(a.json, "w", encoding="utf-8") as f:
                json.dump({"device": torch.cuda.get_device_name(), "copy_bandwidth_GBps": bw / 1e9, "rows": rows},
                          f, indent=1)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
