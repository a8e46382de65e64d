"""Candidates timed in a worker process: a crash or a hang is that candidate's failure, never the caller's.

:class:`WorkerEvaluator` starts one worker (``multiprocessing``, spawn: a fresh interpreter with no
inherited CUDA context) that builds its own measuring function from a picklable factory, then
measures one config at a time. A worker that dies (an abort), is left unusable (an illegal memory
access poisons its CUDA context: :class:`WorkerUnusable`) or runs past the time limit fails that
config with the reason and is replaced; the next config gets a fresh worker. The limit adapts
(:class:`AdaptiveLimit`): a generous one while a worker starts (imports, inputs, first compiles),
then ``factor`` times the slowest config finished so far, at least ``min_seconds``. Workers ignore
SIGINT (Ctrl-C stops the caller, which stops them) and end when the caller dies, even by ``kill -9``
(:func:`worker_setup`). Each worker leads a process group of its own: when it is replaced or
stopped, every process its candidates started in it ends with it. A candidate's output never
reaches the caller's: it is captured, and the end of it is kept with a failure
(:mod:`flyreg._search.output`). A candidate that calls ``sys.exit()`` fails alone.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import attrs

from flyreg._core.config import Config
from flyreg._core.processes import kill_group, lead_group
from flyreg._search.output import OutputTail, capture

#: ``factory(*args)`` runs in the worker and returns ``measure(config, **options)`` (raising for a bad
#: config, :class:`WorkerUnusable` when the worker can measure nothing more); whatever it returns must
#: pickle. An ``info`` attribute of ``measure``, if any, is sent to the caller once the worker is ready
#: (:meth:`WorkerEvaluator.start`).
Factory = Callable[..., Callable[..., Any]]


class IsolationError(RuntimeError):
    """The worker could not even set up (its factory raised): no config can be timed."""


class WorkerUnusable(Exception):
    """Raised by ``measure`` when its config left the worker able to measure nothing more (a CUDA error
    poisons the process's context): that config fails with this message and the worker is replaced."""


@attrs.frozen
class Outcome:
    """One config's result in a worker: what ``measure`` returned, or why it failed."""

    config: Config
    value: Any
    error: str | None


@attrs.define
class AdaptiveLimit:
    """Seconds a task may take: ``start_seconds`` until one finished, then ``factor`` times the slowest
    finished so far, at least ``min_seconds``."""

    start_seconds: float = 600.0
    min_seconds: float = 30.0
    factor: float = 20.0
    slowest: float | None = None

    def __attrs_post_init__(self) -> None:
        for name in ("start_seconds", "min_seconds", "factor"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")

    def seconds(self) -> float:
        return self.start_seconds if self.slowest is None else max(self.min_seconds, self.factor * self.slowest)

    def add(self, seconds: float) -> None:
        """One task finished in ``seconds``."""
        self.slowest = seconds if self.slowest is None else max(self.slowest, seconds)


def worker_setup(poll_seconds: float = 1.0) -> None:
    """In a worker process: lead a process group of its own, ignore Ctrl-C (the caller handles it and stops
    its workers, so an interrupted config is never a failed one), and end at once, with its group,
    when the caller is gone (a hung candidate would otherwise outlive it)."""
    lead_group()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        kill_group(os.getpgrp())
        os._exit(1)

    threading.Thread(target=watch, name="flyreg-parent-watch", daemon=True).start()


def _serve(conn: Connection, factory: Factory, args: tuple[Any, ...], output: Connection | None = None) -> None:
    worker_setup()
    if output is not None:
        capture(output.fileno())
        output.close()
    try:
        measure = factory(*args)
    except BaseException as e:  # reported to the parent, which stops
        conn.send(("setup", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", getattr(measure, "info", None)))
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the caller closed its end: it stopped, or is gone
            return
        if message is None:
            return
        config, options = message
        try:
            conn.send(("ok", measure(Config.from_json(config), **options)))
        except WorkerUnusable as e:
            conn.send(("unusable", str(e)))
            return
        except SystemExit as e:  # the candidate's own sys.exit(): its failure, never the worker's end
            conn.send(("failed", f"the candidate called sys.exit({e.code!r})"))
        except Exception as e:  # a failing config is reported, the worker goes on
            conn.send(("failed", f"{type(e).__name__}: {e}"))


def _with_output(value: Any, output: OutputTail | None, mark: int) -> Any:
    """A measurement that failed inside the worker (``error`` set) with the end of what its config wrote."""
    error = getattr(value, "error", None)
    if output is None or not isinstance(error, str) or not attrs.has(type(value)):
        return value
    return attrs.evolve(value, error=output.with_tail(error, mark))


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class WorkerEvaluator:
    """Measures configs one by one in a worker process built by ``factory(*args)``; use it as a context manager."""

    def __init__(self, factory: Factory, args: tuple[Any, ...] = (), *, start_seconds: float = 600.0,
                 min_seconds: float = 30.0, factor: float = 20.0) -> None:
        self.factory, self.args = factory, args
        self.limits = AdaptiveLimit(start_seconds, min_seconds, factor)
        self.outcomes: dict[Config, Outcome] = {}
        self.replaced = 0
        self.info: Any = None
        self._proc: Any = None
        self._conn: Connection | None = None
        self._output: OutputTail | None = None

    def __enter__(self) -> WorkerEvaluator:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(force=exc_type is not None)

    def limit(self) -> float:
        """Seconds the next config may take once its worker is up."""
        return self.limits.seconds()

    def evaluate(self, configs: Sequence[Config]) -> dict[Config, Any]:
        """Each config's measurement, None for one that failed (see :attr:`outcomes` for why)."""
        out = {}
        for config in configs:
            outcome = self.measure(config)
            out[config] = outcome.value
        return out

    def start(self) -> Any:
        """Start the worker unless it runs; returns its ``info``. :class:`IsolationError` when it cannot set up."""
        if self._conn is None:
            self._start()
        return self.info

    def measure(self, config: Config, **options: Any) -> Outcome:
        """``measure(config, **options)`` in the worker, within the time limit; recorded in :attr:`outcomes`."""
        outcome = self._one(config, options)
        self.outcomes[config] = outcome
        return outcome

    def _start(self) -> Connection:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        read_fd, write_fd = os.pipe()
        output = Connection(write_fd, readable=False)  # the worker's stdout and stderr (sent as a descriptor)
        self._proc = ctx.Process(target=_serve, args=(child, self.factory, self.args, output), daemon=True,
                                 name="flyreg-candidate-worker")
        try:
            self._proc.start()
        finally:
            output.close()
        self._output = OutputTail(read_fd)
        child.close()
        try:
            kind, detail = self._first_message(parent)
        except IsolationError:
            parent.close()
            raise
        if kind != "ready":
            parent.close()
            self._kill()
            raise IsolationError(f"the candidate worker could not set up: {detail}")
        self._conn, self.info = parent, detail
        return parent

    def _first_message(self, parent: Connection) -> tuple[str, Any]:
        start = self.limits.start_seconds
        if not parent.poll(start):
            self._kill()
            raise IsolationError(f"the candidate worker did not start within {start:g} s")
        try:
            return parent.recv()
        except (EOFError, OSError):
            code = self._kill()
            raise IsolationError(f"the candidate worker died while starting ({_death(code)})") from None

    def _one(self, config: Config, options: dict[str, Any]) -> Outcome:
        conn = self._conn if self._conn is not None else self._start()
        output = self._output
        mark = output.total if output is not None else 0

        def failed(why: str) -> Outcome:
            return Outcome(config, None, output.with_tail(why, mark) if output is not None else why)

        limit = self.limit()
        start = time.monotonic()
        conn.send((config.to_json(), options))
        if not conn.poll(limit):
            self._kill()
            return failed(f"timed out after {limit:.3g} s (worker replaced)")
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):
            code = self._kill()
            return failed(f"the worker died ({_death(code)}); worker replaced")
        if kind == "ok":
            self.limits.add(time.monotonic() - start)
            value = _with_output(value, output, mark)
            return Outcome(config, value, None)
        if kind == "unusable":
            self._kill()
            return failed(f"{value}; worker replaced")
        return failed(str(value))

    def _kill(self) -> int | None:
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if proc is None:
            return None
        self.replaced += 1
        if proc.is_alive():
            proc.kill()
        proc.join(30)
        kill_group(proc.pid)  # what its candidates started in it
        return proc.exitcode

    def close(self, force: bool = False) -> None:
        """Stop the worker: politely, then by force (at once with ``force``: it may be busy)."""
        if self._conn is not None and self._proc is not None and not force:
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._proc.join(10)
            kill_group(self._proc.pid)
        if self._proc is not None:
            self._kill()
            self.replaced -= 1  # a stop, not a replacement
        self._conn = None
