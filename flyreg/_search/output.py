"""A candidate's output in a worker process: captured, never the command's, its tail kept with a failure.

A worker's standard output and error (its file descriptors 1 and 2, so C code and child processes
too) go into a pipe that a thread reads to its end (:class:`OutputTail`), keeping only the last
:data:`TAIL_BYTES`: a candidate that writes 100 MB blocks on nothing and costs no memory. A failed
config's reason ends with what it wrote (:meth:`OutputTail.with_tail`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

#: How much of a candidate's output a failure keeps (its end).
TAIL_BYTES = 4096


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
        time.sleep(settle_s)  # what was written right before the failure was reported may be unread yet
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
        cut = "the end of " if self.total - mark > len(tail.encode()) else ""
        return f"{why}; {cut}its output: {tail}"


def capture(fd: int) -> None:
    """Send this process's standard output and error (descriptors 1 and 2, and ``sys.stdout``/``sys.stderr``,
    line-buffered) into ``fd``."""
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
