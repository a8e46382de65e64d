"""Keys missed during CUDA-graph capture, kept to be tuned after it (:func:`tune_pending`).

A call key first met while a CUDA graph is being captured is never searched (a search benchmarks
and synchronizes): it gets what lookup gives, the default at worst. When that is not a config tuned
for its spec on this device and toolchain (the default, an artifact fallback; under
``FLYREG_AUTOTUNE=1`` anything, under ``emit=True`` anything but its own current artifact), the
key is *pending*: kept here, in this process, and its resolution's source is ``capture:<source>``
(``capture:default``, ...), which the serving record keeps. After capture, :func:`tune_pending` searches each
pending key and serves its winner from then on, so the next capture gets the tuned config.

The search needs the call's inputs: an op with a ``make_inputs`` hook makes them for the key's
spec; a plain :class:`~flyreg.Autotuner` is tuned on the captured call's own arguments, kept (by
reference) until it is tuned, as they are when :func:`tune_pending` runs.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import attrs

from flyreg._core.fileio import warn_once
from flyreg._core.keys import DeviceIdentity
from flyreg._core.results import Resolution, TuneError, TuneReport
from flyreg._core.spec import spec_key

#: Most keys kept pending at once; past it the oldest is dropped, with one warning.
MAX_PENDING = 1024
#: The prefix the serving record gives the source of a key missed during capture.
CAPTURE = "capture:"


@attrs.frozen
class PendingKey:
    """A key missed during capture: its op, spec and device, and the source that served it (``default``, ...)."""

    op: str
    spec: dict[str, Any]
    device: DeviceIdentity
    served_by: str


@attrs.define(eq=False)
class _Entry:
    key: PendingKey
    tuner: weakref.ref[Any]
    pkey: str
    device: Any
    call: tuple[tuple[Any, ...], dict[str, Any]] | None  # the captured call's arguments, without make_inputs


_lock = threading.RLock()  # reentrant: a tuner's weakref callback may run inside a locked section
_entries: dict[tuple[int, str], _Entry] = {}  # (id(tuner), scratch-cache key) -> entry


def missed(res: Resolution, forced: bool, emit: bool) -> bool:
    """True when ``res``, found during capture, is not what the call would have got outside it: a config
    tuned for its spec here (a scratch-cache entry or the exact current artifact; under ``emit`` only
    that artifact, under ``forced`` nothing)."""
    if forced:
        return True
    return res.source != "offline" if emit else res.source not in ("cache", "offline")


def note(tuner: Any, spec: dict[str, Any], ident: DeviceIdentity, pkey: str, device: Any, served_by: str,
         args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Keep the key ``pkey`` of ``tuner`` pending (once); the arguments only when the tuner cannot make inputs."""
    key = (id(tuner), pkey)
    call = None if getattr(tuner, "make_inputs", None) is not None else (args, kwargs)
    with _lock:
        if key in _entries:
            return
        if len(_entries) >= MAX_PENDING:
            _entries.pop(next(iter(_entries)))
            warn_once(f"flyreg: more than {MAX_PENDING} keys were missed during CUDA-graph capture; the oldest "
                      f"are no longer kept for flyreg.tune_pending()", key="pending-full")
        ref = weakref.ref(tuner, lambda _r, k=key: _forget(k))
        _entries[key] = _Entry(PendingKey(tuner.name, dict(spec), ident, served_by), ref, pkey, device, call)


def _forget(key: tuple[int, str]) -> None:
    with _lock:
        _entries.pop(key, None)


def pending() -> list[PendingKey]:
    """The keys missed during CUDA-graph capture in this process and not tuned yet, oldest first."""
    with _lock:
        return [e.key for e in _entries.values() if e.tuner() is not None]


def tune_pending(*, emit: bool = False, out_dir: Any = None,
                 on_error: Callable[[PendingKey, Exception], None] | None = None) -> list[TuneReport]:
    """Search every key missed during CUDA-graph capture (:func:`pending`), outside capture, and serve each
    winner from then on: the next call of that key, in a new capture too, launches the tuned config.

    Each winner goes to the scratch cache (the next process gets it) and, with ``emit``, into an
    artifact (in ``out_dir``, default the first ``FLYREG_CONFIG_DIR`` entry). Returns the search
    reports, oldest key first. A key whose search fails stays pending; its error is passed to
    ``on_error(key, error)``, else raised after the other keys are tuned. Raises
    :class:`~flyreg.GraphCaptureError` when called during capture.
    """
    with _lock:
        todo = list(_entries.items())
    reports: list[TuneReport] = []
    errors: list[Exception] = []
    for key, entry in todo:
        tuner = entry.tuner()
        if tuner is None:
            continue
        try:
            reports.append(_tune(tuner, entry, emit, out_dir))
        except Exception as e:  # noqa: BLE001 - one key's failure never stops the others
            if on_error is None:
                errors.append(e)
            else:
                on_error(entry.key, e)
            continue
        with _lock:
            _entries.pop(key, None)
    if errors:
        raise errors[0]
    return reports


def _tune(tuner: Any, entry: _Entry, emit: bool, out_dir: Any) -> TuneReport:
    """Search the key of ``entry`` on inputs made for its spec (or the captured call's) and bind its winner."""
    if entry.call is not None:
        args, kwargs = entry.call
    else:
        args, kwargs = tuner.make_inputs(dict(entry.key.spec), str(entry.device))
    report: TuneReport = tuner.tune(*args, emit=emit, out_dir=out_dir, **kwargs)
    if spec_key(report.spec) != spec_key(entry.key.spec):
        raise TuneError(f"{tuner.name}: the inputs made for spec {entry.key.spec} have spec {report.spec}; "
                        f"its key stays pending")
    res = Resolution(report.winner, "search", report.spec, "search", path=report.artifact)
    tuner.memory.record(entry.pkey, entry.key.spec, entry.key.device, res)  # the captured key's own layout too
    return report
