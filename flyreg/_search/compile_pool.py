"""Candidates compiled ahead of their timing in a pool of worker processes.

A ``concurrent.futures.ProcessPoolExecutor`` (spawn: no inherited CUDA context) runs a compile
task per config; for a Triton op that fills Triton's on-disk cache, so the benchmarking worker's
own build of the config is a cache hit. A batch's compiles all finish before any of it is timed,
so compiling never overlaps a measurement. A compile that raises is that config's failure, with
the reason. A compile that crashes its process, or a pool that makes no progress within the time
limit (:class:`~flyreg._search.worker.AdaptiveLimit` over the compile times), loses the compiles
still open: the pool is replaced, and those configs go to the benchmarking worker uncompiled,
which builds them itself and finds the one that crashes or hangs. Each pool process leads a
process group of its own, ended with the pool (what a build started in it ends too); its output is
captured, and the end of what a failed compile wrote is kept with its reason
(:mod:`flyreg._search.output`); a build that calls ``sys.exit()`` fails that config alone.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from flyreg._core.config import Config, JSONScalar
from flyreg._core.processes import kill_group
from flyreg._search.output import OutputTail, capture_here
from flyreg._search.worker import AdaptiveLimit, worker_setup

#: ``task(*args, config_json)`` compiles one config in a pool process; returns why it failed, or None.
CompileTask = Callable[..., "str | None"]


#: In a pool process: its captured output (:func:`_pool_setup`).
_output: OutputTail | None = None


def _pool_setup() -> None:
    global _output
    worker_setup()
    _output = capture_here()


def _timed(task: CompileTask, args: tuple[Any, ...], config: dict[str, JSONScalar]) -> tuple[float, str | None]:
    start = time.monotonic()
    mark = _output.total if _output is not None else 0
    try:
        error = task(*args, config)
    except SystemExit as e:  # the build's own sys.exit(): that config's failure, never the pool process's end
        error = f"the candidate called sys.exit({e.code!r})"
    if error is not None and _output is not None:
        error = _output.with_tail(error, mark)
    return time.monotonic() - start, error


class CompilePool:
    """``compile(task, args, configs) -> {config: why it failed}``; the pool starts on first use and is
    kept for later searches. Use it as a context manager."""

    def __init__(self, workers: int, limit: AdaptiveLimit | None = None) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self.workers = workers
        self.limit = limit if limit is not None else AdaptiveLimit()
        self.replaced = 0
        self._pool: ProcessPoolExecutor | None = None
        self._started = False  # a compile finished in this pool: its processes are up

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(force=exc_type is not None)

    def compile(self, task: CompileTask, args: tuple[Any, ...], configs: Sequence[Config]) -> dict[Config, str]:
        """Compile ``configs``; returns the reason of each config whose compile raised."""
        if not configs:
            return {}
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_pool_setup)
            self._started = False
        futures: dict[Future[tuple[float, str | None]], Config] = {
            self._pool.submit(_timed, task, args, c.to_json()): c for c in configs}
        failed: dict[Config, str] = {}
        pending = set(futures)
        lost = False
        while pending:
            limit = self.limit.seconds() if self._started else self.limit.start_seconds  # imports first
            done, pending = wait(pending, timeout=limit, return_when=FIRST_COMPLETED)
            if not done:  # no compile finished within the limit: one hangs
                lost = True
                break
            for future in done:
                try:
                    seconds, error = future.result()
                except BrokenProcessPool:  # a compile crashed its process: the open compiles are lost
                    lost = True
                    continue
                except Exception as e:  # the task itself failed (its result did not pickle, say)
                    failed[futures[future]] = f"{type(e).__name__}: {e}"
                    continue
                self.limit.add(seconds)
                self._started = True
                if error is not None:
                    failed[futures[future]] = error
        if lost:
            self.replaced += 1
            self.close(force=True)  # the next batch starts a new pool
        return failed

    def close(self, force: bool = False) -> None:
        """Stop the pool: once its compiles finish, or with ``force`` at once (a hung compile never returns)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        leaders = list((getattr(pool, "_processes", None) or {}).keys())  # each leads its process group
        try:
            self._stop(pool, force)
        finally:
            for pid in leaders:
                kill_group(pid)

    @staticmethod
    def _stop(pool: ProcessPoolExecutor, force: bool) -> None:
        if not force:
            pool.shutdown(wait=True, cancel_futures=True)
            return
        kill = getattr(pool, "kill_workers", None)  # Python >= 3.14
        if kill is not None:
            kill()
        else:  # the executor offers no way to stop a running task before 3.14
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.kill()
        pool.shutdown(wait=True, cancel_futures=True)

