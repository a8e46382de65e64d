"""RMSNorm design probes on a GPU: timing methods and kernel variants, launch paths, parallel compile.

The figures behind the design choices in docs/performance.md, each sub-command one probe:

    python plugins/flyreg-rmsnorm/bench/rmsnorm_variants.py timing     # zero-flush vs read-flush vs steady state; kernel variants
    python plugins/flyreg-rmsnorm/bench/rmsnorm_variants.py launch     # host us per call of the launch paths, C launcher included
    TRITON_CACHE_DIR=$(mktemp -d) python plugins/flyreg-rmsnorm/bench/rmsnorm_variants.py compile serial|threads|async

``timing`` times, for bf16 shapes, the plugin's kernel over its whole-row configs, a persistent
variant (a grid of 2 to 8 programs per SM looping over row tiles, 1 to 3 pipeline stages,
optionally ``evict_first`` loads), an in-shape ``copy_``, torch and Liger, three ways: one call
after zeroing a 256 MB buffer (dirty L2), one call after reading a 256 MB buffer (clean L2), and
steady state (rotating input sets in a CUDA graph: ``rmsnorm_bandwidth.steady_ms``). ``compile``
compiles 33 candidate binaries one after another, on 16 threads, or on 16 threads under Triton's
``AsyncCompileMode``; give each run a fresh ``TRITON_CACHE_DIR``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import triton
import triton.language as tl
from flyreg_rmsnorm_bench.rmsnorm_bandwidth import (EPS, call_bytes, reference, rel_err, rotating_inputs,
                               steady_ms)

SHAPES = [(32768, 1024), (32768, 4096), (32768, 8192), (4096, 1024), (4096, 4096), (4096, 8192), (4096, 16384),
          (256, 4096), (32, 4096)]


def flushed_ms(fn: Callable[[], Any], reps: int, flush: torch.Tensor | None, mode: str, sink: torch.Tensor) -> float:
    """Median ms of single calls, each after ``flush`` is zeroed (``mode="zero"``) or read (``"read"``);
    no flush when ``flush`` is None."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    for i in range(reps):
        if flush is None:
            pass
        elif mode == "zero":
            flush.zero_()
        else:
            torch.amax(flush, out=sink)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


@triton.jit
def _persistent_rmsnorm(X, W, Y, M, N, stride_x, eps, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                        STAGES: tl.constexpr, EVICT: tl.constexpr):
    # Persistent variant: each program loads the weight once and loops over row tiles.
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    for t in tl.range(tl.program_id(0), tl.cdiv(M, ROWS), tl.num_programs(0), num_stages=STAGES):
        rows = t.to(tl.int64) * ROWS + tl.arange(0, ROWS)
        mask = (rows < M)[:, None] & col_mask[None, :]
        ptrs = X + rows[:, None] * stride_x + cols[None, :]
        if EVICT:
            x = tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        tl.store(Y + rows[:, None] * N + cols[None, :], (x * rstd[:, None] * w[None, :]).to(Y.dtype.element_ty),
                 mask=mask)


