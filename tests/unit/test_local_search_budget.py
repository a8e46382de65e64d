"""The local search's time budget on a clock of its own: which configs a tight budget reaches.

A tight budget's path through the search depends on how long each config takes; through the public API that
is the machine's speed, so this drives the strategy directly with a clock the evaluator advances.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from flyreg import Config
from flyreg._search.strategy import Budget, LocalSearch

SPACE = [Config({"A": a, "B": b, "C": c}) for a in range(16) for b in range(16) for c in range(8)]  # 2048 configs


@pytest.mark.parametrize("start_s", [1.0, 0.0], ids=["timed", "journaled"])
def test_a_tight_time_budget_still_expands_the_fastest_start(start_s: float) -> None:
    """A 20 s budget and configs that take 1 s each to time (a clock the evaluator advances; a journaled start
    takes none): the random sample stops at half the seconds left after the start, so the start's neighbours
    are timed and its one faster neighbour found, where the whole 2 % sample (40 configs) spends the budget."""
    start, faster = Config({"A": 8, "B": 8, "C": 4}), Config({"A": 9, "B": 8, "C": 4})
    now = [0.0]

    def evaluate(batch: Sequence[Config]) -> dict[Config, float]:
        now[0] += sum(start_s if c == start else 1.0 for c in batch)
        return {c: 0.1 if c == faster else 0.5 if c == start else 1.0 for c in batch}

    def search(sample_time: float) -> dict[Config, float | None]:
        now[0] = 0.0
        return LocalSearch(sample_time=sample_time).run(SPACE, evaluate, Budget(seconds=20.0, clock=lambda: now[0]),
                                                        [start])

    times = search(0.5)
    assert min(times, key=lambda c: times[c] or math.inf) == faster
    assert now[0] <= 21.0  # the budget kept, give or take one config
    assert faster not in search(100.0)  # a sample free to take all the time never reaches the neighbours
    whole = LocalSearch().run(SPACE, evaluate, Budget(max_evals=41), [start])
    assert set(whole) == {start, *random.Random(0).sample(SPACE, 40)}  # no time budget: the start and the sample
