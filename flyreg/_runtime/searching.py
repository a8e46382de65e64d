"""The last source of the chain: search a call's configs, then store the winner.

The search (``flyreg._search``) is imported when one starts, never by a served call.
"""

from __future__ import annotations

import datetime
import functools
import os
from typing import TYPE_CHECKING

import attrs

from flyreg._artifacts import cache
from flyreg._artifacts.store import emit_artifact, emit_dir
from flyreg._core.config import Config, JSONScalar
from flyreg._core.fileio import warn_once
from flyreg._core.keys import DeviceIdentity, env_values
from flyreg._core.peaks import Peak, known_peak, peak_of
from flyreg._core.results import Resolution, TuneReport
from flyreg._core.search_terms import Call, SearchSettings
from flyreg._core.toolchain import current, fingerprint
from flyreg._runtime.state import TunerState

if TYPE_CHECKING:
    from flyreg._search.isolated_evaluator import Compile
    from flyreg._search.journal import Machine
    from flyreg._search.worker import WorkerEvaluator


def time_config(tuner: TunerState, config: Config, spec: dict[str, JSONScalar], call: Call) -> float:
    """``config`` checked against the reference on ``call`` and timed, as a search times a candidate, storing
    nothing; raises :class:`TuneError` naming why when it fails or is wrong."""
    from flyreg._search.engine import run_search

    config = tuner.space.canonical(config, spec)

    def build(c: Config) -> object:
        return tuner.build_cache.get(tuner.name, c, spec, tuner.structural, tuner.build)

    report = run_search(tuner.settings, spec, call, [config], None, build,
                        lambda c: tuner.bind(c, spec, call.args, call.kwargs), tuner.stats)
    return report.winner_ms


def search(tuner: TunerState, spec: dict[str, JSONScalar], ident: DeviceIdentity, pkey: str, call: Call, *,
           emit: bool, out_dir: str | os.PathLike[str] | None = None,
           settings: SearchSettings | None = None) -> tuple[Resolution, OSError | None]:
    """Search (with ``settings``, default the tuner's), store the winner in the scratch cache and, with
    ``emit``, write its artifact.

    Returns the resolution and the error of a failed artifact write (None when written or not asked);
    the report lands in ``tuner.reports[pkey]``.
    """
    from flyreg._search.engine import run_search

    tuner.stats.searches += 1
    default = tuner.space.default(spec, ident)

    def build(config: Config) -> object:
        return tuner.build_cache.get(tuner.name, config, spec, tuner.structural, tuner.build)

    report = run_search(settings if settings is not None else tuner.settings, spec, call, tuner.space.candidates(spec),
                        default, build, lambda config: tuner.bind(config, spec, call.args, call.kwargs), tuner.stats,
                        machine=machine(tuner, spec, ident), seeds=lambda: seeds(tuner, spec, ident))
    return store(tuner, spec, ident, pkey, report, emit=emit, out_dir=out_dir)


def search_isolated(tuner: TunerState, spec: dict[str, JSONScalar], ident: DeviceIdentity, pkey: str, device: str,
                    bench: WorkerEvaluator, compile: Compile | None, *, emit: bool,
                    out_dir: str | os.PathLike[str] | None = None,
                    settings: SearchSettings | None = None) -> tuple[Resolution, OSError | None]:
    """:func:`search` with every candidate compiled by ``compile`` and timed by ``bench`` in worker processes
    (:class:`~flyreg._search.isolated_evaluator.IsolatedEvaluator`); this process runs none. ``spec`` and ``pkey``
    are those of the worker's call."""
    from flyreg._search.engine import run_strategy
    from flyreg._search.isolated_evaluator import IsolatedEvaluator

    tuner.stats.searches += 1
    settings = settings if settings is not None else tuner.settings
    evaluate = IsolatedEvaluator(settings, spec, device, tuner.stats, machine(tuner, spec, ident), bench, compile)
    report = run_strategy(evaluate, settings, spec, tuner.space.candidates(spec), tuner.space.default(spec, ident),
                          lambda: seeds(tuner, spec, ident))
    return store(tuner, spec, ident, pkey, report, emit=emit, out_dir=out_dir)


def seeds(tuner: TunerState, spec: dict[str, JSONScalar], ident: DeviceIdentity) -> list[Config]:
    """The winners of the nearest tuned specs, where a budgeted search starts."""
    return [tuner.space.canonical(c, spec) for c in tuner.offline.nearest_configs(spec, ident, tuner.space.accepts)]


def store(tuner: TunerState, spec: dict[str, JSONScalar], ident: DeviceIdentity, pkey: str, report: TuneReport, *,
          emit: bool, out_dir: str | os.PathLike[str] | None = None) -> tuple[Resolution, OSError | None]:
    """Store a search's winner in the scratch cache and, with ``emit``, write its artifact; see :func:`search`.

    Both record the search's decision with the device peak it is judged against: measured where no
    datasheet figure is known only when emitting (an online search never takes the device for it)."""
    if report.decision is not None:
        peak = tuning_peak(ident) if emit else known_peak(ident.name)
        report = attrs.evolve(report, decision=attrs.evolve(report.decision, peak=peak))
    entry = {"spec": spec, "device": ident.to_json(), "toolchain": fingerprint(tuner.version),
             "env": dict(env_values(tuner.key_env)), "config": report.winner.to_json(),
             "time_ms": report.winner_ms, "default_ms": report.default_ms,
             "decision": report.decision.to_json() if report.decision is not None else None,
             "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        cache.store(tuner.name, pkey, entry)
    except OSError as e:
        warn_once(f"flyreg: {tuner.name}: could not write the scratch cache: {e}")
    artifact, error = None, None
    if emit:
        try:
            artifact = str(emit_artifact(tuner.name, spec, ident, report.winner, tuner.version,
                                         report.winner_ms, report.default_ms, out_dir, decision=report.decision))
        except OSError as e:
            where = out_dir if out_dir is not None else emit_dir()
            error = OSError(f"could not write the artifact of spec {spec} into {os.fspath(where)!r}: "
                            f"{type(e).__name__}: {e}")
            error.__cause__ = e
    tuner.reports[pkey] = attrs.evolve(report, artifact=artifact)
    return Resolution(report.winner, "search", spec, "search", path=artifact), error


@functools.cache
def tuning_peak(ident: DeviceIdentity) -> Peak:
    """The peak searches on ``ident`` are judged against: measured once a process where it is not known."""
    return peak_of(ident)


def machine(tuner: TunerState, spec: dict[str, JSONScalar], ident: DeviceIdentity) -> Machine:
    """What the tuning journal keys a search's measurements by, besides op, spec and timing: the device,
    and the toolchain the scratch cache's key holds (:func:`flyreg._core.toolchain.current`) with the
    values of the op's ``key_env`` variables (``env:NAME``), which change what a config runs, and ``inputs``
    where the op draws its inputs by seed (timed over draws: never ranked with times over copies of one call)."""
    from flyreg._search.journal import Machine

    env = {f"env:{k}": v for k, v in env_values(tuner.key_env) if v is not None}
    drawn = {"inputs": "draws"} if tuner.seeded_inputs else {}
    return Machine(ident.to_json(), {**current(spec, ident.arch, tuner.version), **env, **drawn})
