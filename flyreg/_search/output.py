"""A candidate's output: captured, never the command's, its tail kept with a failure.

A worker's standard output and error (its file descriptors 1 and 2, so C code and child processes
too) go into a pipe that a thread reads to its end (:class:`OutputTail`), keeping only the last
:data:`TAIL_BYTES`: a candidate that writes 100 MB blocks on nothing and costs no memory. A failed
config's reason ends with what it wrote (:meth:`OutputTail.with_tail`). A search in this process
sends its output into one the same way while a candidate runs (:func:`captured`); a display that
must go on meanwhile writes to :func:`uncaptured`'s stream.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

#: How much of a candidate's output a failure keeps (its end).
TAIL_BYTES = 4096

_whole_process = False  # this process's output goes into a tail for good (a worker's): captured() adds none
_capturing = threading.Lock()  # held while captured() redirects this process's output
_shown: set[tuple[Any, ...]] = set()  # the warnings raised inside captured() already shown


class OutputTail:
    """The last :data:`TAIL_BYTES` bytes written into the pipe whose read end is ``read_fd`` (owned from now on),
    and how many were written in all (:attr:`total`)."""

    def __init__(self, read_fd: int, limit: int = TAIL_BYTES) -> None:
        self.limit = limit
        self.total = 0
        self._fd = read_fd
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._closed = threading.Event()
        threading.Thread(target=self._drain, name="flyreg-output-tail", daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 65536)
            except OSError:
                data = b""
            if not data:
                break
            with self._lock:
                self.total += len(data)
                self._tail += data
                del self._tail[:-self.limit]
                self._last = time.monotonic()
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._closed.set()

    def since(self, mark: int, settle_s: float = 0.05, limit_s: float = 1.0) -> str:
        """What was written after ``mark`` (an earlier :attr:`total`), at most its last :data:`TAIL_BYTES`, once the
        writers paused for ``settle_s`` or closed the pipe (waiting at most ``limit_s``)."""
        deadline = time.monotonic() + limit_s
        self._closed.wait(settle_s)  # what was written right before the failure was reported may be unread yet
        while not self._closed.is_set() and time.monotonic() < deadline and time.monotonic() - self._last < settle_s:
            time.sleep(settle_s / 2)
        with self._lock:
            n = min(self.total - mark, len(self._tail))
            data = bytes(self._tail[len(self._tail) - n:]) if n > 0 else b""
        return data.decode("utf-8", "replace").strip()

    def with_tail(self, why: str, mark: int) -> str:
        """``why`` (a failure's reason) followed by the end of what was written after ``mark``, if anything."""
        tail = self.since(mark)
        if not tail:
            return why
        cut = "the end of " if self.total - mark > self.limit else ""  # more was written than is kept
        return f"{why}; {cut}its output: {tail}"


def with_output(why: str, output: OutputTail | None) -> str:
    """``why`` followed by the end of what was written into ``output`` (a :func:`captured` block's), if anything."""
    return output.with_tail(why, 0) if output is not None else why


def capture(fd: int) -> None:
    """Send this process's standard output and error (descriptors 1 and 2, and ``sys.stdout``/``sys.stderr``,
    line-buffered) into ``fd``, for good."""
    global _whole_process
    _whole_process = True
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def capture_here() -> OutputTail:
    """Send this process's output into a pipe read by an :class:`OutputTail` of this process (a pool worker's)."""
    read_fd, write_fd = os.pipe()
    capture(write_fd)
    os.close(write_fd)
    return OutputTail(read_fd)


@contextlib.contextmanager
def captured() -> Iterator[OutputTail | None]:
    """While the block runs, this process's output (descriptors 1 and 2, so C code's too, and ``sys.stdout`` /
    ``sys.stderr``) goes into a fresh :class:`OutputTail`; it is put back however the block ends (an exception,
    ``KeyboardInterrupt``, ``SystemExit``). A Python warning raised in the block is shown once, after it.

    Yields None, redirecting nothing, where the output already goes into a tail (a worker's), another thread's
    block captures it now, or descriptor 1 or 2 is not open.
    """
    if _whole_process or not _capturing.acquire(blocking=False):
        yield None
        return
    try:
        with _redirected() as output:
            yield output
    finally:
        _capturing.release()


@contextlib.contextmanager
def _redirected() -> Iterator[OutputTail | None]:
    streams = sys.stdout, sys.stderr
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.flush()
    fds: list[int] = []
    try:
        fds.append(os.dup(1))
        fds.append(os.dup(2))
        fds += os.pipe()
    except OSError:  # a descriptor is closed, or none is left: the output stays where it goes
        for fd in fds:
            os.close(fd)
        yield None
        return
    saved, (read_fd, write_fd) = fds[:2], fds[2:]
    output = OutputTail(read_fd)
    redirected = None
    raised: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as raised:
            try:
                os.dup2(write_fd, 1)
                os.dup2(write_fd, 2)
                os.close(write_fd)
                write_fd = -1
                redirected = open(1, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
                sys.stdout = sys.stderr = redirected
                yield output
            finally:
                if redirected is not None:
                    with contextlib.suppress(Exception):
                        redirected.close()  # flushed; descriptor 1 stays open
                sys.stdout, sys.stderr = streams
                os.dup2(saved[0], 1)  # the pipe's last write end here: its reader sees the end
                os.dup2(saved[1], 2)
                if write_fd >= 0:
                    os.close(write_fd)
    finally:
        os.close(saved[0])
        os.close(saved[1])
        _show_once(raised)


def _show_once(raised: list[warnings.WarningMessage]) -> None:
    for w in raised:
        key = (w.category, str(w.message), w.filename, w.lineno)
        if key not in _shown:
            _shown.add(key)
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


@contextlib.contextmanager
def uncaptured(stream: TextIO) -> Iterator[TextIO]:
    """``stream``, or where it writes into descriptor 1 or 2, a stream on a copy of that descriptor taken now:
    what is written to it reaches where ``stream`` goes even while :func:`captured` redirects the descriptor."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = -1
    if fd not in (1, 2):
        yield stream
        return
    with contextlib.suppress(Exception):
        stream.flush()
    copy = open(os.dup(fd), "w", encoding=getattr(stream, "encoding", None) or "utf-8", errors="replace",
                buffering=1)
    try:
        yield copy
    finally:
        with contextlib.suppress(Exception):
            copy.close()
