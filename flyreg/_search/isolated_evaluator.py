"""A search whose candidates run in other processes: compiled in a pool, timed in one worker.

The strategy, the journal and the winner stay in the calling process, which runs no candidate
and starts no device work for one: a candidate that crashes or hangs fails in a worker, with its
reason, and the search goes on with a fresh worker (:mod:`flyreg._search.worker`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flyreg._core.config import Config, JSONScalar
from flyreg._core.results import BenchResult, TunerStats
from flyreg._core.search_terms import SearchSettings
from flyreg._search import journal
from flyreg._search.candidates import CandidateError, Evaluator, Measured, Rejected
from flyreg._search.graphs import CaptureError
from flyreg._search.worker import IsolationError, WorkerEvaluator

#: ``compile(configs) -> {config: why its compile failed}`` (a :class:`~flyreg._search.compile_pool.CompilePool`'s).
Compile = Callable[[Sequence[Config]], dict[Config, str]]


class IsolatedEvaluator(Evaluator):
    """Compiles each batch with ``compile`` (None: the worker compiles), then has ``bench`` (a worker whose
    ``measure`` is :meth:`flyreg._search.in_process.InProcessEvaluator.measure`) time it one config at a
    time. A worker that cannot set up again ends the search (:class:`IsolationError`)."""

    fatal = (IsolationError,)

    def __init__(self, settings: SearchSettings, spec: dict[str, JSONScalar], device: Any, stats: TunerStats,
                 machine: journal.Machine | None, bench: WorkerEvaluator, compile: Compile | None = None) -> None:
        super().__init__(settings, spec, device, stats, machine)
        self.bench, self.compile = bench, compile
        self._compiled: set[Config] = set()
        self._warm_next = False
        self._workers = bench.replaced

    def _ready(self, todo: list[Config], out: dict[Config, float | None]) -> list[tuple[Config, Config]]:
        new = [c for c in todo if c not in self._compiled]
        failed = self.compile(new) if self.compile is not None and new else {}
        self._compiled.update(new)
        ready = []
        for config in todo:
            if config in failed:
                self._fail(config, failed[config], self.mode)
                out[config] = None
            else:
                ready.append((config, config))
        return ready

    def _warm(self, ready: list[tuple[Config, Any]]) -> None:
        self._warm_next = bool(ready)
        if ready and self.bench.limits.slowest is None:
            self._calibrate()

    def _calibrate(self) -> None:
        """Before a worker has finished any config, check the fastest config read from the journal (a contender,
        checked again here anyway): the time limit then adapts to a finished config before a failure retried
        by ``--force`` (a hang, say) runs, instead of leaving it the start-up allowance."""
        unchecked = sorted((c for c in self.timed if c not in self.checked), key=lambda c: self.timed[c].median)
        if unchecked:
            first = unchecked[0]
            passed = self._check([first])
            self.checked.update(passed)
            if first not in passed:
                del self.timed[first]

    def _check(self, configs: list[Config]) -> set[Config]:
        passed = set()
        for config, _ in self._ready(configs, {}):
            outcome = self.bench.measure(config, check=True, mode=self.mode)
            measured: Measured | None = outcome.value
            if outcome.error is not None or measured is None:
                self._fail(config, str(outcome.error), self.mode)
            elif measured.rejected:
                self._reject(config, str(measured.error))
            elif measured.error is not None:
                self._fail(config, measured.error, self.mode)
            else:
                passed.add(config)
        return passed

    def _time(self, config: Config, scale: int) -> BenchResult:
        fresh = self.bench.replaced != self._workers  # a new worker's device has idled while it started
        self._workers = self.bench.replaced
        outcome = self.bench.measure(config, scale=scale, warm=self._warm_next or fresh, mode=self.mode)
        self._warm_next = False
        if outcome.error is not None:
            raise CandidateError(outcome.error)
        measured: Measured = outcome.value
        if measured.uncapturable:
            raise CaptureError(measured.error)
        if measured.rejected:
            raise Rejected(str(measured.error))
        if measured.result is None:
            raise CandidateError(str(measured.error))
        self._timed_over(bool(measured.drawn))  # the worker's steady timer says (one that does not: copies)
        return measured.result
