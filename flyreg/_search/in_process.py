"""Candidates made ready and timed in this process: bound, checked by the correctness gate, timed.

:func:`evaluating` sets a search up on a call's own inputs (its in-place tensors, the
reference's result) and yields an :class:`InProcessEvaluator`. The same evaluator, kept in a
worker process, measures an isolated search's configs one at a time (:meth:`InProcessEvaluator.measure`).
While candidates are built, bound, gated or timed, their output is captured (:func:`flyreg._search.output.captured`,
once around each step, never around each timed call): a failure keeps its end, a success's is dropped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import attrs
import torch

from flyreg._core.config import Config, JSONScalar
from flyreg._core.launch import Launcher, LaunchSignatureError
from flyreg._core.results import BenchResult, TunerStats
from flyreg._core.search_terms import Call, SearchSettings
from flyreg._search import journal
from flyreg._search.bench import warm_device
from flyreg._search.binding import Bind, Build, CandidateExited, bind_all
from flyreg._search.candidates import CandidateError, Evaluator, Measured, reason
from flyreg._search.gate import mismatch, run_reference
from flyreg._search.graphs import CaptureError
from flyreg._search.output import OutputTail, captured, with_output
from flyreg._search.steady import Draws, InputSet
from flyreg._search.timers import InPlace, TimeOne, single_call_timer, steady_timer


@attrs.frozen
class Gate:
    """The correctness gate: the reference's result (None: nothing is rejected) and the state each
    in-place tensor (``written``, by name) must be left in (``expected``)."""

    ref: Any
    expected: dict[str, torch.Tensor]
    written: dict[str, torch.Tensor]


def _tensors(op: str, names: tuple[str, ...], named: dict[str, Any], what: str) -> dict[str, torch.Tensor]:
    out = {}
    for n in names:
        if n not in named:
            raise ValueError(f"{op}: {what} names {n!r}, which is not an argument of this call "
                             f"(arguments: {sorted(named)})")
        if not isinstance(named[n], torch.Tensor):
            raise TypeError(f"{op}: {what} names {n!r}, which is {type(named[n]).__name__}, not a tensor")
        out[n] = named[n]
    return out


@contextlib.contextmanager
def evaluating(settings: SearchSettings, spec: dict[str, JSONScalar], call: Call, build: Build, bind: Bind,
               stats: TunerStats, machine: journal.Machine | None) -> Iterator[InProcessEvaluator]:
    """An evaluator on the call's own inputs; on exit the in-place tensors are back as the call passed them.

    The reference (when the settings have one) runs once, on private copies of the in-place
    tensors (restored, or zeroed), so it never touches the real ones; the state it leaves them in
    is what each candidate must write (see :func:`flyreg._search.engine.run_search`).
    """
    restore = _tensors(settings.op, settings.restore_value, call.named, "restore_value")
    zeroed = _tensors(settings.op, settings.reset_to_zero, call.named, "reset_to_zero")
    snapshot = {n: t.clone() for n, t in restore.items()}
    in_place = InPlace(restore, snapshot, list(zeroed.values()))
    own = InputSet(call.args, call.kwargs, {})  # the call's own arguments, as an input set of their own
    ref = None
    expected: dict[str, torch.Tensor] = {}  # in-place tensor -> the state the reference left it in
    if settings.reference is not None:
        ref, expected = run_reference(settings.reference, settings.arg_names, call.args, call.kwargs, snapshot,
                                      zeroed)
    gate = Gate(ref, expected, {**restore, **zeroed})
    try:
        yield InProcessEvaluator(settings, spec, own, call.device, in_place, gate, build, bind, stats, machine,
                                 call.draws)
    finally:
        in_place.prepare(own, None)  # the real call that follows runs on the true inputs


class InProcessEvaluator(Evaluator):
    """Binds a batch (compiles overlap on a thread pool), gates each config, then times them one by one."""

    def __init__(self, settings: SearchSettings, spec: dict[str, JSONScalar], own: InputSet, device: Any,
                 in_place: InPlace, gate: Gate, build: Build, bind: Bind, stats: TunerStats,
                 machine: journal.Machine | None, draws: Draws | None = None) -> None:
        super().__init__(settings, spec, device, stats, machine)
        self.own, self.in_place, self.gate, self.build, self.bind = own, in_place, gate, build, bind
        self.draws = draws  # other draws of the call's spec, which steady timing rotates through
        self.launchers: dict[Config, Launcher] = {}
        self._timer: TimeOne | None = None
        self.timer_drew = False  # whether the steady timer filled a set with a draw (see Measured.drawn)

    def measure(self, config: Config, scale: int = 1, warm: bool = False, mode: str | None = None,
                check: bool = False) -> Measured:
        """``config`` bound, gated and timed over ``scale`` times the work in ``mode`` (default: the current
        one), after warming the device when ``warm``; with ``check``, bound and gated only (an empty
        :class:`Measured` when it passes). Journals nothing. What an isolated search's benchmarking
        worker runs for each config."""
        if mode is not None and mode != self.mode:
            self.mode, self._timer = mode, None
        rejected = len(self.rejected)
        ready = self._ready([config], {})
        if not ready:
            if len(self.rejected) > rejected:
                return Measured(error=self.rejected[-1][1], rejected=True)
            return Measured(error=self.failed[-1][1])
        if check:
            return Measured()
        if warm:
            self._warm(ready)
        try:
            result = self._time(ready[0][1], scale)
            return Measured(result, drawn=self.timer_drew if self.mode == "steady" else None)
        except CaptureError as e:
            return Measured(error=str(e), uncapturable=True)
        except Exception as e:  # the caller records it
            return Measured(error=reason(e))

    def _ready(self, todo: list[Config], out: dict[Config, float | None]) -> list[tuple[Config, Launcher]]:
        """The launchers of ``todo`` that bind and pass the gate; each other config's None goes into ``out``.
        Past the deadline (once a config is measured) the configs not yet bound and gated are left out."""
        settings, own = self.settings, self.own
        new = [c for c in todo if c not in self.launchers]
        deadline = self.deadline if self.timed or self.failed or self.rejected else None
        bound: dict[Config, Launcher | Exception] = {}
        binding: OutputTail | None = None  # what the batch's builds and binds wrote (they overlap)
        if new:
            with captured() as binding:
                bound = bind_all(settings.op, new, self.build, self.bind, settings.compile_threads, deadline)
        ready = []
        for config in todo:
            if config not in self.launchers and (config not in bound or self.late()):
                continue  # the deadline came first
            launcher = self.launchers[config] if config in self.launchers else bound[config]
            output = binding
            try:
                if isinstance(launcher, Exception):
                    raise launcher
                if config not in self.launchers and self.gate.ref is not None:
                    with captured() as output:
                        why = self._gate(launcher)
                    if why:
                        self._reject(config, with_output(why, output))
                        out[config] = None
                        continue
            except LaunchSignatureError:  # the call is wrong, not the config
                raise
            except (Exception, SystemExit) as e:  # a failing candidate is skipped, never fatal
                self._fail(config, with_output(reason(CandidateExited.of(e)), output), self.mode)
                out[config] = None
                continue
            self.launchers[config] = launcher
            ready.append((config, launcher))
        return ready

    def _gate(self, launcher: Launcher) -> str | None:
        """Why ``launcher``'s result, or the state it leaves an in-place tensor in, is wrong; None: it is right."""
        own = self.own
        self.in_place.prepare(own, launcher.pre)
        why = mismatch(launcher.raw(own.args, own.kwargs), self.gate.ref)
        for n, want in self.gate.expected.items():
            why = why or mismatch(self.gate.written[n], want, f"in-place argument {n!r}")
        return why

    def _warm(self, ready: list[tuple[Config, Launcher]]) -> None:
        """Right before timing: the checks may have let the clocks drop."""
        if not ready or self.device is None:
            return
        first = ready[0][1]
        try:
            with captured():
                warm_device(lambda: (self.in_place.prepare(self.own, first.pre),
                                     first.raw(self.own.args, self.own.kwargs)), self.device)
        except (Exception, SystemExit):  # that candidate fails again, and is reported, when its turn comes
            pass

    def _time(self, launcher: Launcher, scale: int) -> BenchResult:
        with captured() as output:  # once around the whole timing: the timed calls run as they would uncaptured
            try:
                if self._timer is None:
                    self._timer = self._make_timer()
                self._timed_over(self.timer_drew)
                return self._timer(launcher, scale)
            except (CaptureError, CandidateError):  # the search's to handle as they are
                raise
            except (Exception, SystemExit) as e:
                failure = CandidateExited.of(e)
        raise CandidateError(with_output(reason(failure), output)) from failure

    def _check(self, configs: list[Config]) -> set[Config]:
        return {config for config, _ in self._ready(configs, {})}

    def _make_timer(self) -> TimeOne:
        settings, own, in_place, mode = self.settings, self.own, self.in_place, self.mode
        if mode == "steady":
            time_one, self.timer_drew = steady_timer(settings, list(self.launchers.values()), own, self.device,
                                                     in_place, self.draws)
            return time_one
        return single_call_timer(settings, own, self.device if mode != "cpu" else "cpu", in_place, mode == "graph")

    def _fall_back(self, e: CaptureError) -> None:
        super()._fall_back(e)
        self._timer = None
