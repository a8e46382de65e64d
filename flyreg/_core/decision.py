"""Why a search served the config it did: the rule that chose, the times and noise bands it compared,
how they were timed, and the device peak they were judged against.

A :class:`Decision` travels in a search's :class:`~flyreg._core.results.TuneReport`, and is stored in
the scratch cache's entry and in the artifact (``provenance.decision``) as :meth:`Decision.to_json`.
Files written before it existed have none; :meth:`Decision.from_json` reads what a newer flyreg wrote.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from flyreg._core.config import Config
from flyreg._core.peaks import Peak

#: The rules a search decides by, and what each says (``{fastest}``, ``{band}``, ``{margin}`` (the default's
#: time over the winner's, less 1) and ``{lead}`` (the default's over the fastest's, less 1) filled in).
RULES: dict[str, str] = {
    "only": "the only config timed: the space holds no other, or the others failed, were rejected or were not "
            "reached within the budget",
    "default-fastest": "the default was the fastest",
    "default-tie": "kept default: the fastest, {fastest}, {lead} faster, was within the tie band ({band}) of it",
    "default-overlap": "kept default: the fastest, {fastest}, {lead} faster, was not separable from it "
                       "(p20/p80 overlap)",
    "fastest": "fastest, separable from the default by {margin} (p20/p80 apart)",
    "fastest-tie": "within the tie band ({band}) of the fastest, {fastest}, and first by knob order; "
                   "separable from the default by {margin}",
    "no-default": "fastest; the default did not run correctly or was not timed",
}
#: The same, as the few words ``flyreg tune``'s table has room for.
SHORT: dict[str, str] = {
    "only": "only config timed",
    "default-fastest": "default is fastest",
    "default-tie": "kept default: fastest {lead} faster, in tie band",
    "default-overlap": "kept default: fastest {lead} faster, not separable",
    "fastest": "fastest, separable from default",
    "fastest-tie": "tied with fastest, first by knob order",
    "no-default": "fastest; default not timed",
}

#: What a timing's calls ran on: copies of one call, or draws of its spec (an op whose ``make_inputs`` takes a seed).
INPUTS = ("copies", "draws")
#: Timing method -> (how calls are launched, whether the L2 holds their inputs).
TIMING_MODES: dict[str, tuple[str, str]] = {
    "cpu": ("eager", "warm"),
    "steady": ("graph", "cold"),
    "flushed": ("eager", "cold"),
    "graph": ("graph", "warm"),
}


def _number(data: Mapping[str, Any], name: str, optional: bool = False) -> float | None:
    value = data.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name!r} is {value!r}, expected a finite number >= 0")
    return float(value)


def _text(data: Mapping[str, Any], name: str, allowed: Mapping[str, Any] | None = None) -> str:
    value = data.get(name)
    if not isinstance(value, str) or (allowed is not None and value not in allowed):
        expected = f"one of {sorted(allowed)}" if allowed is not None else "a string"
        raise ValueError(f"{name!r} is {value!r}, expected {expected}")
    return value


def _object(data: object, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} is {type(data).__name__}, expected an object")
    return data


@attrs.frozen
class Band:
    """A config's median time and the middle of its reps (p20 to p80), in ms."""

    median: float
    p20: float
    p80: float

    def overlaps(self, other: Band) -> bool:
        """True when the two middles meet: the measurement cannot tell the two configs apart."""
        return self.p20 <= other.p80 and other.p20 <= self.p80

    def to_json(self) -> dict[str, float]:
        return {"median_ms": self.median, "p20_ms": self.p20, "p80_ms": self.p80}

    @classmethod
    def from_json(cls, data: object, what: str) -> Band:
        d = _object(data, what)
        try:
            median, p20, p80 = (_number(d, n) for n in ("median_ms", "p20_ms", "p80_ms"))
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
        return cls(median, p20, p80)  # type: ignore[arg-type]


