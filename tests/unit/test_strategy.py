"""Search strategies, through a tuner's search: the budgeted local search against the exhaustive optimum on
a toy op whose call takes a known time, the exhaustive search, budgets and the choice of strategy.

The toy's launch busy-waits ``cost(config)`` units of wall time, so every timing the search takes
ranks the configs as ``cost`` does (a busy-wait is only ever lengthened by load, and the median
of the reps drops that).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config

# 16 x 8 x 16 = 2048 configs; the work of a call grows with a known function of the knobs.
SPACE = [Config({"A": a, "B": b, "C": c}, num_warps=4) for a in range(1, 17) for b in (1, 2, 4, 8, 16, 32, 64, 128)
         for c in range(1, 17)]
#: The share of a large space a quick search times at most, and the largest space searched whole by
#: default (docs/cli.md, ``--effort``).
QUICK_SHARE, EXHAUSTIVE_MAX = 0.15, 256
UNIT_S = 1e-5  # wall seconds per unit of cost: the best config waits 0.2 ms, past a preemption's few microseconds
DEFAULT = Config({"A": 1, "B": 1, "C": 16}, num_warps=4)  # a poor config, far from the optimum


def cost(config: Config) -> float:
    """Units of work: a bowl around A=11, B=8, C=6 with an A-C interaction and a far local dip."""
    k = config.kwargs
    a, b, c = int(k["A"]), math.log2(int(k["B"])), int(k["C"])
    dip = 6.0 * math.exp(-((a - 3) ** 2 + (c - 14) ** 2) / 3.0)
    return 20 + 3 * (a - 11) ** 2 + 8 * (b - 3) ** 2 + 2.5 * (c - 6) ** 2 + 0.5 * abs(a - c - 5) - dip


BEST = min(cost(c) for c in SPACE)


def busy_op(name: str, space: list[Config] = SPACE, fails: Callable[[Config], bool] = lambda c: False,
            seconds: Callable[[Config], float] = lambda c: cost(c) * UNIT_S, build_s: float = 0.0,
            **options: Any) -> Any:
    """A tuner whose call busy-waits ``seconds(config)`` and whose build sleeps ``build_s``; a config that
    ``fails`` does not build."""

    def build(config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
        time.sleep(build_s)
        if fails(config):
            raise RuntimeError("no such kernel")
        wait = seconds(config)

        def launch(x: torch.Tensor, num_warps: int | None = None) -> torch.Tensor:
            end = time.perf_counter() + wait
            while time.perf_counter() < end:
                pass
            return x

        return launch

    return flyreg.autotune_builder(name, build, lambda x: {"n": int(x.shape[0])}, space, lambda spec: DEFAULT,
                                   build_cache=BuildCache(), **{"warmup": 0, "rep": 5, **options})


@pytest.mark.parametrize("seed", range(10))
def test_local_search_picks_the_optimum_with_a_fraction_of_the_evaluations(seed: int) -> None:
    tuner = busy_op("busy_local", seed=seed)
    report = tuner.tune(torch.zeros(1), emit=False)
    cap = int(len(SPACE) * QUICK_SHARE)
    assert report.tried <= cap and tuner.stats.benchmarks <= cap
    assert cost(report.winner) <= 1.02 * BEST


#: A second family of configs, as an op's second path: its own knob (PATH), A and C values of its own and 8 warps,
#: so none differs from a SPACE config in one knob alone. Its calls are faster than any of SPACE's.
PATH_FAMILY = [Config({"A": a, "B": b, "C": 100 + c, "PATH": True}, num_warps=8) for a in (21, 22) for b in (2, 4)
               for c in (1, 2)]


def path_cost(config: Config) -> float:
    """``cost`` on SPACE; on PATH_FAMILY a bowl whose best (A=22, B=2, C=102) is half SPACE's best."""
    k = config.kwargs
    if not k.get("PATH"):
        return cost(config)
    a, b, c = int(k["A"]), math.log2(int(k["B"])), int(k["C"]) - 100
    return BEST / 2 + 2 * (a - 22) ** 2 + 2 * (b - 1) ** 2 + 2 * (c - 2) ** 2


@pytest.mark.parametrize("seed", range(4))
def test_local_search_crosses_to_a_family_of_configs_no_single_knob_reaches(seed: int) -> None:
    """From the default (in SPACE) the search steps along PATH to the nearest config of the other family, then
    down its bowl: the winner is that family's best, though no config differs from SPACE's in one knob alone and
    the random sample (42 of 2056) draws one of the family's 8 in about one seed of seven."""
    space = SPACE + PATH_FAMILY
    tuner = busy_op("busy_families", space=space, seconds=lambda c: path_cost(c) * UNIT_S, seed=seed)
    report = tuner.tune(torch.zeros(1), emit=False)
    assert report.tried <= int(len(space) * QUICK_SHARE)
    assert report.winner.kwargs.get("PATH") and path_cost(report.winner) <= 1.02 * min(map(path_cost, PATH_FAMILY))


