"""``flyreg tune`` jobs whose candidates run in other processes (``--isolate``).

Each job's candidates are compiled in a pool of ``FLYREG_COMPILE_WORKERS`` processes (kept for
the whole run) and timed one at a time in a benchmarking worker process, which makes the op's
inputs itself; this process runs no candidate and starts no device work for one. A candidate
that crashes its worker (an abort), leaves its CUDA context unusable (an illegal memory access)
or runs past the time limit (20 times the slowest candidate so far, at least
``FLYREG_CANDIDATE_TIMEOUT``) is journaled and reported as failed with its reason, its worker is
replaced, and the search goes on.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from flyreg._core.keys import identity_of
from flyreg._search.compile_pool import CompilePool
from flyreg._search.worker import AdaptiveLimit, WorkerEvaluator
from flyreg._tuning.plan import Job, tuned_as

#: Without ``--isolate`` or ``--no-isolate``, a job is isolated on CUDA when its space has more configs than this.
ISOLATE_ABOVE = 64

def isolated(flag: bool | None, device: str, job: Job) -> bool:
    """Whether ``job`` runs isolated: as ``flag`` says, else on CUDA for a space of more than
    :data:`ISOLATE_ABOVE` configs (counted on the job's spec; a space that cannot be counted there is isolated)."""
    if flag is not None:
        return flag
    if not device.startswith("cuda"):
        return False
    from flyreg._plugins.registry import REGISTRY

    try:
        return len(REGISTRY.tuner(job.op).space.candidates(dict(job.spec))) > ISOLATE_ABOVE
    except Exception:  # the op's hooks need the spec specialize() gives: the worker finds it
        return True


class Isolation:
    """The compile pool of one ``flyreg tune`` run, started by its first isolated job; a context manager."""

    def __init__(self) -> None:
        self.pool: CompilePool | None = None

    def __enter__(self) -> Isolation:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self.pool is not None:
            self.pool.close(force=exc_type is not None)

    def tune(self, job: Job, device: str, out_dir: Path, force: bool, options: dict[str, Any]) -> None:
        """Tune ``job`` isolated: its result, skip or raised error as :func:`flyreg._tuning.jobs.run_jobs` expects."""
        from flyreg._core.settings import current
        from flyreg._plugins.registry import REGISTRY
        from flyreg._plugins.timing import OpBench, compile_config
        from flyreg._runtime.searching import search_isolated

        settings = current()
        tuner = REGISTRY.tuner(job.op)
        run = tuner.settings.with_run(**options)
        ident = identity_of(device)
        with WorkerEvaluator(OpBench, (job.op, job.spec, device), min_seconds=settings.candidate_timeout) as bench:
            info = bench.start()
            if tuned_as(job, info["tuned"], device, out_dir, force):
                return
            if self.pool is None:
                self.pool = CompilePool(settings.compile_workers, AdaptiveLimit(min_seconds=settings.candidate_timeout))
            compile = functools.partial(self.pool.compile, compile_config, (job.op, job.spec, device))
            _, error = search_isolated(tuner, info["spec"], ident, info["pkey"], device, bench, compile, emit=True,
                                       out_dir=out_dir, settings=run)
        if error is not None:
            raise OSError(f"{tuner.name}: {error}") from error.__cause__
        job.result = tuner.reports[info["pkey"]]
