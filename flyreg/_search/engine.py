"""One search: build, check and time every candidate config on a call's own inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch

from flyreg._core.config import Config, JSONScalar
from flyreg._core.fileio import warn_once
from flyreg._core.launch import Launcher, LaunchSignatureError
from flyreg._core.results import BenchResult, TuneError, TuneReport, TunerStats
from flyreg._search.bench import device_kind, do_bench, warm_device
from flyreg._search.binding import Bind, Build, bind_all, compile_threads
from flyreg._search.gate import mismatch, run_reference
from flyreg._search.settings import SearchSettings
from flyreg._search.graphs import CaptureError
from flyreg._search.steady import (InputSet, bench_steady, copy_budget, copy_inputs, free_bytes, replay_length,
                                   set_count, storages, viewed_bytes)

__all__ = ["Bind", "Build", "Call", "FINAL_BAND", "FINAL_SCALE", "FINALISTS", "InPlace", "bind_all", "compile_threads",
           "finalists", "pick_winner", "run_search"]


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
               default: Config | None, build: Build, bind: Bind, stats: TunerStats) -> TuneReport:
    """Build, check and time every candidate (and ``default``) on the call's own inputs; the report names
    the winner. ``stats`` counts the configs benchmarked and the finalists timed again.

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
    op, args, kwargs, device = settings.op, call.args, call.kwargs, call.device
    cands = list(candidates)
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
    written = {**restore, **zeroed}
    if settings.reference is not None:
        ref, expected = run_reference(settings.reference, settings.arg_names, args, kwargs, snapshot, zeroed)
    failed: list[tuple[Config, str]] = []
    rejected: list[tuple[Config, str]] = []
    bound = bind_all(op, cands, build, bind, settings.compile_threads)
    checked: list[tuple[Config, Launcher]] = []
    try:
        for config in cands:
            try:
                launcher = bound[config]
                if isinstance(launcher, Exception):
                    raise launcher
                if ref is not None:
                    in_place.prepare(own, launcher.pre)
                    why = mismatch(launcher.raw(args, kwargs), ref)
                    for n, want in expected.items():
                        why = why or mismatch(written[n], want, f"in-place argument {n!r}")
                    if why:
                        rejected.append((config, why))
                        continue
            except LaunchSignatureError:  # the call is wrong, not the config
                raise
            except Exception as e:  # a failing candidate is skipped, never fatal
                _failed(op, spec, config, e, failed)
                continue
            checked.append((config, launcher))
        if checked and device is not None:  # right before timing: the checks may have let the clocks drop
            first = checked[0][1]
            try:
                warm_device(lambda: (in_place.prepare(own, first.pre), first.raw(args, kwargs)), device)
            except Exception:  # that candidate fails again, and is reported, when its turn comes
                pass
        timed, final = _time_all(settings, spec, checked, own, device, in_place, default, failed, stats)
    finally:
        in_place.prepare(own, None)  # the real call that follows runs on the true inputs
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
    return TuneReport(op, spec, winner, winner_ms, default_ms, tuple(timed), tuple(failed), tuple(rejected))


@attrs.frozen
class InPlace:
    """The call's in-place tensors: ``restore`` (name -> tensor) with their ``snapshot``, and the
    ``zero`` ones."""

    restore: dict[str, torch.Tensor]
    snapshot: dict[str, torch.Tensor]
    zero: list[torch.Tensor]

    def __bool__(self) -> bool:
        return bool(self.restore or self.zero)

    def prepare(self, s: InputSet, pre: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None) -> None:
        """Ready input set ``s`` (the call's own, or a copy) for one call: restore, zero, then the
        config's pre-hook."""
        for n, t in self.restore.items():
            s[t].copy_(self.snapshot[n])
        for t in self.zero:
            s[t].zero_()
        if pre is not None:
            pre(s.args, s.kwargs)


#: The final round: candidates within FINAL_BAND of the fastest (at most FINALISTS of them, and the
#: default) are timed again over FINAL_SCALE times the work, and ranked by that. On the H200 short
#: replays alone mis-ranked RMSNorm configs up to 1.2 % apart (4096 x 7168); replays of the final
#: round's length picked within 0.1 % of the best a 50-call benchmark found, on every shape tried.
FINAL_BAND = 0.03
FINALISTS = 6
FINAL_SCALE = 8

#: ``time_one(launcher, scale)``: one candidate's timing over ``scale`` times the base work.
TimeOne = Callable[[Launcher, int], BenchResult]


#: What timing returns: every timed candidate's result, and the finalists the final round re-timed.
Timed = tuple[list[tuple[Config, BenchResult]], frozenset[Config]]


