"""Which configs a search times: all of them, or a budgeted local search over the knob grid.

A strategy gets the candidate configs, configs to start from (the default, the winners of the
nearest tuned specs) and an ``evaluate`` callable that times a batch of configs and returns each
one's time in ms (None for a config that failed). It returns every time it took. Deterministic
for a given seed, the timings aside.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import attrs

from flyreg._core.config import Config, JSONScalar
from flyreg._core.search_terms import STRATEGIES as STRATEGY_NAMES

Evaluate = Callable[[Sequence[Config]], Mapping[Config, "float | None"]]
Times = dict[Config, "float | None"]

#: Spaces up to this size are searched exhaustively unless the op or the user asks otherwise.
EXHAUSTIVE_MAX = 256
#: The share of a large space the ``quick`` effort times at most.
QUICK_SHARE = 0.15


@attrs.frozen
class Budget:
    """Limits of one spec's search: configs timed at most, wall seconds at most (None: no limit) counted from
    ``started`` (a ``clock`` instant; None: the strategy's start), and the seed.

    ``reserve()`` is the time the strategy leaves for what follows it (the final round) out of the seconds.
    ``clock`` is the strategy's source of seconds (a test may pass its own; the evaluator's deadline keeps
    :func:`time.monotonic`).
    """

    max_evals: int | None = None
    seconds: float | None = None
    seed: int = 0
    started: float | None = None
    reserve: Callable[[], float] | None = None
    clock: Callable[[], float] = time.monotonic

    def __attrs_post_init__(self) -> None:
        if self.max_evals is not None and (isinstance(self.max_evals, bool) or self.max_evals < 1):
            raise ValueError(f"max_evals must be an int >= 1 or None, got {self.max_evals!r}")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"seconds must be > 0 or None, got {self.seconds!r}")


class Strategy(Protocol):
    name: str

    def run(self, space: Sequence[Config], evaluate: Evaluate, budget: Budget,
            starts: Sequence[Config] = ()) -> Times: ...


class _Meter:
    """Times configs through ``evaluate`` within the budget; never times a config twice.

    Under a time budget the configs go in batches sized to the time left: one config first, then as
    many as fit at the last batch's seconds per config (binding, compiling and timing included: a
    first batch that paid for starting a compile pool does not slow every later one), at most
    twice the largest batch so far. A config the evaluator left out (its deadline came first)
    is not timed. The budget never ends a search before one config is measured (timed, or failed).
    """

    def __init__(self, evaluate: Evaluate, budget: Budget) -> None:
        self.evaluate, self.budget = evaluate, budget
        self.times: Times = {}
        started = budget.started if budget.started is not None else budget.clock()
        self.deadline = started + budget.seconds if budget.seconds is not None else None
        self.per_config: float | None = None  # the last batch's seconds per config evaluated
        self.largest = 0  # the largest batch so far

    def left(self) -> int | None:
        return None if self.budget.max_evals is None else self.budget.max_evals - len(self.times)

    def seconds_left(self) -> float | None:
        """Seconds until the strategy must stop (None: no time budget); the reserve is left out."""
        if self.deadline is None:
            return None
        reserve = self.budget.reserve() if self.budget.reserve is not None else 0.0
        return self.deadline - reserve - self.budget.clock()

    def out_of_time(self) -> bool:
        left = self.seconds_left()
        return left is not None and left <= 0 and bool(self.times)

    def exhausted(self) -> bool:
        left = self.left()
        return (left is not None and left <= 0) or self.out_of_time()

    def batch(self, todo: int, until: float | None = None) -> int:
        """How many of ``todo`` configs the next batch holds, ending by the ``until`` instant where one is given."""
        left = self.seconds_left()
        if left is None:
            return todo
        if until is not None:
            left = min(left, until - self.budget.clock())
        if self.per_config is None:
            return 1
        fits = int(left / self.per_config) if self.per_config > 0 else todo
        return max(1, min(todo, fits, 2 * self.largest))

    def time(self, configs: Sequence[Config], until: float | None = None) -> None:
        """Time ``configs`` in order within the budget, under a time budget no batch begun at or after the
        ``until`` instant (a ``clock`` reading; None: the budget's end)."""
        todo = [c for c in dict.fromkeys(configs) if c not in self.times]
        left = self.left()
        if left is not None:
            todo = todo[:max(left, 0)]
        while todo and not self.out_of_time() and (until is None or self.budget.clock() < until):
            n = self.batch(len(todo), until)
            batch, todo = todo[:n], todo[n:]
            start = self.budget.clock()
            got = self.evaluate(batch)
            if got:
                self.per_config = (self.budget.clock() - start) / len(got)
            self.largest = max(self.largest, n)
            self.times.update((c, got[c]) for c in batch if c in got)


@attrs.frozen
class Exhaustive:
    """Every config, in batches so a time budget can stop it between batches."""

    name: str = "exhaustive"
    batch: int = 64

    def run(self, space: Sequence[Config], evaluate: Evaluate, budget: Budget,
            starts: Sequence[Config] = ()) -> Times:
        meter = _Meter(evaluate, budget)
        order = [*[s for s in starts if s in set(space)], *space]
        for i in range(0, len(order), self.batch):
            if meter.exhausted():
                break
            meter.time(order[i:i + self.batch])
        return meter.times


def _sort_key(value: JSONScalar) -> tuple[str, JSONScalar]:
    return (type(value).__name__, value)


class _Grid:
    """The space as points of a grid: one axis per knob and hint, each with its sorted values."""

    def __init__(self, space: Sequence[Config]) -> None:
        names = sorted({k for c in space for k in c.all_kwargs()})
        self.values = {n: sorted({c.all_kwargs().get(n) for c in space}, key=lambda v: _sort_key(v)
                                 if v is not None else ("", 0)) for n in names}
        self.index = {n: {v: i for i, v in enumerate(vs)} for n, vs in self.values.items()}
        self.names = names
        self.point = {c: tuple(self.index[n][c.all_kwargs().get(n)] for n in names) for c in space}
        self.at = {p: c for c, p in self.point.items()}
        #: The points with each value of each axis, in space order.
        self.holding: list[dict[int, list[tuple[int, ...]]]] = [{} for _ in names]
        for p in self.point.values():
            for axis, i in enumerate(p):
                self.holding[axis].setdefault(i, []).append(p)

    def neighbors(self, config: Config) -> list[Config]:
        """The nearest config of the space one step up and one step down each axis (skipping pruned points).
        Where no config along a direction differs from this one in that axis alone (a knob that only another
        family of configs has, whose other knobs differ too), the config at the axis's next value nearest in
        the other axes (fewest index steps): so a local search can cross from one family to another."""
        p = self.point[config]
        out = []
        for axis, n in enumerate(self.names):
            for step in (-1, 1):
                i = p[axis] + step
                while 0 <= i < len(self.values[n]):
                    q = (*p[:axis], i, *p[axis + 1:])
                    if q in self.at:
                        out.append(self.at[q])
                        break
                    i += step
                else:
                    nearest = self._nearest_across(p, axis, step)
                    if nearest is not None:
                        out.append(nearest)
        return out

    def _nearest_across(self, p: tuple[int, ...], axis: int, step: int) -> Config | None:
        # The config at the first value past p's along ``axis`` (towards ``step``) that is nearest p in the others.
        i = p[axis] + step
        while 0 <= i < len(self.values[self.names[axis]]) and i not in self.holding[axis]:
            i += step
        if i not in self.holding[axis]:
            return None
        best = min(self.holding[axis][i], key=lambda q: sum(abs(a - b) for a, b in zip(p, q)))
        return self.at[best]


@attrs.frozen
class LocalSearch:
    """Best-first local search: time the starts and a random sample, then always the untried neighbors of
    the fastest config not yet expanded; a fresh random sample when every timed config is expanded.

    ``sample`` is the share of the space (at least 4 configs) timed at random first; under a time budget
    the sample stops once it has taken ``sample_time`` of the seconds left after the starts, so a tight
    budget still expands the fastest config's neighbors (a journaled config costs no time).
    """

    name: str = "local"
    sample: float = 0.02
    sample_time: float = 0.5

    def run(self, space: Sequence[Config], evaluate: Evaluate, budget: Budget,
            starts: Sequence[Config] = ()) -> Times:
        space = list(dict.fromkeys(space))
        meter = _Meter(evaluate, budget)
        if not space:
            return meter.times
        rng = random.Random(budget.seed)
        grid = _Grid(space)
        k = max(4, int(len(space) * self.sample))
        members = set(space)
        firsts, sample = [s for s in starts if s in members], rng.sample(space, min(k, len(space)))
        if meter.deadline is None:
            meter.time([*firsts, *sample])
        else:
            meter.time(firsts)
            left = max(meter.seconds_left() or 0.0, 0.0)
            meter.time(sample, until=budget.clock() + self.sample_time * left)
        expanded: set[Config] = set()
        while not meter.exhausted() and len(meter.times) < len(space):
            timed = sorted((t, i, c) for i, (c, t) in enumerate(meter.times.items())
                           if t is not None and c not in expanded)
            if not timed:
                rest = [c for c in space if c not in meter.times]
                meter.time(rng.sample(rest, min(k, len(rest))))
                continue
            best = timed[0][2]
            expanded.add(best)
            meter.time(grid.neighbors(best))
        return meter.times


#: Each strategy by its name in :data:`flyreg._core.search_terms.STRATEGIES`.
STRATEGIES: dict[str, Callable[[], Strategy]] = dict(zip(STRATEGY_NAMES, (Exhaustive, LocalSearch), strict=True))


def choose(space_size: int, effort: str = "auto", preferred: str | None = None) -> tuple[Strategy, int | None]:
    """The strategy and evaluation cap for a space: ``full`` times everything; ``quick`` a local search
    capped at :data:`QUICK_SHARE` of a large space; ``auto`` is ``full`` up to :data:`EXHAUSTIVE_MAX`
    configs and ``quick`` above. An op's ``preferred`` strategy replaces the large-space choice. Both as the
    search settings checked them."""
    if effort == "full" or (effort == "auto" and space_size <= EXHAUSTIVE_MAX):
        return Exhaustive(), None
    large = STRATEGIES[preferred or "local"]()
    cap = max(1, int(space_size * QUICK_SHARE)) if isinstance(large, LocalSearch) else None
    return large, cap
