"""Recording what serving uses: the first resolution of each call key in the process, and the calls it served.

Recording is on while ``FLYREG_RECORD`` names a file (from the first tuner made, or the first key
resolved, after it is set, until the process exits) or inside :func:`record`. The steady-state
call does no I/O: while recording, every tuner's class is swapped for a subclass whose
``__call__`` is the plain one plus a counter per call signature (one attribute increment);
with recording off the plain ``__call__`` runs, unchanged. The counts are added to the file
(:mod:`flyreg._runtime.serving_record_file`: safe under concurrent processes) by a background thread
every ``FLYREG_RECORD_INTERVAL`` seconds while recording, when a ``with`` block ends, and under
``FLYREG_RECORD`` also at exit and on SIGTERM (the handler the application had installed then
runs, or the default action: the process ends). A SIGKILL loses at most the last interval's
counts. A forked child counts only its own calls. A path the record file refuses (anything but a
record, an empty regular file, or nothing) turns recording off with one warning.

Calls replayed from a CUDA graph run no Python: they are counted once, when captured.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from flyreg._core import settings
from flyreg._core.fileio import warn_once
from flyreg._core.results import CallKey, Resolution
from flyreg._runtime import serving_record_file
from flyreg._runtime.serving_record_file import Served

#: Most call signatures a recording tuner keeps counters for (as many as it keeps bound launchers);
#: past it the oldest counter's calls are folded into its entry.
MAX_COUNTED = 4096


class Counter:
    """The launch of one call signature while recording, and how many calls it served."""

    __slots__ = ("call", "calls", "entry")

    def __init__(self, call: Any, entry: Entry) -> None:
        self.call = call
        self.calls = 0
        self.entry = entry


@attrs.define(eq=False)
class Entry:
    """The first resolution of one call key (and the calls it served): a row of the record."""

    op: str
    spec: dict[str, Any]
    ident: Any
    res: Resolution
    first_seen: float
    counters: list[Counter] = attrs.Factory(list)
    retired: int = 0  # calls of counters no longer kept, and calls served before counting began
    flushed: int = 0  # calls already added to the file

    def calls(self) -> int:
        return self.retired + sum(c.calls for c in self.counters)

    def retire(self, counter: Counter) -> None:
        self.retired += counter.calls
        self.counters.remove(counter)


class Recorder:
    """The recording of this process: where it goes, who holds it on, and its entries."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.path: Path | None = None
        self.by_env = False  # FLYREG_RECORD turned it on: it stays on until exit
        self.holders = 0  # open record() blocks
        self.entries: dict[tuple[Any, ...], Entry] = {}
        self.tuners: weakref.WeakSet[Any] = weakref.WeakSet()
        self.refused: Path | None = None  # the FLYREG_RECORD path refused (warned once)
        self.flushing: int | None = None  # the thread flushing now
        self.stop = threading.Event()  # set when the recording stops: ends the periodic flusher

    @property
    def active(self) -> bool:
        return self.path is not None

    def start(self, path: Path, by_env: bool) -> None:
        with self.lock:
            if self.path is not None and self.path != path:
                raise RuntimeError(f"flyreg is already recording into {self.path}; one record at a time")
            if by_env and not self.by_env:
                atexit.register(flush_quietly)
                _chain_sigterm()
            self.by_env = self.by_env or by_env
            self.holders += 0 if by_env else 1
            if self.path is None:
                self.path = path
                for tuner in list(self.tuners):
                    _count_calls(tuner, True)
                self.start_flusher()

    def start_flusher(self) -> None:
        """Flush every ``FLYREG_RECORD_INTERVAL`` seconds in a daemon thread until the recording stops."""
        self.stop = stop = threading.Event()

        def flush_periodically() -> None:
            while not stop.wait(settings.current().record_interval):
                flush_quietly()

        threading.Thread(target=flush_periodically, name="flyreg-record-flush", daemon=True).start()

    def release(self) -> None:
        """One :func:`record` block ended: flush, and stop when nothing else holds the recording on."""
        with self.lock:
            self.holders -= 1
            try:
                self.flush()
            finally:
                if not self.holders and not self.by_env:
                    for tuner in list(self.tuners):
                        _count_calls(tuner, False)
                    self.path = None
                    self.entries.clear()
                    self.stop.set()

    def note(self, op: str, ck: CallKey, res: Resolution) -> Entry:
        """The entry of the call key ``ck`` resolved to ``res``: a new one at its first resolution; a
        memory hit of the same config joins the entry of the resolution it remembers."""
        key = (op, ck.pkey, res.origin, res.nearest, res.path, res.config)
        with self.lock:
            entry = self.entries.get(key)
            if entry is None:
                entry = self.entries[key] = Entry(op, ck.spec, ck.ident, res, time.time())
            return entry

    def flush(self) -> None:
        """Add the calls counted since the last flush to the file (a flush that this thread interrupted,
        from a signal handler, is left to finish alone: nothing is added twice)."""
        with self.lock:
            if self.path is None or self.flushing == threading.get_ident():
                return
            self.flushing = threading.get_ident()
            try:
                now = time.time()
                pending = [(e, e.calls()) for e in self.entries.values()]
                served = [Served(e.op, e.spec, e.ident, e.res.source, e.res.origin, e.res.nearest, e.res.path,
                                 e.res.config.to_json(), total - e.flushed, e.first_seen, now)
                          for e, total in pending if total > e.flushed]
                serving_record_file.add(self.path, served)
                for e, total in pending:
                    e.flushed = total
            finally:
                self.flushing = None

    def forked(self) -> None:
        """In a forked child: the calls counted so far are the parent's to record; its own are flushed
        periodically, as the parent's were."""
        self.lock = threading.RLock()
        self.flushing = None
        for e in self.entries.values():
            e.flushed = e.calls()
        if self.path is not None:
            self.start_flusher()