@attrs.frozen
class Timing:
    """How the compared times were taken: the search's timing method, eager or CUDA-graph launches, L2 cold or
    warm, and ``inputs``: copies of one call, or draws of its spec (:data:`INPUTS`)."""

    mode: str
    launch: str
    l2: str
    inputs: str = "copies"

    @classmethod
    def of(cls, mode: str, inputs: str = "copies") -> Timing:
        launch, l2 = TIMING_MODES[mode]
        return cls(mode, launch, l2, inputs)

    def __str__(self) -> str:
        return f"{self.launch}, L2 {self.l2} ({self.mode}{', over draws' if self.inputs == 'draws' else ''})"


def peak_json(peak: Peak | None) -> dict[str, Any] | None:
    return None if peak is None else {"bandwidth": peak.bandwidth, "flops": peak.flops, "how": peak.how}


def peak_from_json(data: object) -> Peak | None:
    if data is None:
        return None
    d = _object(data, "'peak'")
    try:
        return Peak(_number(d, "bandwidth", True), _number(d, "flops", True), _text(d, "how"))
    except ValueError as e:
        raise ValueError(f"'peak': {e}") from None


@attrs.frozen
class Decision:
    """Why the winner was chosen: the ``rule`` (a key of :data:`RULES`), the winner's and the default's
    bands (the default's None where it was not timed), the fastest config and its band where it is not
    the winner, the tie band, the timing, and the device peak the search was judged against (None: not known)."""

    rule: str
    winner: Band
    default: Band | None
    fastest: Config | None
    fastest_band: Band | None
    tie_band: float
    timing: Timing
    peak: Peak | None = None

    def _fill(self, template: str) -> str:
        def over(slow: Band | None, fast: Band | None) -> str:
            return f"{slow.median / fast.median - 1:.1%}" if slow is not None and fast is not None and fast.median > 0 \
                else "?"

        return template.format(fastest=self.fastest, band=f"{self.tie_band:.1%}",
                               margin=over(self.default, self.winner), lead=over(self.default, self.fastest_band))

    @property
    def reason(self) -> str:
        """One sentence: the rule that chose, with the config and margin it compared."""
        return self._fill(RULES[self.rule])

    @property
    def short(self) -> str:
        """The reason in a few words."""
        return self._fill(SHORT[self.rule])

    @property
    def kept_default(self) -> bool:
        """The default was served although another config measured faster."""
        return self.rule in ("default-tie", "default-overlap")

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "reason": self.reason, "winner": self.winner.to_json(),
                "default": self.default.to_json() if self.default is not None else None,
                "fastest": ({"config": self.fastest.to_json(), **self.fastest_band.to_json()}
                            if self.fastest is not None and self.fastest_band is not None else None),
                "tie_band": self.tie_band, "timing": attrs.asdict(self.timing), "peak": peak_json(self.peak)}

    @classmethod
    def from_json(cls, data: object) -> Decision:
        """Inverse of :meth:`to_json` (``reason`` is derived again); raises ValueError naming the bad field."""
        d = _object(data, "decision")
        try:
            rule = _text(d, "rule", RULES)
            timing = _object(d.get("timing"), "'timing'")
            mode = _text(timing, "mode", TIMING_MODES)
            inputs = _text(timing, "inputs", INPUTS) if "inputs" in timing else "copies"  # older artifacts: copies
            fastest = fastest_band = None
            if d.get("fastest") is not None:
                fastest = Config.from_json(_object(d["fastest"], "'fastest'").get("config"))
                fastest_band = Band.from_json(d["fastest"], "'fastest'")
            default = Band.from_json(d["default"], "'default'") if d.get("default") is not None else None
            tie_band = _number(d, "tie_band")
            assert tie_band is not None
            return cls(rule, Band.from_json(d.get("winner"), "'winner'"), default, fastest, fastest_band, tie_band,
                       Timing.of(mode, inputs), peak_from_json(d.get("peak")))
        except (TypeError, ValueError, RecursionError) as e:
            raise ValueError(f"decision: {e}") from None
