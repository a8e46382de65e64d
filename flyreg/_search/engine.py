"""One search: check and time a call's candidate configs on its own inputs, and pick the winner."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from flyreg._core.config import Config, JSONScalar
from flyreg._core.fileio import warn_once
from flyreg._core.results import BenchResult, TuneError, TuneReport, TunerStats
from flyreg._search.binding import Bind, Build, bind_all, compile_threads
from flyreg._search.candidates import (FINAL_BAND, FINAL_SCALE, FINALISTS, Evaluator, Gate, InPlace, finalists,
                                       final_timing)
from flyreg._search.gate import run_reference
from flyreg._search.journal import Machine
from flyreg._search.settings import SearchSettings
from flyreg._search.steady import InputSet
from flyreg._search.strategy import Budget, Exhaustive, choose

__all__ = ["Bind", "Build", "Call", "FINAL_BAND", "FINAL_SCALE", "FINALISTS", "InPlace", "Machine", "bind_all",
           "compile_threads", "final_timing", "finalists", "pick_winner", "run_search"]


@attrs.frozen
class Call:
    """The call a search runs on: its arguments, by position and keyword and by name, and its device."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    named: dict[str, Any]
    device: Any


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


def pick_winner(timed: list[tuple[Config, BenchResult]], default: Config | None, tie_band: float) -> tuple[Config, float]:
    """The fastest config; within ``tie_band`` of it, the default first, then the earliest.

    The default also stays when its middle reps (p20 to p80) reach the fastest's: then this
    measurement cannot tell the two apart (launch-bound kernels, a few microseconds, where
    host and clock jitter exceed the differences between configs).
    """
    fastest = min((r for _, r in timed), key=lambda r: r.median)
    best = fastest.median
    for c, r in timed:
        if c == default and (r.median <= best * (1 + tie_band) or r.p20 <= fastest.p80):
            return c, r.median
    near = [(c, r) for c, r in timed if r.median <= best * (1 + tie_band)]
    return near[0][0], near[0][1].median


def run_search(settings: SearchSettings, spec: dict[str, JSONScalar], call: Call, candidates: list[Config],
               default: Config | None, build: Build, bind: Bind, stats: TunerStats, *,
               machine: Machine | None = None, seeds: Callable[[], Sequence[Config]] = tuple) -> TuneReport:
    """Check and time the candidates (and ``default``) on the call's own inputs, as many as the settings'
    strategy and budget choose; the report names the winner. ``stats`` counts the configs
    benchmarked and the finalists timed again.

    The strategy (:func:`flyreg._search.strategy.choose`: every config of a small space, a seeded
    local search of a large one) starts from the default and, when budgeted, from ``seeds()`` (the
    winners of the nearest tuned specs). Each timing, failure and rejection is journaled under
    ``machine`` (None: not journaled); with ``settings.resume`` a config already journaled is not
    timed again (:class:`~flyreg._search.candidates.Evaluator`).

    The correctness gate (with a reference) compares each candidate's return value with the
    reference's and, for the in-place tensors (``restore_value`` and ``reset_to_zero``), the
    state the candidate leaves them in with the state the reference left them in, where the
    reference changed them. The reference runs once, on private copies of the in-place tensors
    (restored, or zeroed), so it never touches the real ones: a reference that updates them as a
    correct call does thereby states what each candidate must write; one that leaves them alone
    (a pure reference, returning only the output) states nothing about them, and they are not
    compared. Configs are never judged against each other (say, against the default's state):
    that would reject every correct config whenever the baseline is the wrong one. With no
    reference there is no ground truth, and nothing is rejected as wrong.
    """
    op, args, kwargs = settings.op, call.args, call.kwargs
    cands = list(dict.fromkeys(candidates))
    if default is not None and default not in cands:
        cands.insert(0, default)
    if not cands:
        raise TuneError(f"{op}: no candidate configs for spec {spec}")
    restore = _tensors(op, settings.restore_value, call.named, "restore_value")
    zeroed = _tensors(op, settings.reset_to_zero, call.named, "reset_to_zero")
    snapshot = {n: t.clone() for n, t in restore.items()}
    in_place = InPlace(restore, snapshot, list(zeroed.values()))
    own = InputSet(args, kwargs, {})  # the call's own arguments, as an input set of their own
    ref = None
    expected: dict[str, torch.Tensor] = {}  # in-place tensor -> the state the reference left it in
    if settings.reference is not None:
        ref, expected = run_reference(settings.reference, settings.arg_names, args, kwargs, snapshot, zeroed)
    evaluate = Evaluator(settings, spec, own, call.device, in_place, Gate(ref, expected, {**restore, **zeroed}),
                         build, bind, stats, machine)
    strategy, cap = choose(len(cands), settings.effort, settings.strategy)
    starts = [default] if default is not None else []
    if not isinstance(strategy, Exhaustive):
        starts += seeds()
    try:
        strategy.run(cands, evaluate, Budget(cap, settings.budget_s, settings.seed), starts)
        final = evaluate.final_round(default)
    finally:
        in_place.prepare(own, None)  # the real call that follows runs on the true inputs
    timed, failed, rejected = list(evaluate.timed.items()), evaluate.failed, evaluate.rejected
    if timed:  # some configs are right: each wrong one is worth a warning (else the caller reports them all)
        for config, why in rejected:
            warn_once(f"flyreg: {op}: config {config} rejected on spec {spec}: wrong result ({why})")
    else:
        lines = [f"  {c}: {why}" for c, why in (*failed, *rejected)]
        raise TuneError(f"{op}: every config failed on spec {spec}:\n" + "\n".join(lines), tuple(failed),
                        tuple(rejected))
    # After a final round only its times rank: a config outside it kept a shorter, noisier time.
    winner, winner_ms = pick_winner([t for t in timed if t[0] in final] if final else timed, default,
                                    settings.tie_band)
    default_ms = next((r.median for c, r in timed if c == default), None)
    return TuneReport(op, spec, winner, winner_ms, default_ms, tuple(timed), tuple(failed), tuple(rejected),
                      reused=evaluate.reused)


