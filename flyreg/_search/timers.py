"""How one candidate is timed: on copies of the call's inputs in steady state, or as single calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch

from flyreg._core.launch import Launcher
from flyreg._core.results import BenchResult
from flyreg._core.search_terms import SearchSettings
from flyreg._search.bench import do_bench
from flyreg._search.steady import (Draws, InputSet, bench_steady, copy_budget, copy_inputs, fill_from_draw, free_bytes,
                                   plan_sets, replay_length, storages, viewed_bytes)

#: ``time_one(launcher, scale)``: one candidate's timing over ``scale`` times the base work.
TimeOne = Callable[[Launcher, int], BenchResult]


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


def single_call_timer(settings: SearchSettings, own: InputSet, device: Any, in_place: InPlace,
                      cuda_graph: bool) -> TimeOne:
    """Single calls (``device`` ``"cpu"``: on the CPU; else after an L2 flush, or in a CUDA graph)."""

    def time_one(launcher: Launcher, scale: int) -> BenchResult:
        return do_bench(lambda: launcher.raw(own.args, own.kwargs), settings.warmup, settings.rep * scale,
                        setup=lambda: in_place.prepare(own, launcher.pre), device=device, cuda_graph=cuda_graph)

    return time_one


def _filled(s: InputSet, own: InputSet, draws: Draws, seed: int) -> bool:
    """Whether set ``s`` now holds draw ``seed``'s values: False where the draw failed (its error is the
    op's ``make_inputs``', not the candidate's) or is not shaped like the call."""
    try:
        return fill_from_draw(s, own, draws(seed))
    except Exception:
        return False


def steady_timer(settings: SearchSettings, launchers: list[Launcher], own: InputSet, device: Any,
                 in_place: InPlace, draws: Draws | None = None) -> tuple[TimeOne, bool]:
    """Steady-state timing (:mod:`flyreg._search.steady`) on copies of the call's inputs shared by all
    candidates; the copies are sized on the ``launchers`` bound when the first timing starts. With
    ``draws``, copy ``i`` holds draw ``i``'s values while the draws are shaped like the call (the first that is
    not, or that fails, ends them: the rest stay copies). A draw makes a whole call at once, so there are draws
    only while one fits in half the free device memory, and none for a call with values to restore (a set
    would mix the call's restored tensors with a draw's others). Also returns whether any set holds a draw."""
    args, kwargs = own.args, own.kwargs
    prepared = bool(in_place) or any(la.pre is not None for la in launchers)
    free, viewed = free_bytes(device), viewed_bytes(args, kwargs)
    draws = draws if viewed <= free // 2 and not in_place.restore else None
    n, share = plan_sets(storages(args, kwargs).values(), viewed, prepared, copy_budget(free),
                         [t.untyped_storage().nbytes() for t in (*in_place.restore.values(), *in_place.zero)],
                         draws is not None)
    sets, reserved, drawn = [own], draws is not None, False  # a draw makes a whole call, whose memory stays reserved
    try:
        for i in range(1, n):
            sets.append(copy_inputs(args, kwargs, share))
            draws = draws if draws is not None and _filled(sets[-1], own, draws, i) else None
            drawn = drawn or draws is not None
    except torch.cuda.OutOfMemoryError:  # memory went elsewhere meanwhile: rotate through the sets made
        reserved = True
    if reserved:  # the draws' whole calls (or the failed copy) left memory reserved: it goes back
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

    return time_one, drawn
