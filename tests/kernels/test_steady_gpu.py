"""Steady-state timing on a real GPU: rotation past the L2, graph replays, the flushed fallback (marker ``gpu``)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from flyreg import Config, autotune_builder
from flyreg._core.device_facts import rotate_bytes
from flyreg._search import steady

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _sets(x: torch.Tensor, prepared: bool = False) -> list[steady.InputSet]:
    n = steady.set_count(x.untyped_storage().nbytes(), prepared)
    return [steady.InputSet((x,), {}, {})] + [steady.copy_inputs((x,), {}) for _ in range(n - 1)]


def _clone(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0].clone()


def test_time_follows_the_bytes_past_the_l2() -> None:
    small = torch.randn(1 << 24, device="cuda")  # 64 MB
    big = torch.randn(1 << 26, device="cuda")  # 256 MB
    t_small = steady.bench_steady(_clone, _sets(small), 3, 10).median
    t_big = steady.bench_steady(_clone, _sets(big), 3, 10).median
    assert 3.0 < t_big / t_small < 5.5  # 4x the bytes, both from HBM


def test_rotation_keeps_inputs_out_of_the_l2() -> None:
    x = torch.randn(1 << 20, device="cuda")  # 4 MB: fits the L2 many times over
    rotated = _sets(x)
    assert len(rotated) * 4 * (1 << 20) >= rotate_bytes()
    t_rotated = steady.bench_steady(_clone, rotated, 3, 20).median
    t_resident = steady.bench_steady(_clone, rotated[:1], 3, 20).median
    assert t_rotated > 1.05 * t_resident  # its L2-resident input is read faster (1.13x on the H200, 2026-12-01)


def test_prepared_replays_see_prepared_inputs() -> None:
    acc = torch.zeros(1 << 16, device="cuda")
    sets = _sets(acc, prepared=True)
    seen = []

    def bump(args: tuple, kwargs: dict) -> torch.Tensor:
        out = args[0].clone()
        args[0].add_(1.0)
        return out

    def prepare(s: steady.InputSet) -> None:
        s[acc].zero_()
        seen.append(s)

    steady.bench_steady(bump, sets, 2, 5, prepare)
    assert {id(s) for s in seen} == {id(s) for s in sets}  # every set, before every replay
    for s in sets:
        assert torch.all(s[acc] == 1.0)  # each set ran exactly once since its last prepare


def test_search_falls_back_to_flushed_timing_when_capture_fails() -> None:
    x = torch.randn(1 << 20, device="cuda")

    def build(config: Config, spec: dict):
        def launch(x: torch.Tensor) -> torch.Tensor:
            y = x * config.kwargs["K"]
            torch.cuda.synchronize()  # not allowed while a graph is captured
            return y
        return launch

    tuner = autotune_builder("steady_fallback_probe", build, lambda x: {"n": x.numel()},
                             [Config({"K": 1.0}), Config({"K": 2.0})])
    before = torch.cuda.current_stream()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = tuner.tune(x, emit=False)
    assert torch.cuda.current_stream() == before  # the failed capture did not leave its stream current
    assert any("cannot be timed in a CUDA graph" in str(w.message) for w in caught)
    assert len(report.timings) == 2 and not report.failed
    assert torch.randn(4, device="cuda").isfinite().all()  # the failed capture left torch's RNG usable


def test_a_given_replay_length_is_the_one_replayed() -> None:
    x = torch.randn(1 << 16, device="cuda")
    sets = _sets(x)
    calls: list[int] = []

    def counted(args: tuple, kwargs: dict) -> torch.Tensor:
        calls.append(1)
        return args[0].clone()

    steady.bench_steady(counted, sets, 1, 2, scale=3, count=2 * len(sets))
    assert len(calls) == 1 + 2 * (3 * 2 * len(sets))  # one warm call, then a side-stream run and the capture
    assert steady.per_call_ms(counted, sets) > 0


def test_every_candidate_of_a_search_shares_one_replay_length(monkeypatch: pytest.MonkeyPatch) -> None:
    from flyreg._search import timers as search

    x = torch.randn(1 << 16, device="cuda")
    seen: list[tuple[int, int | None]] = []
    real = search.bench_steady

    def spy(call: Any, sets: Any, warmup: int, rep: int, prepare: Any = None, scale: int = 1,
            count: int | None = None) -> Any:
        seen.append((scale, count))
        return real(call, sets, warmup, rep, prepare, scale, count)

    monkeypatch.setattr(search, "bench_steady", spy)
    sized: list[int] = []
    real_size = search.replay_length
    monkeypatch.setattr(search, "replay_length", lambda call, sets: sized.append(1) or real_size(call, sets))

    def build(config: Config, spec: dict) -> Any:
        def launch(x: torch.Tensor) -> torch.Tensor:
            for _ in range(config.kwargs["K"]):  # eager calls of very different lengths
                x = x * 1.0
            return x
        return launch

    tuner = autotune_builder("shared_replay_probe", build, lambda x: {"n": x.numel()},
                             [Config({"K": k}) for k in (1, 8, 64)])
    tuner.tune(x, emit=False)
    first_round = [count for scale, count in seen if scale == 1]
    assert len(first_round) == 3 and first_round[0] is not None and len(set(first_round)) == 1
    assert len(sized) == 1 + any(scale > 1 for scale, _ in seen)  # once a round


def test_free_bytes_counts_torchs_cached_blocks() -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    before = steady.free_bytes("cuda")
    del block  # back to torch's cache, not to the driver: still free for a search's copies
    after = steady.free_bytes("cuda")
    assert 0 < before < after <= total
    assert after - before >= 256 << 20
    assert steady.copy_budget(after) <= steady.COPY_BUDGET
