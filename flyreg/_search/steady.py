"""Steady-state timing on a GPU: a call replayed in a CUDA graph over rotating copies of its inputs.

A memory-bound kernel timed alone after an L2 flush is not timed as it runs in a model: zeroing a
flush buffer leaves dirty lines that the timed call writes back, and a call on inputs still in L2
reads faster than any call in a forward pass. Here the calls of a replay cycle through copies of
the inputs (together at least twice the device's L2, :func:`~flyreg._core.device_facts.rotate_bytes`,
where :data:`MAX_SETS` copies reach it, so no call of a large shape finds its inputs in L2), the
outputs stay alive over the same distance, and launch cost is out (one CUDA graph of many calls).

Where the op draws its inputs by seed (``make_inputs`` takes one: a routing, say, moves its time), the
calls cycle through :data:`DRAWS` draws at least: each copy holds another draw's values
(:func:`fill_from_draw`), and storages too large for that many copies are shared by all of them.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch

from flyreg._core.device_facts import flush_bytes, rotate_bytes
from flyreg._core.results import BenchResult
from flyreg._search.graphs import capture

#: Most input copies a search makes, and most bytes they take together.
MAX_SETS = 64
COPY_BUDGET = 1024 * 1024 * 1024
#: Fewest input sets of a steady timing where the op draws its inputs by seed (each set a draw).
DRAWS = 4
#: ``draws(seed) -> (args, kwargs)``: another draw of a call's inputs (:attr:`flyreg._core.search_terms.Call.draws`).
Draws = Callable[[int], tuple[tuple[Any, ...], dict[str, Any]]]
#: Device time a replay lasts at least (when calls are short), and most calls it holds.
TARGET_MS = 0.25
MAX_CALLS = 256


def copy_budget(free_bytes: int) -> int:
    """Bytes of input copies a search may take when ``free_bytes`` of device memory are free:
    :data:`COPY_BUDGET`, or a quarter of what is free if that is less (a search on a serving
    GPU must not take the memory its model runs in)."""
    return min(COPY_BUDGET, max(0, free_bytes) // 4)


def free_bytes(device: Any) -> int:
    """Device memory free to this process: the driver's free memory plus torch's cached, unused blocks."""
    dev = torch.device(device)
    return torch.cuda.mem_get_info(dev)[0] + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)


@attrs.frozen
class InputSet:
    """One copy of a call's arguments: ``args``, ``kwargs``, and ``copies`` (id of an original tensor -> its copy)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    copies: dict[int, torch.Tensor]

    def __getitem__(self, original: torch.Tensor) -> torch.Tensor:
        """The copy standing for ``original`` in this set (``original`` itself where it is shared)."""
        return self.copies.get(id(original), original)


