"""RMSNorm bandwidth on a GPU: flyreg (as served) vs its default vs torch eager, torch.compile and Liger.

``no_pdl`` is the served config launched as a plain kernel: on Hopper the plugin launches its
kernels as programmatic dependents, which lets one call start while the call before it drains.
Bytes per call: x read + y written + weight read. Every number comes from this run, side by
side, as a fraction of the device-to-device copy bandwidth measured in the same run.

Timing is steady state: each implementation runs on ``K`` input sets in turn (together at least
512 MB, so no call finds its x in the 60 MiB L2), ``--inner`` calls captured in one CUDA graph
(host launch cost out), time per call = replay time / calls, median of ``--reps`` replays. Each
call allocates its output, as it does in a model, and pays the write-back of what it wrote like
any kernel in a forward pass. Flushing the L2 by zeroing a buffer before each timed call instead
(``triton.testing.do_bench``) leaves up to 60 MB of dirty lines that the timed call must write
back for the flush: at M = 32768, N = 1024 (134 MB a call) that reads 10 % slower for every
implementation alike. The copy reference is a 2 GiB ``copy_`` timed with events around eager
calls (see :func:`copy_tbps`); ``copy@shape`` is ``y.copy_(x)`` at the call's own shape, in graphs
(so it reads low from 512 MB up, like the graph-captured 2 GiB copy).

Each input set has its own copy of the weight, as each layer of a model has its own: a call finds
its weight in DRAM, not in the L2 where the call before it left it, as a search also times it
(``--shared-weight``: one weight for every call). On the H200 a shared weight makes configs of few
warps per program read up to 7 % faster at 4096 x 1536 and 2048 and leaves wide-warp configs as
they are, so the two orders differ (``docs/decisions.md``, "The benchmark's weight").

    python plugins/flyreg-rmsnorm/bench/rmsnorm_bandwidth.py [--M 1 32 256 4096 32768] [--N 128 ... 16384] [--repeat K] [--shared-weight]
        [--json out.json]

A peer within ``--recheck`` (1 %) of flyreg is timed again against flyreg in ``--rounds`` (5)
back-to-back pairs, alternating which goes first: one pass over the grid moves a cell by up to
1 % from run to run at 30 us calls, more than such a pair differs, so the bars use the pairs'
median there (``bandwidth_table.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

import torch

import flyreg
from flyreg_rmsnorm.ops import rmsnorm as RMSNORM  # the op's plugin object, as its entry point names it

from flyreg_rmsnorm_bench.bandwidth_table import PEERS, best_peer

GRID_N = (128, 512, 1024, 1536, 2048, 2880, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 12288, 16384)
GRID_M = (1, 32, 256, 4096, 32768)
EPS = 1e-6
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def steady_ms(fns: list[Callable[[], Any]], inner: int, reps: int) -> float:
    """Median milliseconds per call of ``inner`` calls cycling through ``fns``, captured in CUDA graphs and
    replayed (``flyreg.do_bench``'s graph mode), every call's output alive until the replay ends, so outputs
    rotate past the L2 like the inputs (as a search's steady-state replay keeps them)."""
    def body() -> None:
        alive = [fns[i % len(fns)]() for i in range(inner)]
        del alive

    return flyreg.do_bench(body, 1, reps, device="cuda", cuda_graph=True, flush_l2=False).median / inner


def copy_tbps(reps: int) -> float:
    """A 2 GiB ``copy_``, timed with events around eager calls: captured in a CUDA graph, torch's copy
    of a tensor this large reads about 35 % slower on the H200 (2.77 against 4.27 TB/s), and at 1 ms
    a call launch cost does not show."""
    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    dst = torch.empty_like(src)
    for _ in range(300):  # about a second of load: clocks up before anything counts
        dst.copy_(src)
    times = []
    for _ in range(max(reps, 10)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return 2 * src.numel() * src.element_size() / (statistics.median(times) * 1e-3) / 1e12


_COMPILED: Any = None


def _compiled() -> Any:
    global _COMPILED
    if _COMPILED is None:
        try:
            torch._dynamo.config.cache_size_limit = 4096  # one static graph per shape, never the eager fallback
            if hasattr(torch._dynamo.config, "recompile_limit"):
                torch._dynamo.config.recompile_limit = 4096
            _COMPILED = torch.compile(torch.nn.functional.rms_norm, dynamic=False)
        except Exception:  # torch.compile unavailable: leave the column out
            _COMPILED = False
    return _COMPILED or None


def _liger() -> Any:
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return None
    return lambda x, w: LigerRMSNormFunction.apply(x, w, EPS)


def implementations(x: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[torch.Tensor, torch.Tensor], Any]]:
    """Each implementation as a function of (x, w) for calls like ``(x, w)`` (eps fixed), returning y."""
    plugin = RMSNORM
    spec = plugin.specialize((x, w), {})
    default = plugin.default(spec)
    default_bound = bound(plugin, default, spec, x, w)
    tuner = flyreg.op("rmsnorm")
    served = tuner.resolve(x, w, EPS).config
    # The served config launched as a plain (not programmatic-dependent) kernel: what PDL adds.
    no_pdl = bound(plugin, served, spec, x, w, pdl=False)
    n = x.shape[-1]
    fns: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
        "flyreg": lambda x, w: tuner(x, w, EPS),
        "no_pdl": lambda x, w: no_pdl(x, w, EPS),
        "default": lambda x, w: default_bound(x, w, EPS),
        "torch": lambda x, w: torch.nn.functional.rms_norm(x, (n,), w, EPS),
    }
    compiled = _compiled()
    if compiled is not None:
        fns["compile"] = lambda x, w: compiled(x, (n,), w, EPS)
    liger = _liger()
    if liger is not None:
        fns["liger"] = liger
    return fns


def reference(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """RMSNorm in float64, the check every measured implementation passes first."""
    return x.double() * torch.rsqrt(x.double().square().mean(-1, keepdim=True) + eps) * w.double()


def call_bytes(x: torch.Tensor) -> int:
    """Bytes an RMSNorm call on ``x`` moves: x read, y written, the weight read."""
    return (2 * x.numel() + x.shape[-1]) * x.element_size()


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error of ``y`` against a float64 ``ref`` (:func:`reference`)."""
    return ((y.double() - ref).norm() / ref.norm()).item()


def replay_calls(nbytes: int, nsets: int, inner: int = 50) -> int:
    """Calls a replay for calls of ``nbytes``: ``inner``, four times that at 16 MB or less (short
    calls), and at least one round through the ``nsets`` input sets."""
    return max(inner if nbytes > (16 << 20) else 4 * inner, nsets)


def bound(plugin: Any, config: Any, spec: dict[str, Any], x: torch.Tensor, w: torch.Tensor,
          **options: Any) -> Callable[..., torch.Tensor]:
    """The RMSNorm plugin's launcher of ``config`` bound to calls like ``(x, w, EPS)``."""
    return plugin.build(config, spec).bind((x, w), {"eps": EPS, **config.hints, **options})


def rotating_inputs(M: int, N: int, dtype: torch.dtype, min_sets: int = 1
                    ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """``(xs, ys, w)``: enough M x N input sets (with an output each) that x and y together span
    512 MB, so no call finds its x in L2 (at most 64, at least ``min_sets``), and a weight in [0.5, 1.5)."""
    nsets = max(min_sets, min(64, -(-(512 << 20) // (2 * M * N * torch.finfo(dtype).bits // 8))))
    xs = [torch.randn(M, N, device="cuda", dtype=dtype) for _ in range(nsets)]
    return xs, [torch.empty_like(x) for x in xs], torch.rand(N, device="cuda", dtype=dtype) + 0.5


def weight_copies(w: torch.Tensor, nsets: int, shared: bool = False) -> list[torch.Tensor]:
    """A weight for each of ``nsets`` input sets: ``w`` and copies of it (``shared``: ``w`` each time)."""
    return [w if shared or i == 0 else w.clone() for i in range(nsets)]


def paired_ratios(a: list[Callable[[], Any]], b: list[Callable[[], Any]], rounds: int,
                  time: Callable[[list[Callable[[], Any]]], float]) -> list[float]:
    """``rounds`` ratios of b's time over a's (> 1: a is faster), each from the two timed back to
    back by ``time``, a first in even rounds and b first in odd ones, so a drift over the run (clocks,
    a neighbour on the host) weighs on both alike."""
    out = []
    for k in range(rounds):
        if k % 2 == 0:
            ta = time(a)
            tb = time(b)
        else:
            tb = time(b)
            ta = time(a)
        out.append(tb / ta)
    return out


def measure_shape(M: int, N: int, dtype: torch.dtype, inner: int, reps: int, recheck: float = 0.0,
                  rounds: int = 5, shared_weight: bool = False) -> dict[str, Any]:
    """One row of the table. With ``recheck``, every peer within that fraction of flyreg is timed
    again against flyreg in ``rounds`` back-to-back pairs (:func:`paired_ratios`), kept under
    ``row["recheck"][peer]`` as flyreg's speed over the peer's. Each set has its own weight unless
    ``shared_weight``."""
    xs, ys, w = rotating_inputs(M, N, dtype)
    nsets = len(xs)
    ws = weight_copies(w, nsets, shared_weight)
    nbytes = call_bytes(xs[0])
    res = flyreg.resolve("rmsnorm", xs[0], w, EPS)
    row: dict[str, Any] = {"M": M, "N": N, "sets": nsets, "config": repr(res.config), "source": res.origin}
    ref = reference(xs[0], w)
    calls = replay_calls(nbytes, nsets, inner)
    row["copy@shape"] = nbytes / (steady_ms([lambda i=i: ys[i].copy_(xs[i]) for i in range(nsets)], calls, reps)
                                  * 1e-3) / 1e12
    timed: dict[str, list[Callable[[], Any]]] = {}
    for name, fn in implementations(xs[0], w).items():
        try:
            y = fn(xs[0], ws[0])
            err = rel_err(y, ref)
            if not err < TOL[dtype]:
                raise AssertionError(f"relative error {err:.2e} against float64")
            timed[name] = [lambda x=x, v=v, fn=fn: fn(x, v) for x, v in zip(xs, ws)]
            ms = steady_ms(timed[name], calls, reps)
        except Exception as e:  # a peer failing on a shape leaves its cell empty, with the reason
            row[name] = None
            row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:160]
            continue
        row[name] = nbytes / (ms * 1e-3) / 1e12
        row[f"{name}_us"] = ms * 1e3
    fly = row.get("flyreg")
    close = [p for p in PEERS
             if recheck > 0 and rounds > 0 and fly and row.get(p) and abs(fly / row[p] - 1) <= recheck]
    for p in close:
        row.setdefault("recheck", {})[p] = paired_ratios(timed["flyreg"], timed[p], rounds,
                                                         lambda fns: steady_ms(fns, calls, reps))
    return row


def merged(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from repeated measurements of a shape: the median of each implementation's TB/s
    (None where any repeat failed, with that repeat's error), its time per call recomputed from
    that median, the rest from the first repeat; ``repeats`` counts them."""
    out = dict(rows[0], repeats=len(rows))
    for name in [k for k, v in rows[0].items() if (isinstance(v, float) or v is None and k in PEERS)
                 and not (k.endswith("_us") and k.removesuffix("_us") in rows[0])]:
        vals = [r.get(name) for r in rows]
        if all(isinstance(v, float) for v in vals):
            out[name] = statistics.median(vals)
            if f"{name}_us" in rows[0]:  # the same call, so us scale inversely with TB/s
                out[f"{name}_us"] = rows[0][f"{name}_us"] * rows[0][name] / out[name]
        else:
            out[name] = None
            out.pop(f"{name}_us", None)
            out[f"{name}_error"] = next((r[f"{name}_error"] for r in rows if f"{name}_error" in r), "failed")
    rechecked = {p: [v for r in rows for v in r.get("recheck", {}).get(p, [])] for p in PEERS}
    if any(rechecked.values()):  # every repeat's pairs, whichever repeats found the peer close
        out["recheck"] = {p: v for p, v in rechecked.items() if v}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", type=int, nargs="+", default=list(GRID_M))
    ap.add_argument("--N", type=int, nargs="+", default=list(GRID_N))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--inner", type=int, default=50, help="calls per CUDA graph")
    ap.add_argument("--reps", type=int, default=7, help="graph replays; the median is reported")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure each shape this many times (fresh inputs each) and report the medians")
    ap.add_argument("--recheck", type=float, default=0.01,
                    help="time each peer within this fraction of flyreg again, in back-to-back pairs (0: never)")
    ap.add_argument("--rounds", type=int, default=5, help="pairs per recheck; the table reports their median")
    ap.add_argument("--shared-weight", action="store_true",
                    help="one weight for every call (it stays in L2) instead of a copy per input set")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()
    if args.rounds < 1 or args.recheck < 0:
        ap.error("--rounds must be at least 1 and --recheck at least 0")
    dtype = getattr(torch, args.dtype)
    copy = copy_tbps(args.reps)
    weights = "shared" if args.shared_weight else "per set"
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, copy {copy:.2f} TB/s, {args.dtype}, "
          f"weight {weights}")
    print(f"{'M':>6} {'N':>6} {'flyreg':>7} {'%copy':>6} {'no_pdl':>7} {'default':>7} {'tuned/def':>9} "
          + " ".join(f"{p:>7}" for p in PEERS) + f" {'vs best':>7} {'copy@shape':>10}  source config")
    rows = []
    for M in args.M:
        for N in args.N:
            row = merged([measure_shape(M, N, dtype, args.inner, args.reps, args.recheck, args.rounds,
                                        args.shared_weight)
                          for _ in range(args.repeat)])
            rows.append(row)
            fly, best = row.get("flyreg"), best_peer(row)[1]
            vs = fly / best if fly and best else float("nan")
            tuned_vs_default = fly / row["default"] if fly and row.get("default") else float("nan")
            cell = lambda k: f"{row[k]:7.2f}" if row.get(k) else f"{'-':>7}"  # noqa: E731
            print(f"{M:>6} {N:>6} {cell('flyreg')} {100 * (fly or 0) / copy:5.1f}% {cell('no_pdl')} {cell('default')} "
                  f"{tuned_vs_default:8.2f}x " + " ".join(cell(p) for p in PEERS)
                  + f" {vs:6.2f}x {row['copy@shape']:10.2f}  {row['source']} {row['config']}", flush=True)
            for k in [k for k in row if k.endswith("_error")]:
                print(f"       {k}: {row[k]}")
            for p, ratios in row.get("recheck", {}).items():
                print(f"       flyreg / {p} in {len(ratios)} back-to-back pairs: "
                      f"median {statistics.median(ratios):.4f}x ({min(ratios):.4f} to {max(ratios):.4f})")
            if args.json:  # after every row: an interrupted run keeps what it measured
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump({"copy_tbps": copy, "device": torch.cuda.get_device_name(), "dtype": args.dtype,
                               "torch": torch.__version__, "recheck_band": args.recheck, "weights": weights,
                               "rows": rows}, f, indent=1)


def main_on_cuda(script: str, main: Callable[[], None]) -> None:
    """Run a benchmark's ``main``, or say it measured nothing where there is no CUDA device."""
    if torch.cuda.is_available():
        main()
    else:
        print(f"{script}: needs a CUDA device; nothing measured")


if __name__ == "__main__":
    main_on_cuda("rmsnorm_bandwidth", main)