def _variants(M: int, N: int, xs: list[torch.Tensor], ys: list[torch.Tensor], w: torch.Tensor,
              sms: int) -> dict[str, Callable[[int], Callable[[], Any]]]:
    """name -> (input set index -> call)."""
    from flyreg_rmsnorm import space
    from flyreg_rmsnorm import triton_kernels as tk

    spec = {"N": N, "dtype": "bfloat16", "M": space.row_bucket(M)}
    default = space.triton_default(spec)
    P = triton.next_power_of_2(N)

    def plugin_kernel(rows: int, warps: int) -> Callable[[int], Callable[[], Any]]:
        grid = (triton.cdiv(M, rows),)
        consts = tk._constexprs(M, N, P, rows, False, N)
        return lambda i: (lambda: tk._rmsnorm_kernel[grid](xs[i], w, ys[i], M, N, EPS, **consts, num_warps=warps))

    def persistent(rows: int, warps: int, stages: int, evict: bool, per_sm: int) -> Callable[[int], Callable[[], Any]]:
        grid = (min(triton.cdiv(M, rows), sms * per_sm),)
        return lambda i: (lambda: _persistent_rmsnorm[grid](xs[i], w, ys[i], M, N, N, EPS, BLOCK_N=P, ROWS=rows,
                                                            STAGES=stages, EVICT=evict, num_warps=warps))

    out: dict[str, Callable[[int], Callable[[], Any]]] = {
        "copy_ at this shape": lambda i: (lambda: ys[i].copy_(xs[i])),
        f"default {default}": plugin_kernel(default.kwargs["ROWS"], default.hints["num_warps"]),
    }
    for c in space.triton_configs(spec):
        if c.kwargs["BLOCK_N"] >= N and c != default:
            out[f"plugin R{c.kwargs['ROWS']} w{c.hints['num_warps']}"] = plugin_kernel(c.kwargs["ROWS"],
                                                                                        c.hints["num_warps"])
    for rows in (r for r in (1, 2, 4, 8) if r * P <= 16384 and r <= M):
        warps = space.warps_for(rows * P)
        for stages in (1, 2, 3):
            for per_sm in (2, 4, 8):
                out[f"persistent R{rows} w{warps} st{stages} x{per_sm}"] = persistent(rows, warps, stages, False,
                                                                                       per_sm)
        out[f"persistent R{rows} w{warps} st2 x4 evict"] = persistent(rows, warps, 2, True, 4)
    out["torch"] = lambda i: (lambda: torch.nn.functional.rms_norm(xs[i], (N,), w, EPS))
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return out
    out["liger"] = lambda i: (lambda: LigerRMSNormFunction.apply(xs[i], w, EPS))
    return out