RECORDER = Recorder()
os.register_at_fork(after_in_child=RECORDER.forked)


def flush_quietly() -> None:
    """Flush at exit; a failure warns (the process is ending: nothing to raise to)."""
    try:
        RECORDER.flush()
    except Exception as e:  # an unwritable file, a full disk: the process still exits cleanly
        warn_once(f"flyreg: could not write the serving record {RECORDER.path}: {type(e).__name__}: {e}")


_previous_sigterm: Any = None


def _chain_sigterm() -> None:
    """Flush on SIGTERM, then do what the handler installed before did (the default: end the process).
    Only the main thread can install a handler, and one not installed from Python is left alone."""
    global _previous_sigterm
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is None or previous is _on_sigterm:
        return
    _previous_sigterm = previous
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: Any) -> None:
    flush_quietly()
    previous = _previous_sigterm
    if previous == signal.SIG_IGN:
        return
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)  # the default action, with the exit status it gives
    os.kill(os.getpid(), signum)


def _start_from_env() -> bool:
    """Turn recording on when ``FLYREG_RECORD`` names a file it may write; True when it is on."""
    path = settings.current().record
    if path is not None and not RECORDER.active and path.absolute() != RECORDER.refused:
        where = path.absolute()
        why = serving_record_file.refusal(where)
        if why is not None:
            RECORDER.refused = where
            warn_once(f"flyreg: FLYREG_RECORD refused, recording nothing: {why}; flyreg records only into "
                      "a serving record it made, an empty file or a new path", key=f"record-refused:{where}")
            return False
        try:
            RECORDER.start(where, by_env=True)  # counts every tracked tuner
        except RuntimeError as e:  # a record() block holds another file: that one goes on
            warn_once(f"flyreg: FLYREG_RECORD={path} ignored: {e}", key="record-env-busy")
    return RECORDER.active


def track(tuner: Any) -> None:
    """A new tuner: counted from its first call when recording is on (``FLYREG_RECORD`` turns it on)."""
    RECORDER.tuners.add(tuner)
    if _start_from_env():
        _count_calls(tuner, True)


def first_call(tuner: Any, ck: CallKey, res: Resolution) -> None:
    """A key resolved on the plain call path: when recording is (or ``FLYREG_RECORD`` now turns it) on,
    note it with this one call; the tuner's later calls are counted."""
    if _start_from_env():
        _count_calls(tuner, True)
        entry = RECORDER.note(tuner.name, ck, res)
        with RECORDER.lock:
            entry.retired += 1


def _counter(tuner: Any, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Counter:
    """The counter of a call signature seen first now, kept under ``key``; a ``key`` of None (an unhashable
    call, resolved on every call) gets its call added to its entry at once and a counter kept nowhere."""
    launcher, ck, res = tuner._serve(args, kwargs)
    entry = RECORDER.note(tuner.name, ck, res)
    counter = Counter(launcher.call, entry)
    with RECORDER.lock:
        if key is None:
            entry.retired += 1
            return counter
        entry.counters.append(counter)
        counted = tuner._counted
        if len(counted) >= MAX_COUNTED:
            old = counted.pop(next(iter(counted)))
            old.entry.retire(old)
        counted[key] = counter
    return counter


def _counting_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``Autotuner.__call__`` while recording: the counter of the call's signature instead of its launcher."""
    key = self._fast_key(args, kwargs)
    try:
        counter = self._counted.get(key)
    except TypeError:  # unhashable even structurally: resolved on every call, as without recording
        counter = _counter(self, None, args, kwargs)
    else:
        if counter is None:
            counter = _counter(self, key, args, kwargs)
    counter.calls += 1
    return counter.call(args, kwargs)


_COUNTING_OF: dict[type, type] = {}  # a tuner class -> its counting subclass
_PLAIN_OF: dict[type, type] = {}  # a counting subclass -> its tuner class


def _count_calls(tuner: Any, on: bool) -> None:
    """Swap ``tuner``'s class for its counting subclass (``on``) or back; its counters start afresh."""
    cls = type(tuner)
    if on and cls not in _PLAIN_OF:
        sub = _COUNTING_OF.get(cls)
        if sub is None:
            sub = type(cls.__name__, (cls,), {"__call__": _counting_call, "__module__": cls.__module__,
                                              "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
            _COUNTING_OF[cls], _PLAIN_OF[sub] = sub, cls
        tuner._counted = {}
        tuner.__class__ = sub
    elif not on and cls in _PLAIN_OF:
        tuner.__class__ = _PLAIN_OF[cls]
        tuner._counted = {}


@contextlib.contextmanager
def record(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Record, inside the block, what serves each call of every op: the first resolution of each call key
    (op, spec, device, source) and how many calls it served, added to the SQLite file ``path`` when
    the block ends (created if absent; other processes may add to it at once). Yields the file.

    The steady-state call stays free of I/O: counts are kept in memory, and added to the file every
    ``FLYREG_RECORD_INTERVAL`` seconds and when the block ends. Under ``FLYREG_RECORD`` naming the
    same file the block just flushes at its end; another file is a RuntimeError (one record at a
    time). A path that holds anything but a record or an empty regular file is a ValueError.
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"record() takes the record's file path (a str or os.PathLike), got {path!r}")
    where = settings.expand_path(os.fspath(path)).absolute()
    why = serving_record_file.refusal(where)
    if why is not None:
        raise ValueError(f"record() refuses {why}; it records only into a serving record, an empty file or "
                         "a new path")
    RECORDER.start(where, by_env=False)
    try:
        yield where
    finally:
        RECORDER.release()
