"""The candidates of one search, evaluated on demand and journaled batch by batch.

A strategy hands an :class:`Evaluator` batches of configs and gets back each one's time in ms
(None for a config that failed or gave a wrong result). Every timing, failure and rejection is
appended to the tuning journal as it is taken. With ``resume``, a config already journaled under
the same context is not timed again: its journaled median ranks it (with ``retry_failed``, one
journaled as failed or rejected is tried again). A config that may win but was only read from the
journal passes the correctness gate again in this run before the final round (:meth:`Evaluator._recheck`):
one that has since regressed is dropped, never served. Where a config is made ready
and timed is a subclass's: in this process (:class:`flyreg._search.in_process.InProcessEvaluator`)
or in worker processes (:class:`flyreg._search.isolated_evaluator.IsolatedEvaluator`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from flyreg._core.config import Config, JSONScalar
from flyreg._core.fileio import warn_once
from flyreg._core.results import BenchResult, TunerStats
from flyreg._core.search_terms import SearchSettings
from flyreg._search import journal, progress
from flyreg._search.bench import device_kind
from flyreg._search.decide import knob_order
from flyreg._search.graphs import CaptureError

#: The final round: candidates within FINAL_BAND of the fastest (at most FINALISTS of them, and the
#: default) are timed again over FINAL_SCALE times the work, and ranked by that. On the H200 short
#: replays alone mis-ranked RMSNorm configs up to 1.2 % apart (4096 x 7168); replays of the final
#: round's length picked within 0.1 % of the best a 50-call benchmark found, on every shape tried.
FINAL_BAND = 0.03
FINALISTS = 6
FINAL_SCALE = 8
#: The most of a time budget (``budget_s``) a strategy leaves for the final round.
FINAL_SHARE = 0.25

#: The journal's error text of a config the correctness gate rejected starts with this.
REJECTED = "rejected: "


class CandidateError(Exception):
    """A candidate failed; the message is the whole reason."""


class Rejected(CandidateError):
    """The correctness gate turned the candidate down; the message says why."""


@attrs.frozen
class Measured:
    """One config measured out of the search's sight (in a worker): its result, or why there is none.

    ``rejected``: the gate turned it down; ``uncapturable``: the call cannot be captured in a CUDA
    graph, so the search must time it another way; ``drawn``: whether a set the timer rotated through
    held a draw of the spec (None: no steady timer).
    """

    result: BenchResult | None = None
    error: str | None = None
    rejected: bool = False
    uncapturable: bool = False
    drawn: bool | None = None


def reason(e: Exception) -> str:
    """Why a candidate failed, as the journal and the report say it."""
    return str(e) if isinstance(e, CandidateError) else f"{type(e).__name__}: {e}"


def final_timing(mode: str) -> str:
    """The journal's timing method of the final round's re-times (more work than the first round's)."""
    return f"{mode} final x{FINAL_SCALE}"


class Evaluator:
    """``evaluate(configs) -> {config: ms | None}`` for a strategy, then :meth:`final_round`.

    ``timed`` (config -> result, in the order measured or read), ``failed`` and ``rejected`` are
    the search's record; ``mode`` is the timing method (``cpu`` off CUDA). ``machine`` None
    journals nothing. Past ``deadline`` (a :func:`time.monotonic` instant, None: none), once a config
    is measured, a batch's configs not yet timed are left out of its answer, and the final round is
    skipped when it does not fit. A subclass provides the steps :meth:`_ready`, :meth:`_time` and
    :meth:`_warm`; an exception of a type in :attr:`fatal` ends the search instead of failing one config.
    """

    fatal: tuple[type[Exception], ...] = ()

    def __init__(self, settings: SearchSettings, spec: dict[str, JSONScalar], device: Any, stats: TunerStats,
                 machine: journal.Machine | None) -> None:
        self.settings, self.spec, self.device, self.stats, self.machine = settings, spec, device, stats, machine
        self.mode = settings.timing if device is not None and device_kind(device) == "cuda" else "cpu"
        # The op draws by seed, and every steady time ranked so far ran over draws (see _timed_over).
        self._drawn = machine is not None and machine.toolchain.get("inputs") == "draws"
        self._last_drew = False  # whether the latest timing's steady sets held a draw (its journal key says so)
        self.timed: dict[Config, BenchResult] = {}
        self.failed: list[tuple[Config, str]] = []
        self.rejected: list[tuple[Config, str]] = []
        self.reused = 0  # first-round results read from the journal instead of timed
        self.checked: set[Config] = set()  # passed the correctness gate in this run (timed here, or re-checked)
        self.deadline: float | None = None
        self._timing_s, self._timings = 0.0, 0  # seconds the first round's timings took, and how many
        self._counted: set[Config] = set()  # configs the progress listener has heard of
        self._known: dict[str, dict[Config, journal.Measurement]] = {}

    def __call__(self, configs: Sequence[Config]) -> dict[Config, float | None]:
        out: dict[Config, float | None] = {}
        known = self._journaled(self.mode)
        todo = []
        for c in dict.fromkeys(configs):
            if c in known:
                out[c] = self._reuse(c, known[c])
            else:
                todo.append(c)
        ready = self._ready(todo, out)
        self._count(out)
        self._warm(ready)
        for i, (config, token) in enumerate(ready):
            if self.late():
                break
            try:
                start = time.monotonic()
                result = self._time(token, 1)
            except CaptureError as e:  # every config is timed again the flushed way, this batch's rest too
                self._fall_back(e)
                redo = list(self.timed)
                self.timed.clear()
                out.update(self([*redo, *(c for c, _ in ready[i:])]))
                return out
            except Rejected as e:
                self._reject(config, str(e))
                out[config] = None
                self._count([config])
                continue
            except self.fatal:
                raise
            except Exception as e:  # a failing candidate is skipped, never fatal
                self._fail(config, reason(e), self.mode)
                out[config] = None
                self._count([config])
                continue
            self._timing_s += time.monotonic() - start
            self._timings += 1
            self.timed[config] = result
            self.checked.add(config)
            self.stats.benchmarks += 1
            self._journal(self.mode, config, result)
            out[config] = result.median
            self._count([config])
        return out

    def late(self) -> bool:
        """Past the deadline with a config measured (timed, or failed): what is not yet timed is left for no one."""
        return (self.deadline is not None and bool(self.timed or self.failed or self.rejected)
                and time.monotonic() >= self.deadline)

    def final_seconds(self, default: Config | None) -> float:
        """About how long :meth:`final_round` would take now: each finalist timed over :data:`FINAL_SCALE` times
        the work of a first-round timing (their mean seconds so far; 0 before any)."""
        if not self._timings:
            return 0.0
        return len(finalists(self.timed, default)) * FINAL_SCALE * self._timing_s / self._timings

    def _count(self, configs: Iterable[Config]) -> None:
        """Tell the progress listener of the configs measured (or failed) that it has not heard of."""
        new = [c for c in configs if c not in self._counted]
        self._counted.update(new)
        if new:
            progress.measured(len(new))

    def final_round(self, default: Config | None) -> frozenset[Config]:
        """Time the finalists again over :data:`FINAL_SCALE` times the work (their final times replace
        the first); returns those that were. Journaled under :func:`final_timing`. A round cut short by the
        deadline, or left with one survivor, ranks nothing: its configs keep their first times and none is
        returned.

        A :class:`CaptureError` leaves that finalist its first time, outside the final ranking; a
        finalist that fails otherwise is dropped and reported: a config that fails on a re-run is not served.
        """
        self._recheck(default)
        if self.deadline is not None and time.monotonic() + self.final_seconds(default) > self.deadline:
            return frozenset()  # it does not fit in the budget: the first round's times rank
        timing = final_timing(self.mode)
        known = self._journaled(timing)
        first = dict(self.timed)
        final: set[Config] = set()
        todo = []
        for config in finalists(self.timed, default):
            m = known.get(config)
            if m is None:
                todo.append(config)
            elif m.failed:
                del self.timed[config]
                self.failed.append((config, str(m.error)))
            else:
                self.timed[config] = self._ranked(m)
                final.add(config)
        out: dict[Config, float | None] = {}
        ready = self._ready(todo, out)
        for config in out:  # bound again after a resume, and now failing
            self.timed.pop(config, None)
        self._warm(ready)
        cut = False
        for config, token in ready:
            if self.late():  # cut short: a partial round cannot rank, the first round's times do
                cut = True
                break
            try:
                result = self._time(token, FINAL_SCALE)
            except CaptureError:
                continue
            except self.fatal:
                raise
            except Exception as e:
                del self.timed[config]
                self._fail(config, reason(e), timing)
                continue
            self.timed[config] = result
            self._journal(timing, config, result)
            self.stats.retimed += 1
            final.add(config)
        if cut or len(final) == 1:  # one survivor ranks nothing either
            self.timed.update((c, first[c]) for c in final)
            final.clear()
        if not final:  # the pick is then among every timing: finalists dropped here may leave others in front
            self._recheck(default)
        return frozenset(final)

    def _recheck(self, default: Config | None) -> None:
        """Put each config that may still win (the default, and those within the final band or the tie band of
        the fastest) but did not pass the correctness gate in this run (read from the journal) through it
        now; one that fails is dropped and recorded, and the next in line is checked, until every
        contender passed here."""
        band = max(FINAL_BAND, self.settings.tie_band)
        while self.timed:
            best = min(r.median for r in self.timed.values())
            unchecked = [c for c, r in self.timed.items() if c not in self.checked
                         and (c == default or r.median <= best * (1 + band))]
            if not unchecked:
                return
            deadline, self.deadline = self.deadline, None  # never cut short: what is served passes here
            try:
                passed = self._check(unchecked)
            finally:
                self.deadline = deadline
            self.checked.update(passed)
            for config in unchecked:
                if config not in passed:
                    del self.timed[config]

    # -- the steps a subclass provides --------------------------------------------------------------
    def _ready(self, todo: list[Config], out: dict[Config, float | None]) -> list[tuple[Config, Any]]:
        """(config, what :meth:`_time` takes) for each of ``todo`` that can be timed; each other config's None
        goes into ``out`` (recorded through :meth:`_fail` or :meth:`_reject`)."""
        raise NotImplementedError

    def _time(self, token: Any, scale: int) -> BenchResult:
        """One ready config timed over ``scale`` times the base work; raises why it failed."""
        raise NotImplementedError

    def _check(self, configs: list[Config]) -> set[Config]:
        """Those of ``configs`` that pass the correctness gate now; each other is recorded (:meth:`_fail`,
        :meth:`_reject`)."""
        raise NotImplementedError

    def _warm(self, ready: list[tuple[Config, Any]]) -> None:
        """Right before a batch is timed."""

    @property
    def inputs(self) -> str:
        """What the times run on: draws of the spec where the op draws by seed and the timing is steady, else
        copies of the call (:data:`flyreg._core.decision.INPUTS`)."""
        return "draws" if self._drawn and self.mode == "steady" else "copies"

    def _fall_back(self, e: CaptureError) -> None:
        op, spec = self.settings.op, self.spec
        warn_once(f"flyreg: {op}: spec {spec} cannot be timed in a CUDA graph ({e}); timing single "
                  f"calls after an L2 flush instead", key=f"no-steady:{op}:{sorted(spec.items())}")
        self.mode = "flushed"

    # -- the record -------------------------------------------------------------------------------
    def _reuse(self, config: Config, m: journal.Measurement) -> float | None:
        if m.error is not None:
            if m.error.startswith(REJECTED):
                self.rejected.append((config, m.error[len(REJECTED):]))
            else:
                self.failed.append((config, m.error))
            return None
        self.timed[config] = self._ranked(m)
        self.reused += 1
        return m.median_ms

    def _timed_over(self, drew: bool) -> None:
        """A subclass's timing is being taken; ``drew``: whether its steady sets hold a draw of the spec."""
        self._last_drew = drew
        if self.mode == "steady":
            self._drawn = self._drawn and drew

    def _ranked(self, m: journal.Measurement) -> BenchResult:
        """A journaled time this search ranks: one taken over copies where the op draws makes its record copies."""
        if self.machine is not None and m.toolchain.get("inputs") != self.machine.toolchain.get("inputs"):
            self._drawn = False
        return result_of(m)

    def _fail(self, config: Config, why: str, timing: str) -> None:
        self.failed.append((config, why))
        warn_once(f"flyreg: {self.settings.op}: config {config} failed on spec {self.spec}: {why}")
        self._journal(timing, config, error=why)

    def _reject(self, config: Config, why: str) -> None:
        self.rejected.append((config, why))
        self._journal(self.mode, config, error=REJECTED + why)

    def _context(self, timing: str, copies: bool = False) -> journal.Context:
        """The journal's key of this search's measurements under ``timing`` (:attr:`machine` is set); with
        ``copies``, where the op draws by seed, the key of times taken over copies of the call instead."""
        assert self.machine is not None
        ctx = self.machine.context(self.settings.op, self.spec, timing)
        if copies and ctx.toolchain.get("inputs") == "draws":
            ctx = attrs.evolve(ctx, toolchain={**ctx.toolchain, "inputs": "copies"})
        return ctx

    def _journaled(self, timing: str) -> dict[Config, journal.Measurement]:
        """What the journal holds under ``timing`` (read once a search); nothing unless resuming. Where the op draws
        by seed, each config's latest row under either inputs (times over draws, or over copies of the call)."""
        if self.machine is None or not self.settings.resume:
            return {}
        if timing not in self._known:
            try:
                known = journal.measured(self._context(timing), self._context(timing, copies=True))
                if self.settings.retry_failed:  # only timings are reused: failures are tried again
                    known = {c: m for c, m in known.items() if not m.failed}
                self._known[timing] = known
            except (OSError, sqlite3.Error) as e:
                warn_once(f"flyreg: could not read the tuning journal: {e}")
                self._known[timing] = {}
        return self._known[timing]

    def _journal(self, timing: str, config: Config, result: BenchResult | None = None,
                 error: str | None = None) -> None:
        """Append one measurement; a journal that cannot be written warns once and the search goes on. Where the op
        draws by seed, a steady time goes under ``inputs: copies`` unless its sets held a draw, so a search that
        ranks it knows; anything else under the machine's own key."""
        if self.machine is None:
            return
        try:
            if result is not None:
                copies = self.mode == "steady" and not self._last_drew  # the timing method keys the others apart
                journal.record(self._context(timing, copies=copies), config, median_ms=result.median,
                               spread=result.spread, reps=result.reps)
            else:
                journal.record(self._context(timing), config, error=error)
        except (OSError, sqlite3.Error) as e:
            warn_once(f"flyreg: could not write the tuning journal: {e}")
            self.machine = None


def result_of(m: journal.Measurement) -> BenchResult:
    """A journaled time as a result: its median, and its spread split evenly around it (p20 no lower than 0: a
    spread over 2, the middle reps' width over twice the median, comes of a skewed, noisy timing)."""
    median = float(m.median_ms or 0.0)
    half = median * float(m.spread or 0.0) / 2
    low = max(0.0, median - half)
    return BenchResult(median, low, median + half, low, median + half, int(m.reps or 1))


def finalists(timed: dict[Config, BenchResult], default: Config | None) -> list[Config]:
    """The configs the final round re-times: up to :data:`FINALISTS` within :data:`FINAL_BAND` of the
    fastest, fastest first (equal times in :func:`~flyreg._search.decide.knob_order`), and the default where it was
    timed; none when that leaves one config."""
    if len(timed) < 2:
        return []
    best = min(r.median for r in timed.values())
    near = sorted((c for c, r in timed.items() if r.median <= best * (1 + FINAL_BAND)),
                  key=lambda c: (timed[c].median, knob_order(c)))
    out = near[:FINALISTS]
    if default in timed and default not in out:
        out.append(default)
    return out if len(out) > 1 else []  # one config alone: nothing to rank