def timing() -> None:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    zero_buf = torch.empty(256 << 20, dtype=torch.int8, device=dev)
    read_buf = torch.randn(64 << 20, dtype=torch.float32, device=dev)
    sink = torch.empty((), dtype=torch.float32, device=dev)
    src = torch.randn(1 << 30, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(200):
        dst.copy_(src)
    copy = 4 * src.numel() / (flushed_ms(lambda: dst.copy_(src), 20, None, "", sink) * 1e-3) / 1e12
    print(f"copy 2 GiB {copy:.3f} TB/s, {sms} SMs")
    del src, dst
    for M, N in SHAPES:
        xs, ys, w = rotating_inputs(M, N, torch.bfloat16, min_sets=2)
        nbytes = call_bytes(xs[0])
        nsets = len(xs)
        ref = reference(xs[0], w)
        rows = []
        for name, make in _variants(M, N, xs, ys, w, sms).items():
            try:
                fns = [make(i) for i in range(nsets)]
                out = fns[0]()
                if not name.startswith("copy_"):
                    y = out if isinstance(out, torch.Tensor) and out.shape == ref.shape else ys[0]
                    err = rel_err(y, ref)
                    if not err < 1e-2:
                        print("WRONG", name, err)
                        continue
                times = (flushed_ms(fns[0], 30, zero_buf, "zero", sink), flushed_ms(fns[0], 30, read_buf, "read", sink),
                         steady_ms(fns, max(nsets, 20), 5))
            except Exception as e:  # a variant that does not compile or launch is reported and skipped
                print("FAILED", name, type(e).__name__, str(e)[:100])
                continue
            rows.append((name, *times))
        print(f"\n== M={M} N={N} ({nbytes / 1e6:.1f} MB a call, {nsets} input sets): % of copy "
              f"zero-flushed / read-flushed / steady state")
        rows.sort(key=lambda r: r[3])
        shown = rows[:14] + [r for r in rows[14:] if r[0].startswith(("default", "torch", "liger", "copy_"))]
        for name, zero, read, steady in shown:
            pct = [100 * nbytes / (t * 1e-3) / 1e12 / copy for t in (zero, read, steady)]
            print(f"  {name:34s} {pct[0]:6.1f}% {pct[1]:6.1f}% {pct[2]:6.1f}%   ({steady * 1e3:.1f} us)")


def launch() -> None:
    from launch_overhead import measure
    from triton import knobs
    from triton.runtime import driver

    from flyreg_rmsnorm import triton_kernels as tk

    M, N = 1, 4096
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(N, device="cuda", dtype=torch.bfloat16) + 0.5
    y = torch.empty_like(x)
    kernel = tk._rmsnorm_kernel
    constexprs = tk._constexprs(M, N, 4096, 1, False, N)
    const_args = [constexprs[n] for n in kernel.arg_names[6:]]  # in the kernel's parameter order
    compiled = kernel.warmup(x, w, y, M, N, EPS, grid=(1,), **constexprs, num_warps=8)
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    stream_of = driver.active.get_current_stream
    dev = x.device.index
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook

    def c_launch(out: torch.Tensor) -> torch.Tensor:
        run(1, 1, 1, stream_of(dev), function, packed, None, enter, leave, x, w, out, M, N, EPS, *const_args)
        return out

    fns = {
        "kernel[grid](...), output preallocated": lambda: kernel[(1,)](x, w, y, M, N, EPS, **constexprs,
                                                                          num_warps=8),
        "torch.empty + kernel[grid](...)": lambda: kernel[(1,)](x, w, torch.empty((M, N), dtype=x.dtype,
                                                                                  device=x.device),
                                                                 M, N, EPS, **constexprs, num_warps=8),
        "C launcher, output preallocated": lambda: c_launch(y),
        "C launcher + torch.empty": lambda: c_launch(torch.empty((M, N), dtype=x.dtype, device=x.device)),
        "C launcher + torch.empty_like": lambda: c_launch(torch.empty_like(x)),
        "C launcher + x.new_empty": lambda: c_launch(x.new_empty((M, N))),
        "torch.empty alone": lambda: torch.empty((M, N), dtype=x.dtype, device=x.device),
        "torch.empty_like alone": lambda: torch.empty_like(x),
        "current stream": lambda: stream_of(dev),
        "two launch-hook knob reads": lambda: (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook),
        "torch.nn.functional.rms_norm": lambda: torch.nn.functional.rms_norm(x, (N,), w, EPS),
    }
    ref = reference(x, w)
    y.zero_()
    c_launch(y)
    torch.cuda.synchronize()
    print(f"C launcher relative error vs float64: {((y.double() - ref).norm() / ref.norm()).item():.2e}")
    print("\n== host us per call, RMSNorm 1 x 4096 bf16 (10000 calls x 5 runs, median)")
    for name, us in measure(fns, 10000, 5).items():
        print(f"  {name:40s} {us:7.2f}")


def compile_candidates(mode: str) -> None:
    from flyreg_rmsnorm import space
    from flyreg_rmsnorm import triton_kernels as tk

    x = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(4096, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    cands = [(N, c) for N, dt in ((4096, "bfloat16"), (2048, "float16"))
             for c in space.triton_configs({"N": N, "dtype": dt, "M": 4096})]

    def compile_one(item: tuple[int, Any]) -> Any:
        N, c = item
        k = c.kwargs
        consts = {**tk._constexprs(4096, N, k["BLOCK_N"], k["ROWS"], False, N), "MASK_ROWS": True}
        return tk._rmsnorm_kernel.warmup(x, w, y, 4096, N, EPS, grid=(1,), **consts, **c.hints)

    t0 = time.perf_counter()
    if mode == "serial":
        for item in cands:
            compile_one(item)
    elif mode == "threads":
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(compile_one, cands))
    elif mode == "async":
        from triton.runtime._async_compile import AsyncCompileMode

        with ThreadPoolExecutor(16) as pool, AsyncCompileMode(pool):
            futures = [compile_one(item) for item in cands]
        for f in futures:
            if hasattr(f, "result"):
                f.result()
    else:
        raise SystemExit(f"compile mode must be serial, threads or async, got {mode!r}")
    print(f"== compile {mode}: {len(cands)} kernels in {time.perf_counter() - t0:.2f} s")


def main(argv: list[str]) -> int:
    if not torch.cuda.is_available():
        print("rmsnorm_variants: needs a CUDA device; nothing measured")
        return 0
    what = argv[0] if argv else ""
    if what == "timing":
        timing()
    elif what == "launch":
        launch()
    elif what == "compile" and len(argv) == 2:
        compile_candidates(argv[1])
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
