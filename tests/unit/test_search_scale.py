"""Search at scale through the real engine: strategies, budgets, seeds, the op's preferred strategy, the journal."""

from __future__ import annotations

import os

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config
from flyreg.plugin import OpRecord, RecordError, hookimpl

from on_disk import first_round, journal_rows
from test_strategy import QUICK_SHARE, SPACE, cost

UNIT = 300  # loop iterations per unit of work


def steep(config: Config) -> float:
    """``cost`` stretched fivefold above its minimum: the optimum's neighbours do 60 % more work, more
    than this machine's wall-clock noise (about 10 % between calls), so a timing can tell them apart."""
    return 20 + 5 * (cost(config) - 20)


BEST = min(steep(c) for c in SPACE)
DEFAULT = Config({"A": 1, "B": 1, "C": 16}, num_warps=4)  # a poor config, far from the optimum


def toy_op(name: str, space: list[Config] = SPACE, work: Callable[[Config], int] | None = None,
           **options: Any) -> tuple[Any, list[Config]]:
    """An op whose call does ``work(config)`` loop iterations (default: ``steep`` x UNIT); returns it and
    the configs it built, in order."""
    built: list[Config] = []
    work = work or (lambda c: int(steep(c) * UNIT))

    def build(config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
        built.append(config)
        n = work(config)

        def launch(x: torch.Tensor, num_warps: int | None = None) -> torch.Tensor:
            acc = 0
            for i in range(n):
                acc += i
            return x

        return launch

    tuner = flyreg.autotune_builder(name, build, lambda x: {"n": int(x.shape[0])}, space, lambda spec: DEFAULT,
                                    build_cache=BuildCache(), **{"warmup": 1, "rep": 5, **options})
    return tuner, built


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_budgeted_search_reaches_the_optimum_with_a_fraction_of_the_evaluations(seed: int) -> None:
    """2048 configs whose calls do real work: the engine's local search (the default for so large a
    space) times at most 15 % of them and serves a config within 2 % of the exhaustive optimum.

    Wall-clock timings on a machine running more processes than it has cores are not timings: the
    test then says so and skips, rather than pass or fail by chance. A burst of load while the optimum
    alone is timed (a few ms on a shared 2-core machine) can still rank it behind a neighbour, so a search
    that misses is run once more, afresh, before the test fails.
    """
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > (os.cpu_count() or 1):
        pytest.skip(f"1-minute load average {load:.1f} exceeds the {os.cpu_count()} CPUs: wall timings are noise")
    cap = int(len(SPACE) * QUICK_SHARE)
    for attempt in range(2):
        tuner, built = toy_op(f"toy_scale_{attempt}", seed=seed, rep=15)  # medians of 15 calls
        report = tuner.tune(torch.zeros(4), emit=False)
        assert report.tried <= cap and tuner.stats.benchmarks <= cap
        assert len(set(built)) <= cap  # only the configs timed are ever built
        if steep(report.winner) <= 1.02 * BEST:
            break
    assert steep(report.winner) <= 1.02 * BEST
    assert report.default_ms is not None  # the default is always timed: the speedup is known


def test_the_same_seed_takes_the_same_path() -> None:
    """Resuming from the journal (the timings fixed), a search with the same seed asks for exactly the
    configs the first asked for and times none; another seed goes elsewhere and times new ones."""
    tuner, built = toy_op("toy_seed", work=lambda c: 10, seed=7)
    x = torch.zeros(4)
    first = tuner.tune(x, emit=False, search_options={"resume": True})
    benchmarks = tuner.stats.benchmarks
    again = tuner.tune(x, emit=False, search_options={"resume": True})
    assert tuner.stats.benchmarks == benchmarks and again.reused == len(again.timings)
    assert [c for c, _ in again.timings] == [c for c, _ in first.timings]
    other = tuner.tune(x, emit=False, search_options={"resume": True, "seed": 8})
    assert tuner.stats.benchmarks > benchmarks
    assert {c for c, _ in other.timings} != {c for c, _ in first.timings}


def test_effort_and_time_budget() -> None:
    space = SPACE[:300]
    tuner, _ = toy_op("toy_effort", space=space, work=lambda c: 10)
    x = torch.zeros(4)
    assert tuner.tune(x, emit=False).tried <= int(300 * QUICK_SHARE)  # auto: a large space is searched quick
    assert tuner.tune(x, emit=False, search_options={"effort": "full"}).tried == 300
    small, _ = toy_op("toy_small", space=SPACE[:40], work=lambda c: 10)
    assert small.tune(x, emit=False).tried == 40  # auto: a small space is searched whole
    assert small.tune(x, emit=False, search_options={"effort": "quick"}).tried < 40
    slow, _ = toy_op("toy_budget", space=SPACE[:200], work=lambda c: 20000, rep=3)
    timed = slow.tune(x, emit=False, search_options={"effort": "full", "budget_s": 0.05})
    assert 0 < timed.tried < 200  # stopped between batches once the seconds were spent
    with pytest.raises(ValueError, match="budget_s"):
        slow.tune(x, emit=False, search_options={"budget_s": 0})
    with pytest.raises(ValueError, match="effort"):
        slow.tune(x, emit=False, search_options={"effort": "fast"})
    with pytest.raises(TypeError, match="unknown search options"):
        slow.tune(x, emit=False, search_options={"rep": 9})


class PrefersExhaustive:
    """A registered op with 300 configs that asks to be searched exhaustively."""

    def __init__(self, strategy: str | None) -> None:
        self.strategy = strategy

    @hookimpl
    def specialize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"n": int(args[0].shape[0])}

    @hookimpl
    def build(self, config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
        return lambda x: x

    @hookimpl
    def configs(self, spec: dict[str, Any]) -> list[Config]:
        return [Config({"K": k}) for k in range(300)]

    @hookimpl
    def default(self, spec: dict[str, Any]) -> Config:
        return Config({"K": 0})

    @hookimpl
    def describe(self) -> OpRecord:
        return OpRecord(description="prefers a strategy", strategy=self.strategy)


@pytest.mark.parametrize("strategy, tried", [("exhaustive", 300), (None, int(300 * QUICK_SHARE))])
def test_an_op_names_its_preferred_strategy(strategy: str | None, tried: int) -> None:
    name = f"prefers_{strategy}"
    flyreg.register(PrefersExhaustive(strategy), name)
    try:
        tuner = flyreg.op(name)
        assert tuner.settings.strategy == strategy
        report = tuner.tune(torch.zeros(2), emit=False)
        assert report.tried == tried if strategy else report.tried <= tried
    finally:
        flyreg.unregister(name)


def test_a_record_names_a_known_strategy() -> None:
    with pytest.raises(RecordError, match="strategy must be one of"):
        OpRecord(strategy="genetic")
    assert OpRecord.of({"strategy": "local"}).strategy == "local"


# -- the journal ------------------------------------------------------------------------------------------------
def gated_op(name: str) -> Any:
    """``out = 2 * x`` with a reference; K=3 fails to build, K=2 writes a wrong result."""

    def build(config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
        k = config.kwargs["K"]
        if k == 3:
            raise RuntimeError("no such kernel")
        return lambda x: x * (3 if k == 2 else 2)

    return flyreg.autotune_builder(name, build, lambda x: {"n": int(x.shape[0])},
                                   [Config({"K": k}) for k in range(4)], reference=lambda a, kw: a[0] * 2,
                                   build_cache=BuildCache(), warmup=1, rep=3)


def test_every_measurement_and_failure_is_journaled() -> None:
    tuner = gated_op("journaled")
    with pytest.warns(flyreg.FlyregWarning):
        report = tuner.tune(torch.ones(8), emit=False)
    rows = journal_rows("journaled")
    first = first_round(rows)
    assert {m["config"].kwargs["K"] for m in first if m["error"] is None} == {0, 1}
    errors = {m["config"].kwargs["K"]: m["error"] for m in first if m["error"] is not None}
    assert "no such kernel" in str(errors[3]) and str(errors[2]).startswith("rejected: ")
    for m in first:
        assert m["spec"] == {"n": 8} and m["device"]["arch"] and m["toolchain"]["op"] == "0"
    timed = {m["config"]: m["median_ms"] for m in first if m["error"] is None}
    assert all(t is not None and t > 0 and math.isfinite(t) for t in timed.values())
    final = [m for m in rows if m["timing"].startswith("cpu final")]
    assert {m["config"] for m in final} <= set(timed) and len(report.timings) == 2


def test_a_resumed_search_times_nothing_already_journaled() -> None:
    tuner = gated_op("resumed")
    x = torch.ones(8)
    with pytest.warns(flyreg.FlyregWarning):
        first = tuner.tune(x, emit=False, search_options={"resume": True})
    rows = len(journal_rows("resumed"))
    again = tuner.tune(x, emit=False, search_options={"resume": True})
    assert len(journal_rows("resumed")) == rows  # nothing timed, failed or rejected again
    assert again.winner == first.winner and again.reused == len(again.timings)
    assert {c for c, _ in again.failed} == {Config({"K": 3})} and {c for c, _ in again.rejected} == {Config({"K": 2})}
    fresh = tuner.tune(x, emit=False)  # a search not resuming (an online one) times everything and journals it
    assert fresh.reused == 0 and len(journal_rows("resumed")) > rows
