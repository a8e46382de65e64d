"""``flyreg tune``'s run: tune each planned job with a progress bar, in this process or isolated, then summarize.

Part of the command (imports rich); never imported by ``import flyreg``.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flyreg._core.keys import identity_of
from flyreg._core.text import make_console, one_line
from flyreg._tuning.display import progress_bar, summary
from flyreg._tuning.isolated_jobs import Isolation, isolated
from flyreg._tuning.plan import Job, tuned_as

#: Exit codes of ``flyreg tune``.
EXIT_OK, EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 130, 143


def job_inputs(op: str, spec: dict[str, Any], device: str) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
    """The inputs ``make_inputs`` makes for ``spec`` on ``device``, and the spec ``specialize()`` computes from
    them (checked and canonical): what a job tunes, here or on a Ray actor."""
    from flyreg._plugins.registry import REGISTRY
    from flyreg._plugins.timing import tuned_spec

    args, kwargs = REGISTRY.plugin(op).make_inputs(dict(spec), device)
    return args, kwargs, tuned_spec(op, args, kwargs, device)


def _tune_one(job: Job, device: str, out_dir: Path, force: bool, options: dict[str, Any]) -> None:
    from flyreg._plugins.registry import REGISTRY

    tuner = REGISTRY.tuner(job.op)
    args, kwargs, spec = job_inputs(job.op, job.spec, device)
    if tuned_as(job, spec, device, out_dir, force):
        return
    job.result = tuner.tune(*args, out_dir=out_dir, search_options=options, **kwargs)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[list[int]]:
    """While tuning, SIGTERM stops like Ctrl-C (so no temp file is left); yields the signal seen."""
    seen: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if seen:  # stopping already (a second SIGTERM, one sent to the command's group as well as passed on)
            return
        seen.append(signum)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield seen
        return
    try:
        yield seen
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_jobs(jobs: list[Job], device: str, out_dir: Path, force: bool = False,
             options: dict[str, Any] | None = None, isolate: bool | None = None) -> int:
    """Run the jobs with a progress bar, print the summary; returns the exit code. ``options`` are each
    search's run options (:meth:`Autotuner.tune`'s ``search_options``; default: resume from the journal).
    ``isolate`` runs every job's candidates in worker processes, or none's (None: as
    :func:`flyreg._tuning.isolated_jobs.isolated` decides for each job).

    0: every job tuned or skipped; 1: some job failed; 130 (143): stopped by SIGINT (SIGTERM),
    with every artifact written so far kept and no partial file left.
    """
    from flyreg._runtime.builds import BUILD_CACHE

    todo = [j for j in jobs if j.skip is None and j.error is None]
    interrupted: int | None = None
    builds0, start = BUILD_CACHE.builds, time.perf_counter()
    options = options if options is not None else {"resume": True}
    with sigterm_as_interrupt() as signals:
        try:  # an interruption reaches the Isolation, which then ends its compiles at once (one may hang)
            with Isolation() as isolation, progress_bar(len(todo)) as bar:
                for job in todo:
                    bar.show(job.op, job.spec)
                    t0 = time.perf_counter()
                    try:
                        job.isolated = isolated(isolate, device, job)
                        tune = isolation.tune if job.isolated else _tune_one
                        with bar.searching():
                            tune(job, device, out_dir, force, options)
                    except KeyboardInterrupt:
                        raise
                    except Exception as e:  # one failing job never stops the others
                        job.error = one_line(e)
                    job.seconds = time.perf_counter() - t0
                    bar.done(job.op, job.spec)
        except KeyboardInterrupt:
            interrupted = EXIT_SIGTERM if signals else EXIT_SIGINT
    console = make_console()
    summary(console, jobs, identity_of(device), out_dir)
    return finish(console, jobs, bool(todo), interrupted, force, BUILD_CACHE.builds - builds0,
                  time.perf_counter() - start)


def finish(console: Any, jobs: list[Job], tuned_any: bool, interrupted: int | None, force: bool, builds: int,
           seconds: float) -> int:
    """The lines after the summary (the cost, or how to go on after an interruption); returns the exit code."""
    if tuned_any and interrupted is None:
        results = [j.result for j in jobs if j.result is not None]
        timed, reused = sum(len(r.timings) for r in results), sum(r.reused for r in results)
        journaled = f" ({reused} results read from the tuning journal)" if reused else ""
        n_isolated = sum(1 for j in jobs if j.isolated)
        built = f"{builds} builds" + (
            f" in this process (the candidates of {n_isolated} isolated job(s) in worker processes)"
            if n_isolated else "")
        console.print(f"cost: {timed} configs benchmarked{journaled}, {built}, {seconds:.1f} s",
                      markup=False, highlight=False)
    if interrupted is not None:
        again = "the same command without --force" if force else "the same command"
        console.print(f"interrupted: the artifacts written so far are kept; run {again} again to tune the rest",
                      markup=False, highlight=False)
        return interrupted
    return EXIT_FAILED if any(j.error for j in jobs) else EXIT_OK