def _time_all(settings: SearchSettings, spec: dict[str, JSONScalar], checked: list[tuple[Config, Launcher]],
              own: InputSet, device: Any, in_place: InPlace, default: Config | None,
              failed: list[tuple[Config, str]], stats: TunerStats) -> Timed:
    """Time each checked candidate the settings' way, then the final round. When steady-state timing
    cannot capture a candidate in a CUDA graph, every candidate is timed as single calls after an
    L2 flush instead."""
    op = settings.op
    mode = settings.timing if device is not None and device_kind(device) == "cuda" else "cpu"
    if mode == "steady":
        try:
            return _time_rounds(op, spec, checked, _steady_timer(settings, checked, own, device, in_place),
                                default, failed, stats)
        except CaptureError as e:
            warn_once(f"flyreg: {op}: spec {spec} cannot be timed in a CUDA graph ({e}); timing single "
                      f"calls after an L2 flush instead", key=f"no-steady:{op}:{sorted(spec.items())}")
            mode = "flushed"

    def time_one(launcher: Launcher, scale: int) -> BenchResult:
        return do_bench(lambda: launcher.raw(own.args, own.kwargs), settings.warmup, settings.rep * scale,
                        setup=lambda: in_place.prepare(own, launcher.pre),
                        device=device if mode != "cpu" else "cpu", cuda_graph=mode == "graph")

    return _time_rounds(op, spec, checked, time_one, default, failed, stats)


def _time_rounds(op: str, spec: dict[str, JSONScalar], checked: list[tuple[Config, Launcher]],
                 time_one: TimeOne, default: Config | None, failed: list[tuple[Config, str]],
                 stats: TunerStats) -> Timed:
    """Every candidate once, then the finalists again (their final times replace the first).

    A :class:`CaptureError` in the first round ends the timing (the caller falls back), and then
    no failure is merged into ``failed``; in the final round it leaves that finalist its first
    time, outside the final ranking. A finalist that fails otherwise is dropped and reported, as
    in the first round: a config that fails on a re-run is not served.
    """
    timed: dict[Config, BenchResult] = {}
    errors: list[tuple[Config, Exception]] = []
    for config, launcher in checked:
        try:
            timed[config] = time_one(launcher, 1)
        except CaptureError:
            raise
        except Exception as e:  # a failing candidate is skipped, never fatal
            errors.append((config, e))
    stats.benchmarks += len(timed)
    launchers = dict(checked)
    final: set[Config] = set()
    for config in finalists(timed, default):
        try:
            timed[config] = time_one(launchers[config], FINAL_SCALE)
        except CaptureError:
            continue
        except Exception as e:
            del timed[config]
            errors.append((config, e))
            continue
        stats.retimed += 1
        final.add(config)
    for config, e in errors:
        _failed(op, spec, config, e, failed)
    return list(timed.items()), frozenset(final)


def finalists(timed: dict[Config, BenchResult], default: Config | None) -> list[Config]:
    """The configs the final round re-times: up to :data:`FINALISTS` within :data:`FINAL_BAND` of the
    fastest, fastest first, and the default where it was timed; none when that leaves one config."""
    if len(timed) < 2:
        return []
    best = min(r.median for r in timed.values())
    near = sorted((c for c, r in timed.items() if r.median <= best * (1 + FINAL_BAND)), key=lambda c: timed[c].median)
    out = near[:FINALISTS]
    if default in timed and default not in out:
        out.append(default)
    return out if len(out) > 1 else []  # one config alone: nothing to rank


def _steady_timer(settings: SearchSettings, checked: list[tuple[Config, Launcher]], own: InputSet, device: Any,
                  in_place: InPlace) -> TimeOne:
    """Steady-state timing (:mod:`flyreg._search.steady`) on copies of the call's inputs shared by all candidates."""
    args, kwargs = own.args, own.kwargs
    prepared = bool(in_place) or any(la.pre is not None for _, la in checked)
    budget = copy_budget(free_bytes(device))
    copied = sum(b for b in storages(args, kwargs).values() if b <= budget)
    # An in-place tensor too large to copy would be shared by every set: each call must then be
    # the only one between preparations, so there is one set.
    shared = any(t.untyped_storage().nbytes() > budget for t in (*in_place.restore.values(), *in_place.zero))
    n = 1 if shared else set_count(viewed_bytes(args, kwargs), prepared, budget, copied)
    sets = [own]
    try:
        for _ in range(n - 1):
            sets.append(copy_inputs(args, kwargs, budget))
    except torch.cuda.OutOfMemoryError:  # memory went elsewhere meanwhile: rotate through the sets made
        torch.cuda.empty_cache()

    # scale -> calls of an unprepared replay at scale 1, sized on the first candidate timed at that
    # scale and kept for the others: the first round's first candidate, the final round's fastest.
    replay_calls: dict[int, int] = {}

    def time_one(launcher: Launcher, scale: int) -> BenchResult:
        pre = launcher.pre
        prepare = (lambda s: in_place.prepare(s, pre)) if in_place or pre else None
        if prepare is not None:
            return bench_steady(launcher.raw, sets, settings.warmup, settings.rep, prepare, scale)
        if scale not in replay_calls:
            replay_calls[scale] = replay_length(launcher.raw, sets)
        return bench_steady(launcher.raw, sets, settings.warmup, settings.rep, None, scale, replay_calls[scale])

    return time_one


def _failed(op: str, spec: dict[str, JSONScalar], config: Config, e: Exception,
            failed: list[tuple[Config, str]]) -> None:
    failed.append((config, f"{type(e).__name__}: {e}"))
    warn_once(f"flyreg: {op}: config {config} failed on spec {spec}: {type(e).__name__}: {e}")
