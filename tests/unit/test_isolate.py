"""Candidates in a worker process: an abort or a hang fails that config only, and the search goes on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flyreg import Config
from flyreg._search.isolate import IsolationError, WorkerEvaluator

from isolate_toys import broken_setup, toy_timer


def cfg(mode: str, cost: float) -> Config:
    return Config({"MODE": mode, "COST": cost})


def pids(marker: Path) -> list[int]:
    return [int(line) for line in marker.read_text().split()]


def test_an_abort_and_a_hang_are_failures_and_the_right_winner_is_found(tmp_path: Path) -> None:
    marker = tmp_path / "pids"
    configs = [cfg("ok", 3.0), cfg("abort", 0.1), cfg("ok", 2.0), cfg("hang", 0.1), cfg("ok", 1.0),
               cfg("raise", 0.1), cfg("ok", 4.0)]
    with WorkerEvaluator(toy_timer, (str(marker),), start_seconds=120, min_seconds=2.0, factor=2.0) as ev:
        times = ev.evaluate(configs)
        outcomes = ev.outcomes
        replaced = ev.replaced
    ok = {c: t for c, t in times.items() if t is not None}
    assert min(ok, key=ok.__getitem__) == cfg("ok", 1.0)
    assert set(ok) == {cfg("ok", c) for c in (1.0, 2.0, 3.0, 4.0)}
    assert "SIGABRT" in (outcomes[cfg("abort", 0.1)].error or "")
    assert "timed out after" in (outcomes[cfg("hang", 0.1)].error or "")
    assert "RuntimeError: illegal value" in (outcomes[cfg("raise", 0.1)].error or "")
    assert replaced == 2  # the abort and the hang; a raising config keeps its worker
    seen = pids(marker)
    assert os.getpid() not in seen  # nothing ran in the caller's process
    assert len(set(seen)) == 3


def test_the_time_limit_adapts_to_the_configs_already_timed(tmp_path: Path) -> None:
    marker = tmp_path / "pids"
    with WorkerEvaluator(toy_timer, (str(marker),), start_seconds=120, min_seconds=0.5, factor=3.0) as ev:
        assert ev.limit() == 120  # while the worker starts
        ev.evaluate([cfg("slow", 0.05), cfg("slow", 0.05)])
        assert 0.5 <= ev.limit() < 5
        times = ev.evaluate([cfg("slow", 8.0), cfg("ok", 1.0)])
    assert times[cfg("slow", 8.0)] is None and times[cfg("ok", 1.0)] == 1.0
    assert "timed out" in (ev.outcomes[cfg("slow", 8.0)].error or "")


def test_a_worker_that_cannot_set_up_is_one_clear_error() -> None:
    with pytest.raises(IsolationError, match="could not set up: ImportError: no such kernel library"):
        with WorkerEvaluator(broken_setup, start_seconds=120) as ev:
            ev.evaluate([cfg("ok", 1.0)])


def test_bad_limits_are_rejected() -> None:
    with pytest.raises(ValueError, match="min_seconds must be > 0"):
        WorkerEvaluator(toy_timer, ("x",), min_seconds=0)


def test_a_registered_op_is_timed_in_the_worker_like_in_a_search() -> None:
    from flyreg._plugins.timing import op_config_timer

    spec = {"M": 32, "N": 1024, "backend": "cpu", "dtype": "float32"}
    configs = [Config({"ROW_BLOCK": r}) for r in (8, 32)]
    with WorkerEvaluator(op_config_timer, ("rmsnorm", spec, "cpu"), start_seconds=300) as ev:
        times = ev.evaluate([*configs, Config({"ROW_BLOCK": -1})])
    assert all(times[c] is not None and times[c] > 0 for c in configs)
    assert times[Config({"ROW_BLOCK": -1})] is None
    assert "ROW_BLOCK must be a positive int" in (ev.outcomes[Config({"ROW_BLOCK": -1})].error or "")
