"""do_bench on the CPU: a median and a spread; setup before each run, outside the timing."""

from __future__ import annotations

import statistics
import time
import types
import weakref
from typing import Any

import pytest
import torch

from flyreg import BenchResult, do_bench

from cpu_kernels import chunked_double


def test_result_orders_its_quantiles() -> None:
    x = torch.randn(512, 16)
    out = torch.empty_like(x)
    r = do_bench(lambda: chunked_double(x, out, 8), warmup=2, rep=15)
    assert isinstance(r, BenchResult)
    assert r.reps == 15
    assert 0 < r.min <= r.p20 <= r.median <= r.p80 <= r.max
    assert r.spread == pytest.approx((r.p80 - r.p20) / r.median)


def test_time_follows_the_work() -> None:
    x = torch.randn(512, 16)
    out = torch.empty_like(x)
    slow = do_bench(lambda: chunked_double(x, out, 1), warmup=1, rep=9)
    fast = do_bench(lambda: chunked_double(x, out, 512), warmup=1, rep=9)
    assert slow.median > 5 * fast.median  # 512 loop iterations against one


def test_median_is_in_milliseconds() -> None:
    r = do_bench(lambda: time.sleep(0.004), warmup=0, rep=3)
    assert 4.0 <= r.median < 400.0


def test_setup_runs_before_every_run_outside_the_timing() -> None:
    events: list[str] = []
    state = {"value": 0}

    def setup() -> None:
        events.append("setup")
        state["value"] = 0
        time.sleep(0.02)

    def fn() -> None:
        events.append(f"fn:{state['value']}")
        state["value"] += 1

    r = do_bench(fn, warmup=2, rep=5, setup=setup)
    assert events == ["setup", "fn:0"] * 7  # each run sees the state setup left
    assert r.reps == 5
    assert r.median < 10.0  # setup's 20 ms sleep is not in the timing


def test_runs_warmup_plus_rep_times_and_times_only_the_reps(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    clock = iter(range(10_000))
    ticks: list[int] = []

    def fake_counter() -> float:
        ticks.append(1)
        return float(next(clock))

    monkeypatch.setattr(time, "perf_counter", fake_counter)
    r = do_bench(lambda: calls.append(1), warmup=3, rep=4)
    assert len(calls) == 7
    assert len(ticks) == 2 * 4  # one start and one end per timed rep, none for warmup
    assert r.reps == 4


@pytest.mark.parametrize("warmup, rep", [(-1, 5), (1.5, 5), ("3", 5), (True, 5), (None, 5),
                                         (0, 0), (0, -2), (0, 2.0), (0, False), (0, None)])
def test_bad_counts_are_value_errors(warmup: Any, rep: Any) -> None:
    ran: list[int] = []
    with pytest.raises(ValueError, match="warmup" if rep == 5 else "rep"):
        do_bench(lambda: ran.append(1), warmup=warmup, rep=rep)
    assert ran == []


def test_zero_warmup_is_allowed() -> None:
    ran: list[int] = []
    assert do_bench(lambda: ran.append(1), warmup=0, rep=1).reps == 1
    assert len(ran) == 1


def test_non_callable_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        do_bench(3)  # type: ignore[arg-type]


def test_result_of_times() -> None:
    times = [3.0, 1.0, 2.0, 10.0, 4.0]
    r = BenchResult.of(times)
    assert r.median == statistics.median(times)
    assert (r.min, r.max, r.reps) == (min(times), max(times), len(times))
    one = BenchResult.of([2.5])
    assert one.median == one.p20 == one.p80 == 2.5 and one.spread == 0.0
    with pytest.raises(ValueError):
        BenchResult.of([])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where CUDA is absent")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1)])
def test_cuda_device_without_cuda_is_a_clear_error(device: Any) -> None:
    ran: list[int] = []
    with pytest.raises(ValueError, match=r"device .*cuda.* CUDA is not available"):
        do_bench(lambda: ran.append(1), device=device)
    assert ran == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="fakes a CUDA device where there is none")
def test_l2_flush_buffer_is_taken_once_per_timing_and_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """``do_bench`` on a CUDA device faked in torch: one flush buffer per timing (its size:
    ``test_device_facts.py``), zeroed before each timed rep, and dropped (back to the allocator) when the timing
    returns."""
    import contextlib

    made: list[weakref.ref[Any]] = []
    sizes: list[int] = []
    zeroed: list[int] = []
    real_empty = torch.empty

    class Buffer:
        def zero_(self) -> None:
            zeroed.append(1)

    def empty(*size: Any, dtype: Any = None, device: Any = None, **kw: Any) -> Any:
        if device is None or torch.device(device).type != "cuda":
            return real_empty(*size, dtype=dtype, device=device, **kw)
        assert dtype is torch.int8
        sizes.append(int(size[0]))
        buf = Buffer()
        made.append(weakref.ref(buf))
        return buf

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            pass

        def record(self) -> None:
            pass

        def elapsed_time(self, end: Any) -> float:
            return 1.0

    h200 = types.SimpleNamespace(L2_cache_size=60 << 20, multi_processor_count=132, name="NVIDIA H200", major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: h200)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch, "empty", empty)
    for _ in range(2):
        r = do_bench(lambda: None, 2, 5, device="cuda:0")
        assert r.reps == 5
    assert len(sizes) == 2 and all(n > 0 for n in sizes)
    assert len(made) == 2 and all(ref() is None for ref in made)
    assert len(zeroed) == 2 * 5  # timed reps only
