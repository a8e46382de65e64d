"""Candidates timed in a worker process: a crash or a hang is that candidate's failure, never the caller's.

:class:`WorkerEvaluator` starts one worker (``multiprocessing``, spawn: a fresh interpreter with
no inherited CUDA context) that builds its own timing function from a picklable factory, then
times one config at a time. A worker that dies (an illegal memory access, an abort) or runs past
the time limit fails that config with the reason and is replaced; the next config gets a fresh
worker. The limit adapts: a generous one while a worker starts (imports, inputs, first
compiles), then ``factor`` times the slowest config finished so far, at least ``min_seconds``.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import attrs

from flyreg._core.config import Config

#: ``factory(*args)`` runs in the worker and returns ``time(config) -> ms`` (raising for a bad config).
Factory = Callable[..., Callable[[Config], float]]


class IsolationError(RuntimeError):
    """The worker could not even set up (its factory raised): no config can be timed."""


@attrs.frozen
class Outcome:
    """One config's result in a worker: its time in ms, or why it failed."""

    config: Config
    ms: float | None
    error: str | None


def _serve(conn: Connection, factory: Factory, args: tuple[Any, ...]) -> None:
    try:
        time_config = factory(*args)
    except BaseException as e:  # reported to the parent, which stops
        conn.send(("setup", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while True:
        message = conn.recv()
        if message is None:
            return
        try:
            conn.send(("ok", float(time_config(Config.from_json(message)))))
        except Exception as e:  # a failing config is reported, the worker goes on
            conn.send(("failed", f"{type(e).__name__}: {e}"))


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class WorkerEvaluator:
    """Times configs one by one in a worker process built by ``factory(*args)``; use it as a context manager."""

    def __init__(self, factory: Factory, args: tuple[Any, ...] = (), *, start_seconds: float = 600.0,
                 min_seconds: float = 30.0, factor: float = 20.0) -> None:
        for name, value in (("start_seconds", start_seconds), ("min_seconds", min_seconds), ("factor", factor)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        self.factory, self.args = factory, args
        self.start_seconds, self.min_seconds, self.factor = start_seconds, min_seconds, factor
        self.outcomes: dict[Config, Outcome] = {}
        self.replaced = 0
        self._walls: list[float] = []
        self._proc: Any = None
        self._conn: Connection | None = None

    def __enter__(self) -> WorkerEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def limit(self) -> float:
        """Seconds the next config may take once its worker is up."""
        return max(self.min_seconds, self.factor * max(self._walls)) if self._walls else self.start_seconds

    def evaluate(self, configs: Sequence[Config]) -> dict[Config, float | None]:
        """Each config's time in ms, None for one that failed (see :attr:`outcomes` for why)."""
        out = {}
        for config in configs:
            outcome = self._one(config)
            self.outcomes[config] = outcome
            out[config] = outcome.ms
        return out

    def _start(self) -> Connection:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self.factory, self.args), daemon=True,
                                 name="flyreg-candidate-worker")
        self._proc.start()
        child.close()
        if not parent.poll(self.start_seconds):
            self._kill()
            raise IsolationError(f"the candidate worker did not start within {self.start_seconds:g} s")
        try:
            kind, detail = parent.recv()
        except (EOFError, OSError):
            code = self._kill()
            raise IsolationError(f"the candidate worker died while starting ({_death(code)})") from None
        if kind != "ready":
            self._kill()
            raise IsolationError(f"the candidate worker could not set up: {detail}")
        self._conn = parent
        return parent

    def _one(self, config: Config) -> Outcome:
        conn = self._conn if self._conn is not None else self._start()
        limit = self.limit()
        start = time.monotonic()
        conn.send(config.to_json())
        if not conn.poll(limit):
            self._kill()
            return Outcome(config, None, f"timed out after {limit:.3g} s (worker replaced)")
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):
            code = self._kill()
            return Outcome(config, None, f"the worker died ({_death(code)}); worker replaced")
        if kind == "ok":
            self._walls.append(time.monotonic() - start)
            return Outcome(config, value, None)
        return Outcome(config, None, str(value))

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
        return proc.exitcode

    def close(self) -> None:
        """Stop the worker (politely, then by force)."""
        if self._conn is not None and self._proc is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._proc.join(10)
        if self._proc is not None:
            self._kill()
            self.replaced -= 1  # a stop, not a replacement
        self._conn = None

