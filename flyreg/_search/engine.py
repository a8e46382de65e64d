"""One search: check and time a call's candidate configs on its own inputs, and pick the winner."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from flyreg._core.config import Config, JSONScalar
from flyreg._core.fileio import warn_once
from flyreg._core.results import TuneError, TuneReport, TunerStats
from flyreg._core.search_terms import SearchSettings
from flyreg._search import progress
from flyreg._search.binding import Bind, Build, bind_all, compile_threads
from flyreg._search.candidates import (
    FINAL_BAND,
    FINAL_SCALE,
    FINAL_SHARE,
    FINALISTS,
    Evaluator,
    final_timing,
    finalists,
)
from flyreg._search.decide import decide
from flyreg._search.in_process import Call, InPlace, evaluating
from flyreg._search.journal import Machine
from flyreg._search.strategy import Budget, Exhaustive, choose

__all__ = ["FINALISTS", "FINAL_BAND", "FINAL_SCALE", "Bind", "Build", "Call", "InPlace", "Machine", "bind_all",
           "compile_threads", "decide", "final_timing", "finalists", "run_search", "run_strategy"]


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
    started = time.monotonic()  # the budget counts the reference's run too
    with evaluating(settings, spec, call, build, bind, stats, machine) as evaluate:
        return run_strategy(evaluate, settings, spec, candidates, default, seeds, started=started)


def run_strategy(evaluate: Evaluator, settings: SearchSettings, spec: dict[str, JSONScalar], candidates: list[Config],
                 default: Config | None, seeds: Callable[[], Sequence[Config]] = tuple, *,
                 started: float | None = None) -> TuneReport:
    """The settings' strategy over ``candidates`` (the default among them) through ``evaluate``, its final
    round, and the report naming the winner; TuneError when there is no candidate or every one failed.

    A time budget (``settings.budget_s``, counted from ``started``, default now) covers all of it: the
    strategy stops in time to leave the final round its share (:data:`FINAL_SHARE`), a batch is cut
    short at the deadline once a config is measured, and a final round that does not fit is skipped.
    """
    op = settings.op
    cands = list(dict.fromkeys(candidates))
    if default is not None and default not in cands:
        cands.insert(0, default)
    if not cands:
        raise TuneError(f"{op}: no candidate configs for spec {spec}")
    strategy, cap = choose(len(cands), settings.effort, settings.strategy)
    starts = [default] if default is not None else []
    if not isinstance(strategy, Exhaustive):
        starts += seeds()
    started = started if started is not None else time.monotonic()
    budget_s = settings.budget_s
    if budget_s is not None:
        evaluate.deadline = started + budget_s
    progress.planned(len(cands) if cap is None else min(cap, len(cands)), budget_s)
    strategy.run(cands, evaluate, Budget(cap, budget_s, settings.seed, started, reserve=lambda: min(
        evaluate.final_seconds(default), FINAL_SHARE * (budget_s or 0.0))), starts)
    final = evaluate.final_round(default)
    timed, failed, rejected = list(evaluate.timed.items()), evaluate.failed, evaluate.rejected
    if timed:  # some configs are right: each wrong one is worth a warning (else the caller reports them all)
        for config, why in rejected:
            warn_once(f"flyreg: {op}: config {config} rejected on spec {spec}: wrong result ({why})")
    else:
        lines = [f"  {c}: {why}" for c, why in (*failed, *rejected)]
        raise TuneError(f"{op}: every config failed on spec {spec}:\n" + "\n".join(lines), tuple(failed),
                        tuple(rejected))
    # After a final round only its times rank: a config outside it kept a shorter, noisier time.
    winner, result, decision = decide([t for t in timed if t[0] in final] if final else timed, default,
                                      settings.tie_band, evaluate.mode, evaluate.inputs)
    default_ms = next((r.median for c, r in timed if c == default), None)
    return TuneReport(op, spec, winner, result.median, default_ms, tuple(timed), tuple(failed), tuple(rejected),
                      reused=evaluate.reused, decision=decision)


