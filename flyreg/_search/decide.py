"""The rule that picks a search's winner from its timings, and the record of why (:class:`Decision`).

The same timings always give the same pick, whatever order the configs were timed in: ties
break by :func:`knob_order`, never by position.
"""

from __future__ import annotations

from flyreg._core.config import Config, JSONScalar
from flyreg._core.decision import Band, Decision, Timing
from flyreg._core.results import BenchResult


def _value_key(value: JSONScalar) -> tuple[str, JSONScalar]:
    return (type(value).__name__, value)


def knob_order(config: Config) -> tuple[int, tuple[tuple[str, tuple[str, JSONScalar]], ...]]:
    """A config's place in the fixed tie-break order: fewer knobs and hints first, then the lower values,
    knob by knob in name order (values of one type compare by value; types by their names)."""
    items = sorted(config.all_kwargs().items())
    return len(items), tuple((name, _value_key(value)) for name, value in items)


def band(result: BenchResult) -> Band:
    return Band(result.median, result.p20, result.p80)


def _plain(config: Config) -> Config:
    """``config`` as its JSON form reads back (no ``pre_hook``): safe to store and to send to another process."""
    return Config.from_json(config.to_json())


def decide(timed: list[tuple[Config, BenchResult]], default: Config | None, tie_band: float,
           mode: str, inputs: str = "copies") -> tuple[Config, BenchResult, Decision]:
    """The winner of ``timed`` (not empty), its result, and why.

    The fastest by median (:func:`knob_order` among equal medians) wins, unless the default is
    within ``tie_band`` of it or their middle reps (p20 to p80) overlap: then this measurement
    cannot tell them apart (launch-bound kernels, a few microseconds, where host and clock jitter
    exceed the differences between configs), and the default stays. Among the configs within
    ``tie_band`` of the fastest, the first in :func:`knob_order` wins. ``mode`` is the timing
    method the times were taken with, ``inputs`` what they ran on (:data:`~flyreg._core.decision.INPUTS`).
    """
    fastest, best = min(timed, key=lambda t: (t[1].median, knob_order(t[0])))
    results = dict(timed)
    dflt = results.get(default) if default is not None else None
    timing = Timing.of(mode, inputs)

    def decision(rule: str, winner: BenchResult, other: Config | None) -> Decision:
        return Decision(rule, band(winner), band(dflt) if dflt is not None else None,
                        _plain(other) if other is not None else None,
                        band(results[other]) if other is not None else None, tie_band, timing)

    if len(timed) == 1:
        return fastest, best, decision("only", best, None)
    if dflt is not None:
        if fastest == default:
            return fastest, best, decision("default-fastest", best, None)
        if dflt.median <= best.median * (1 + tie_band):
            return default, dflt, decision("default-tie", dflt, fastest)  # type: ignore[return-value]
        if band(dflt).overlaps(band(best)):
            return default, dflt, decision("default-overlap", dflt, fastest)  # type: ignore[return-value]
    near = [(c, r) for c, r in timed if r.median <= best.median * (1 + tie_band)]
    winner, result = min(near, key=lambda t: knob_order(t[0]))
    if dflt is None:
        return winner, result, decision("no-default", result, fastest if winner != fastest else None)
    if winner == fastest:
        return winner, result, decision("fastest", result, None)
    return winner, result, decision("fastest-tie", result, fastest)