def test_failed_configs_are_never_expanded_and_the_search_goes_on() -> None:
    def odd(c: Config) -> bool:
        return int(c.kwargs["A"]) % 2 == 1

    tuner = busy_op("busy_failing", fails=odd, seed=0)
    with pytest.warns(flyreg.FlyregWarning, match="no such kernel"):
        report = tuner.tune(torch.zeros(1), emit=False)
    ok = [c for c, _ in report.timings]
    assert ok and not any(odd(c) for c in ok) and all(odd(c) for c, _ in report.failed)
    assert cost(report.winner) <= 1.02 * min(cost(c) for c in SPACE if not odd(c))


def test_a_time_budget_stops_the_search() -> None:
    tuner = busy_op("busy_budget", seconds=lambda c: 0.002, rep=1)
    start = time.monotonic()
    report = tuner.tune(torch.zeros(1), emit=False, search_options={"effort": "full", "budget_s": 0.2})
    assert time.monotonic() - start < 4 and 0 < report.tried < len(SPACE)


@pytest.mark.parametrize("effort", ["full", "quick"])
def test_a_time_budget_holds_with_slow_builds_and_slow_calls(effort: str) -> None:
    """Builds of 50 ms and calls of 20 ms: the search ends within its budget plus one build and one timing
    (and slack for a loaded machine), where a first batch of 64 (or 2 % of the space) would take 2 to 3 s."""
    budget, build_s, call_s = 0.5, 0.05, 0.02
    tuner = busy_op(f"busy_slow_{effort}", seconds=lambda c: call_s, build_s=build_s, rep=1, compile_threads=1)
    start = time.monotonic()
    report = tuner.tune(torch.zeros(1), emit=False, search_options={"effort": effort, "budget_s": budget})
    assert time.monotonic() - start < budget + build_s + 2 * call_s + 1.0
    assert 1 <= report.tried < budget / build_s + 1


def test_a_time_budget_ends_a_search_whose_every_config_fails() -> None:
    tuner = busy_op("busy_all_failing", fails=lambda c: True, build_s=0.05, compile_threads=1)
    start = time.monotonic()
    with pytest.warns(flyreg.FlyregWarning, match="no such kernel"), \
            pytest.raises(flyreg.TuneError, match="every config"):
        tuner.tune(torch.zeros(1), emit=False, search_options={"effort": "full", "budget_s": 0.3})
    assert time.monotonic() - start < 0.3 + 0.05 + 1.0  # not 2048 builds one by one


def test_exhaustive_times_every_config_once() -> None:
    space = SPACE[:100]
    tuner = busy_op("busy_exhaustive", space=space, seconds=lambda c: 0.0)
    report = tuner.tune(torch.zeros(1), emit=False)
    assert tuner.stats.benchmarks == len(report.timings) == 100
    assert {c for c, _ in report.timings} == set(space)


@pytest.mark.parametrize("size, effort, strategy, tried", [
    (100, "auto", None, 100),  # a small space: every config
    (2048, "auto", None, int(2048 * QUICK_SHARE)),  # a large one: a local search of at most 15 %
    (2048, "full", None, 2048),
    (100, "quick", None, int(100 * QUICK_SHARE)),  # quick on a small space too
    (2048, "auto", "exhaustive", 2048),  # the op prefers the exhaustive search for large spaces
])
def test_the_strategy_follows_the_space_size_the_effort_and_the_op(size: int, effort: str, strategy: str | None,
                                                                    tried: int) -> None:
    tuner = busy_op(f"busy_{size}_{effort}_{strategy}", space=SPACE[:size], seconds=lambda c: 0.0, rep=1,
                    strategy=strategy)
    report = tuner.tune(torch.zeros(1), emit=False, search_options={"effort": effort})
    assert report.tried == size if tried == size else 0 < report.tried <= tried


def test_a_space_of_the_largest_size_searched_whole_is_searched_whole() -> None:
    tuner = busy_op("busy_limit", space=SPACE[:EXHAUSTIVE_MAX + 1], seconds=lambda c: 0.0, rep=1)
    assert tuner.tune(torch.zeros(1), emit=False).tried < EXHAUSTIVE_MAX + 1
    small = busy_op("busy_limit_small", space=SPACE[:EXHAUSTIVE_MAX], seconds=lambda c: 0.0, rep=1)
    assert small.tune(torch.zeros(1), emit=False).tried == EXHAUSTIVE_MAX


def test_a_bad_effort_or_strategy_is_a_clear_error() -> None:
    tuner = busy_op("busy_bad", space=SPACE[:10])
    with pytest.raises(ValueError, match="effort"):
        tuner.tune(torch.zeros(1), emit=False, search_options={"effort": "fast"})
    with pytest.raises(ValueError, match="strategy"):
        tuner.tune(torch.zeros(1), emit=False, search_options={"strategy": "genetic"})
    with pytest.raises(ValueError, match="strategy"):
        busy_op("busy_bad_strategy", space=SPACE[:10], strategy="genetic")
