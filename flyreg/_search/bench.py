"""Timing a callable: device events on a GPU, ``perf_counter`` on the CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from flyreg._core.device_facts import flush_bytes
from flyreg._core.results import BenchResult
from flyreg._core.search_terms import TIMINGS, check_counts

__all__ = ["TIMINGS", "WARM_SECONDS", "check_counts", "device_kind", "do_bench", "warm_device"]


def device_kind(device: Any) -> str:
    """``"cuda"``, ``"cpu"``, ...: the type of a ``torch.device`` or of a device string (``"cuda:1"``)."""
    return getattr(device, "type", None) or str(device).partition(":")[0]


def do_bench(
    fn: Callable[[], Any],
    warmup: int = 5,
    rep: int = 20,
    *,
    setup: Callable[[], Any] | None = None,
    device: Any = "cpu",
    flush_l2: bool = True,
    cuda_graph: bool = False,
) -> BenchResult:
    """Time ``fn()`` over ``rep`` runs after ``warmup`` runs (counts, not milliseconds).

    ``setup()`` runs before every run, outside the timed region (restore inputs there).
    On a CUDA ``device`` each run is timed with CUDA events, the L2 is flushed before each
    run unless ``flush_l2`` is false, and ``cuda_graph=True`` times graph replays instead of
    launches (for launch-bound kernels; ``setup`` is captured too and its own time subtracted).
    """
    check_counts(warmup, rep)
    if not callable(fn) or (setup is not None and not callable(setup)):
        raise TypeError("do_bench: fn (and setup, when given) must be callables of no arguments")
    if device_kind(device) != "cuda":
        return _bench_cpu(fn, warmup, rep, setup)
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"do_bench: device {device!r} is a CUDA device, but CUDA is not available here")
    dev = torch.device(device)
    with torch.cuda.device(dev):
        if cuda_graph:
            return _bench_graph(torch, fn, warmup, rep, setup)
        return _bench_cuda(torch, dev, fn, warmup, rep, setup, flush_l2)


#: Seconds of back-to-back launches before a search times anything on a GPU: an H200 idle through
#: a compile phase drops to its lowest clock (345 MHz), and the first config timed would read slow.
WARM_SECONDS = 0.05


def warm_device(fn: Callable[[], Any], device: Any, seconds: float = WARM_SECONDS) -> int:
    """Call ``fn()`` back to back for ``seconds`` of wall time on a CUDA ``device`` so its clocks are
    up before timing starts; returns the number of calls (0 off CUDA, where nothing runs)."""
    if device_kind(device) != "cuda":
        return 0
    import torch

    calls = 0
    end = time.perf_counter() + seconds
    with torch.cuda.device(torch.device(device)):
        while calls == 0 or time.perf_counter() < end:
            fn()
            calls += 1
            if calls % 8 == 0:  # the host must not queue more than the GPU runs in ``seconds``
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    return calls


def _bench_cpu(fn: Callable[[], Any], warmup: int, rep: int, setup: Callable[[], Any] | None) -> BenchResult:
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    times = []
    for _ in range(rep):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return BenchResult.of(times)


def _bench_cuda(torch: Any, dev: Any, fn: Callable[[], Any], warmup: int, rep: int,
                setup: Callable[[], Any] | None, flush_l2: bool) -> BenchResult:
    # Taken once per timing and dropped when it returns (torch's caching allocator keeps it reserved
    # for reuse until ``torch.cuda.empty_cache()``); a process that never times on a GPU takes none.
    flush = torch.empty(flush_bytes(dev), dtype=torch.int8, device=dev) if flush_l2 else None
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    torch.cuda.synchronize()
    for i in range(rep):
        if setup is not None:
            setup()
        if flush is not None:
            flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return BenchResult.of([s.elapsed_time(e) for s, e in zip(starts, ends)])


def _bench_graph(torch: Any, fn: Callable[[], Any], warmup: int, rep: int,
                 setup: Callable[[], Any] | None) -> BenchResult:
    inner = 10

    def body() -> None:
        for _ in range(inner):
            if setup is not None:
                setup()
            fn()

    def setup_only() -> None:
        for _ in range(inner):
            setup()  # type: ignore[misc]

    from flyreg._search.graphs import capture

    graphs = [capture(body)]
    if setup is not None:
        graphs.append(capture(setup_only))
    per_graph = []
    for g in graphs:
        for _ in range(warmup):
            g.replay()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
        torch.cuda.synchronize()
        for i in range(rep):
            starts[i].record()
            g.replay()
            ends[i].record()
        torch.cuda.synchronize()
        per_graph.append([s.elapsed_time(e) / inner for s, e in zip(starts, ends)])
    times = per_graph[0]
    if len(per_graph) == 2:
        overhead = statistics.median(per_graph[1])
        times = [max(t - overhead, 0.0) for t in times]
    return BenchResult.of(times)