def _walk(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if type(value) in (tuple, list):
        return type(value)(_walk(v, fn) for v in value)
    if type(value) is dict:
        return {k: _walk(v, fn) for k, v in value.items()}
    return value


def _distinct_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value`` (tuples, lists and dicts looked into), each object once."""
    seen: dict[int, torch.Tensor] = {}

    def note(t: torch.Tensor) -> torch.Tensor:
        seen[id(t)] = t
        return t

    _walk(value, note)
    return list(seen.values())


def viewed_bytes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes of the elements the call's tensors view, each distinct tensor once (what a call reads)."""
    return sum(t.numel() * t.element_size() for t in _distinct_tensors((args, kwargs)))


def storages(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[tuple[Any, int], int]:
    """(device, storage address) -> bytes, for each storage the call's tensors view."""
    return {(t.device, t.untyped_storage().data_ptr()): t.untyped_storage().nbytes()
            for t in _distinct_tensors((args, kwargs))}


def copy_inputs(args: tuple[Any, ...], kwargs: dict[str, Any], budget: int = COPY_BUDGET) -> InputSet:
    """A copy of the call's arguments: each storage its tensors view is copied once and every tensor is
    re-viewed onto its storage's copy (same offset, sizes and strides), so aliasing, slices and
    strides are those of the call. A storage of more than ``budget`` bytes is shared, not copied.
    """
    fresh: dict[tuple[Any, int], torch.UntypedStorage] = {}
    copies: dict[int, torch.Tensor] = {}

    def copy(t: torch.Tensor) -> torch.Tensor:
        if id(t) in copies:  # the same tensor passed twice stays one tensor
            return copies[id(t)]
        s = t.untyped_storage()
        if s.nbytes() > budget:
            return t
        key = (t.device, s.data_ptr())
        if key not in fresh:
            fresh[key] = s.clone()
        c = torch.empty((0,), dtype=t.dtype, device=t.device).set_(fresh[key], t.storage_offset(), t.size(),
                                                                   t.stride())
        copies[id(t)] = c
        return c

    new_args, new_kwargs = _walk((args, kwargs), copy)
    return InputSet(new_args, new_kwargs, copies)


def fill_from_draw(s: InputSet, own: InputSet, drawn: tuple[tuple[Any, ...], dict[str, Any]]) -> bool:
    """Give the copies of input set ``s`` (made of ``own``) the values of ``drawn``, another draw of the call,
    tensor for tensor; a tensor ``s`` shares with ``own`` keeps its values. False, and ``s`` unchanged,
    where the draw is not laid out as the call (positional count, keyword names in order, then each
    tensor's shape and dtype): tensors pair by their place in the call."""
    (args, kwargs), mine, theirs = drawn, _distinct_tensors((own.args, own.kwargs)), _distinct_tensors(drawn)
    if (len(args), list(kwargs)) != (len(own.args), list(own.kwargs)) or len(mine) != len(theirs) \
            or any((a.shape, a.dtype) != (b.shape, b.dtype) for a, b in zip(mine, theirs)):
        return False
    for original, value in zip(mine, theirs):
        copy = s.copies.get(id(original))
        if copy is not None:
            copy.copy_(value)
    return True


def set_count(set_bytes: int, prepared: bool, budget: int = COPY_BUDGET, copy_bytes: int | None = None,
              rotate: int | None = None) -> int:
    """Input sets to rotate through (the call's own arguments are one of them).

    Enough that the bytes the call's tensors view (``set_bytes`` a set) exceed ``rotate`` bytes
    together (default: :func:`~flyreg._core.device_facts.rotate_bytes` of the current CUDA device);
    when each call needs its inputs prepared (restored, zeroed, a pre-hook), as many as fit, since
    each set then runs once a replay. At most :data:`MAX_SETS`,
    and never more copies than ``budget`` bytes hold, at ``copy_bytes`` a copy (the storages
    copied; default ``set_bytes``).
    """
    copy_bytes = set_bytes if copy_bytes is None else copy_bytes
    if set_bytes <= 0 or copy_bytes <= 0:
        return 1
    fit = 1 + budget // copy_bytes
    want = MAX_SETS if prepared else math.ceil((rotate_bytes() if rotate is None else rotate) / set_bytes)
    return max(1, min(want, fit, MAX_SETS))


def plan_sets(storage_bytes: Iterable[int], set_bytes: int, prepared: bool, budget: int,
              in_place_bytes: Iterable[int] = (), drawn: bool = False) -> tuple[int, int]:
    """(input sets to rotate through, bytes above which a storage is shared by them, not copied), for a call
    of these storages and :func:`set_count`'s ``set_bytes`` and ``prepared``: where the op draws its inputs
    by seed (``drawn``), at least :data:`DRAWS` sets as ``budget`` holds, a storage over a :data:`DRAWS`-th of
    it shared. An in-place storage over that size would be shared too: there is then one set, so each call is
    the only one between preparations."""
    share = budget // DRAWS if drawn else budget
    copied = sum(b for b in storage_bytes if b <= share)
    if any(b > share for b in in_place_bytes):
        return 1, share
    n = set_count(set_bytes, prepared, budget, copied)
    return (max(n, min(DRAWS, 1 + budget // max(copied, 1))) if drawn else n), share


def calls_per_replay(sets: int, call_ms: float, prepared: bool, scale: int = 1) -> int:
    """Calls in one replay: each set once when calls are prepared; else enough for ``scale`` times
    :data:`TARGET_MS` of device time, a multiple of ``sets`` (at most ``scale`` times
    :data:`MAX_CALLS`, at least ``sets``)."""
    if prepared:
        return sets
    most = MAX_CALLS * scale
    want = min(most, math.ceil(TARGET_MS * scale / call_ms)) if call_ms > 0 else most
    return max(sets, sets * math.ceil(want / sets))


def _out_bytes(value: Any) -> int:
    """Bytes of the storages a call's return value holds."""
    return sum(t.untyped_storage().nbytes() for t in _distinct_tensors(value))


def replay_ms(calls: list[Callable[[], Any]], count: int, warmup: int, rep: int,
              prepare: Callable[[], None] | None = None, out_bytes: int = 0) -> list[float]:
    """Milliseconds per call of ``count`` calls cycling through ``calls``, replayed as one CUDA graph.

    Each call's return value stays alive until :func:`~flyreg._core.device_facts.rotate_bytes` of
    later outputs were allocated (``out_bytes`` each), so outputs rotate like inputs. ``prepare()``,
    when given, runs before each timed replay, outside it, followed by a read of
    :func:`~flyreg._core.device_facts.flush_bytes`; otherwise replays run back to back. Raises
    :class:`CaptureError` when capture fails.
    """
    keep = max(1, math.ceil(rotate_bytes() / out_bytes)) if out_bytes > 0 else count

    def body() -> None:
        alive: deque[Any] = deque(maxlen=keep)
        for i in range(count):
            alive.append(calls[i % len(calls)]())

    graph = capture(body, prepare)
    clean = torch.empty(flush_bytes() // 4, dtype=torch.float32, device="cuda") if prepare is not None else None
    sink = torch.empty((), dtype=torch.float32, device="cuda") if clean is not None else None
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(warmup + rep)]
    for start, end in events:
        if prepare is not None:
            prepare()
            torch.sum(clean, 0, out=sink)
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / count for s, e in events[warmup:]]


#: Fewest calls of the replay :func:`per_call_ms` times (a whole number of rounds through the sets).
SIZING_CALLS = 16


def per_call_ms(call: Callable[[tuple[Any, ...], dict[str, Any]], Any], sets: list[InputSet]) -> float:
    """Median device milliseconds per call over three short replays (each set once, at least
    :data:`SIZING_CALLS` calls): what a replay is sized from. Events around one eager call time its
    launch as well (two to three times the kernel for a call of a few microseconds). Raises
    :class:`CaptureError` when capture fails."""
    calls = [lambda s=s: call(s.args, s.kwargs) for s in sets]
    return median_ms(calls, len(sets) * math.ceil(SIZING_CALLS / len(sets)), 3)


def replay_length(call: Callable[[tuple[Any, ...], dict[str, Any]], Any], sets: list[InputSet]) -> int:
    """Calls of an unprepared replay at scale 1 for calls like ``call`` (:func:`calls_per_replay` of
    its :func:`per_call_ms`)."""
    return calls_per_replay(len(sets), per_call_ms(call, sets), False)


def bench_steady(call: Callable[[tuple[Any, ...], dict[str, Any]], Any], sets: list[InputSet], warmup: int,
                 rep: int, prepare: Callable[[InputSet], None] | None = None, scale: int = 1,
                 count: int | None = None) -> BenchResult:
    """Steady-state time of ``call(args, kwargs)`` over ``sets`` (see the module docstring).

    ``scale`` multiplies the measured work: the calls of a replay (:func:`calls_per_replay`) or,
    when each set runs once a replay, the timed replays. ``count`` is the calls of an unprepared
    replay at scale 1 (then ``count * scale`` a replay): candidates that are compared should share
    it, since each replay's own overhead is spread over its calls. Without it, it is this call's
    :func:`replay_length`.

    ``prepare(set)`` readies one set for a call (restores or zeroes its in-place tensors, runs a
    pre-hook); with it, each set runs once a replay and every set is prepared before each replay.
    One call runs eagerly first; its errors (and those of the side-stream run before capture) are
    the config's; a capture failure raises :class:`CaptureError`.
    """
    if count is not None and count < 1:
        raise ValueError(f"count must be at least 1, got {count!r}")
    first = sets[0]
    if prepare is not None:
        prepare(first)
    out = call(first.args, first.kwargs)  # eager: its errors are the config's; its output sizes the rotation
    if prepare is not None:
        count = len(sets)
    else:
        count = (replay_length(call, sets) if count is None else count) * scale

    def prepare_all() -> None:
        for s in sets:
            prepare(s)  # type: ignore[misc]

    calls = [lambda s=s: call(s.args, s.kwargs) for s in sets]
    reps = rep * scale if prepare is not None else rep
    times = replay_ms(calls, count, warmup, reps, prepare_all if prepare is not None else None, _out_bytes(out))
    return BenchResult.of(times)


def median_ms(calls: list[Callable[[], Any]], count: int, rep: int) -> float:
    """Median steady-state milliseconds per call of ``count`` calls cycling through ``calls``
    (for benchmarks: the same replay a search times with)."""
    out = calls[0]()
    return statistics.median(replay_ms(calls, count, 1, rep, out_bytes=_out_bytes(out)))
