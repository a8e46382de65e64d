"""What tuning produces: resolutions, search reports, counters and the errors of a tuner."""

from __future__ import annotations

import statistics
from typing import Any

import attrs

from flyreg._core.config import Config, JSONScalar
from flyreg._core.decision import Decision
from flyreg._core.keys import DeviceIdentity


@attrs.frozen
class BenchResult:
    """Per-rep times in milliseconds: ``median`` and the spread around it."""

    median: float
    p20: float
    p80: float
    min: float
    max: float
    reps: int

    @classmethod
    def of(cls, times: list[float]) -> BenchResult:
        if not times:
            raise ValueError("times must not be empty")
        qs = statistics.quantiles(times, n=5, method="inclusive") if len(times) > 1 else [times[0]] * 4
        return cls(statistics.median(times), qs[0], qs[3], min(times), max(times), len(times))

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the relative spread of the middle reps."""
        return (self.p80 - self.p20) / self.median if self.median > 0 else 0.0


class TuneError(RuntimeError):
    """No candidate config of an op could run correctly on a spec.

    ``failed`` lists the configs that raised and ``rejected`` those the correctness gate turned
    down, each with its reason.
    """

    def __init__(self, message: str, failed: tuple[tuple[Any, str], ...] = (),
                 rejected: tuple[tuple[Any, str], ...] = ()) -> None:
        super().__init__(message)
        self.failed = failed
        self.rejected = rejected


class GraphCaptureError(RuntimeError):
    """Only a search could serve this call, and a CUDA graph is being captured, where flyreg never searches."""


@attrs.frozen
class Resolution:
    """The config a call gets, where this lookup found it (``source``) and where it came from (``origin``).

    Both are one of ``"memory"`` (``source`` only), ``"cache"``, ``"offline"``, ``"default"`` and
    ``"search"``; an artifact's ``source`` names the link of the fallback chain that served it:
    ``"offline"`` (the exact artifact), ``"offline-nearest"``, ``"offline-other-device"`` or
    ``"offline-other-toolchain"``, and a key first met during CUDA-graph capture with no config tuned
    for it has ``"capture:<source>"`` (``flyreg.tune_pending()`` tunes it). ``path`` is the artifact
    (or cache file) that served it; ``stale`` says that artifact came from another toolchain;
    ``nearest`` that it was tuned for the nearest spec, not this one.
    """

    config: Config
    source: str
    spec: dict[str, JSONScalar]
    origin: str
    path: str | None = None
    stale: bool = False
    nearest: bool = False


@attrs.frozen
class TuneReport:
    """What a search did: the winner, its time and the default's, and every failure.

    ``reused`` counts the results read from the tuning journal instead of timed in this search;
    ``decision`` says why the winner was chosen (:class:`~flyreg._core.decision.Decision`).
    """

    op: str
    spec: dict[str, JSONScalar]
    winner: Config
    winner_ms: float
    default_ms: float | None
    timings: tuple[tuple[Config, BenchResult], ...]
    failed: tuple[tuple[Config, str], ...]
    rejected: tuple[tuple[Config, str], ...]
    artifact: str | None = None
    reused: int = 0
    decision: Decision | None = None

    @property
    def tried(self) -> int:
        return len(self.timings) + len(self.failed) + len(self.rejected)

    @property
    def speedup(self) -> float | None:
        """Default time over winner time, where the default was timed."""
        return self.default_ms / self.winner_ms if self.default_ms and self.winner_ms > 0 else None


@attrs.frozen
class CallKey:
    """What a call resolves by: its spec, its arguments by name, its device and the scratch-cache key."""

    spec: dict[str, JSONScalar]
    named: dict[str, Any]
    device: Any
    ident: DeviceIdentity
    pkey: str


@attrs.define
class TunerStats:
    """Counters for tests and reports: searches run, configs benchmarked, and finalists timed again."""

    searches: int = 0
    benchmarks: int = 0
    retimed: int = 0
