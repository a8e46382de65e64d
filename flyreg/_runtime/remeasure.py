"""Re-timing a served config on this device and toolchain, against the default and the configs around it.

What ``flyreg check --remeasure`` runs for each (op, spec): the config lookup serves (an artifact, a
fallback, the default), the op's default, the configs of the neighbouring artifacts and, for a
small space, every config the op offers, all checked against the reference and timed by the
search's own gate and timers (:func:`flyreg._search.engine.run_search`: every config, with its
final round; nothing journaled, nothing stored). Then one verdict (:func:`verdict`):

* ``keep``: no config measured is separably faster (their p20..p80 bands overlap, or it is the
  fastest), and the artifact is the exact one for this device and toolchain;
* ``stale-but-fine``: a fallback or a stale artifact that nothing measured beats separably, or one
  that something beats separably by less than the margin;
* ``retune``: a config measured is separably faster by the margin or more, or the served config
  fails here (it raises, or the correctness gate rejects it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from flyreg._core.config import Config, JSONScalar
from flyreg._core.keys import identity_of
from flyreg._core.results import BenchResult, TuneError
from flyreg._core.search_terms import Call
from flyreg._runtime.state import TunerState
from flyreg._search.engine import run_search

#: The verdicts, best first.
KEEP, STALE_BUT_FINE, RETUNE = "keep", "stale-but-fine", "retune"
VERDICTS = (KEEP, STALE_BUT_FINE, RETUNE)
#: How much slower than the fastest config measured (separably) a served config may be before it is re-tuned.
MARGIN = 0.05
#: A spec whose op offers at most this many configs has every one timed: the fastest is then a fresh best.
SMALL_SPACE = 16


@attrs.frozen
class Timing:
    """One config measured: why it was (``roles``: ``served``, ``default``, ``neighbour``, ``space``), and its
    result, or why it has none (``error``: it raised, or the gate rejected it)."""

    config: Config
    roles: tuple[str, ...]
    result: BenchResult | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {"config": self.config.to_json(), "roles": list(self.roles),
                "median_ms": r.median if r else None, "p20_ms": r.p20 if r else None, "p80_ms": r.p80 if r else None,
                "error": self.error}


@attrs.frozen
class Remeasured:
    """What re-timing one spec found: each config's :class:`Timing` (the served one first), the verdict and
    why, and the margins (``vs_default``: the default's time over the served one's; ``slower``: how much
    slower the served config is than the fastest measured, 0 when it is the fastest); ``fresh`` when the
    whole space was timed."""

    timings: tuple[Timing, ...]
    verdict: str
    reason: str
    vs_default: float | None
    slower: float | None
    fastest: Timing | None
    fresh: bool

    @property
    def served(self) -> Timing:
        return self.timings[0]

    def role(self, role: str) -> Timing | None:
        return next((t for t in self.timings if role in t.roles), None)


def separable(fast: BenchResult, slow: BenchResult) -> bool:
    """True when ``fast`` is faster than ``slow`` beyond the noise: its p80 below ``slow``'s p20."""
    return fast.p80 < slow.p20


def verdict(served: Timing, fastest: Timing | None, exact: bool, margin: float = MARGIN) -> tuple[str, str]:
    """The verdict on ``served`` given the ``fastest`` config measured (``exact``: the artifact is the exact
    one for this device and toolchain), and the reason in words."""
    if served.result is None:
        return RETUNE, f"the served config fails here: {served.error}"
    why_fine = "" if exact else "; it is a fallback here: refresh it when convenient"
    if fastest is None or fastest.result is None or fastest.config == served.config \
            or not separable(fastest.result, served.result):
        return (KEEP if exact else STALE_BUT_FINE), "no config measured is separably faster" + why_fine
    slower = served.result.median / fastest.result.median - 1
    which = "/".join(fastest.roles)
    if slower >= margin:
        return RETUNE, f"the {which} config is {slower:.1%} faster (margin {margin:.0%})"
    return STALE_BUT_FINE, f"the {which} config is {slower:.1%} faster, within the margin of {margin:.0%}"


def remeasure(tuner: TunerState, spec: dict[str, JSONScalar], call: Call, served: Config, exact: bool,
              neighbours: Sequence[Config] = (), margin: float = MARGIN, small_space: int = SMALL_SPACE) -> Remeasured:
    """Time ``served`` (what lookup serves ``spec``; ``exact``: the exact current artifact) against the op's
    default, ``neighbours`` (the configs of nearby artifacts the op takes for ``spec``) and, for a space of
    at most ``small_space`` configs, the whole space, on ``call``; see the module's docstring."""
    space = tuner.space
    roles: dict[Config, list[str]] = {}

    def add(config: Config, role: str) -> None:
        c = space.canonical(config, spec)
        if role not in roles.setdefault(c, []):
            roles[c].append(role)

    add(served, "served")
    default = space.default(spec, identity_of(call.device))
    if default is not None:
        add(default, "default")
    for c in neighbours:
        if space.accepts(c, dict(spec)) is None:
            add(c, "neighbour")
    candidates = space.candidates(spec)
    fresh = len(candidates) <= small_space
    if fresh:
        for c in candidates:
            add(c, "space")
    settings = tuner.settings.with_run(effort="full", budget_s=None, resume=False)

    def build(config: Config) -> object:
        return tuner.build_cache.get(tuner.name, config, spec, tuner.structural, tuner.build)

    try:
        report = run_search(settings, spec, call, list(roles), default, build,
                            lambda c: tuner.bind(c, spec, call.args, call.kwargs), tuner.stats)
        timed, failed = dict(report.timings), dict((*report.failed, *report.rejected))
    except TuneError as e:  # every config failed: each with its reason
        timed, failed = {}, dict((*e.failed, *e.rejected))
    timings = tuple(Timing(c, tuple(r), timed.get(c), None if c in timed else failed.get(c, "not timed"))
                    for c, r in roles.items())
    ok = [t for t in timings if t.result is not None]
    fastest = min(ok, key=lambda t: t.result.median) if ok else None  # type: ignore[union-attr]
    served_t = timings[0]
    word, reason = verdict(served_t, fastest, exact, margin)
    default_t = next((t for t in timings if "default" in t.roles), None)
    vs_default = (default_t.result.median / served_t.result.median
                  if default_t and default_t.result and served_t.result and served_t.result.median > 0 else None)
    slower = (max(served_t.result.median / fastest.result.median - 1, 0.0)
              if fastest and fastest.result and served_t.result and fastest.result.median > 0 else None)
    return Remeasured(timings, word, reason, vs_default, slower, fastest, fresh)
