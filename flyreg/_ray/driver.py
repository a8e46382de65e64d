"""``flyreg tune --ray``: plan as a local tune does, tune on Ray actors, write every result here.

The driver (this process) plans the jobs once per device model among the actors, exactly as a
local ``flyreg tune`` plans them (:func:`flyreg._tuning.jobs.plan_jobs`), streams them to the
actors of that model, and alone writes what comes back: each artifact atomically, named by the
device the actor reported, and each measurement into the tuning journal.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import attrs

from flyreg._core.fileio import warn_once
from flyreg._core.keys import DeviceIdentity
from flyreg._core.spec import sanitize, spec_arg, spec_text
from flyreg._core.text import make_console, one_line
from flyreg._ray.actor import JobResult
from flyreg._ray.pool import Stream, Ticket, Worker
from flyreg._search import journal
from flyreg._tuning.display import print_plan, progress_bar, summary
from flyreg._tuning.jobs import EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM, finish, sigterm_as_interrupt
from flyreg._tuning.plan import Job, plan_jobs, skip_reason


@attrs.frozen
class Request:
    """What ``flyreg tune`` was asked, as planning and the searches read it."""

    op_names: list[str]
    specs: list[dict[str, Any]]
    where: list[dict[str, Any]]
    out_dir: Path
    force: bool
    options: dict[str, Any]


def tune_on_ray(request: Request, address: str, device: str | None, workers: int | None, device_name: str | None,
                dry_run: bool) -> int:
    """Run ``request`` on the Ray instance at ``address`` (``"local"``: start one here); returns the exit code."""
    import ray

    from flyreg._ray.pool import connect, nodes, start_workers

    try:
        device = connect(address, device, workers)
        pool = _chosen(start_workers(device, workers), device_name)
        groups: dict[DeviceIdentity, list[Job]] = {}
        for ident in dict.fromkeys(w.ident for w in pool):
            groups[ident] = plan_jobs(request.op_names, request.specs, device, request.out_dir, request.force,
                                      request.where, ident=ident)
        console = make_console()
        models = ", ".join(f"{sum(w.ident == i for w in pool)} x {i.name} ({i.arch})" for i in groups)
        console.print(f"ray: {len(pool)} actors on {', '.join(nodes())}: {models}", markup=False, highlight=False)
        if dry_run:
            for ident, jobs in groups.items():
                print_plan(jobs, device, request.out_dir, ident)
            return EXIT_OK
        return _run(request, pool, groups, console)
    finally:
        ray.shutdown()


def _chosen(pool: list[Worker], device_name: str | None) -> list[Worker]:
    """The actors of the model ``device_name`` names (all without one); the others are ended."""
    import ray

    if device_name is None:
        return pool
    keep = [w for w in pool if w.ident.name == sanitize(device_name)]
    for w in pool:
        if w not in keep:
            ray.kill(w.handle)
    if not keep:
        have = sorted({w.ident.name for w in pool})
        raise LookupError(f"--device-name {device_name!r}: no actor has that device; the cluster has {', '.join(have)}")
    return keep


def _run(request: Request, pool: list[Worker], groups: dict[DeviceIdentity, list[Job]], console: Any) -> int:
    """Stream every job to the actors, write each result as it returns, then print the summaries."""
    todo = [Ticket(j, ident, j.spec) for ident, jobs in groups.items() for j in jobs if j.skip is None and j.error is None]
    interrupted: int | None = None
    builds, start = 0, time.perf_counter()
    with sigterm_as_interrupt() as signals, progress_bar(len(todo)) as bar:

        def call(worker: Worker, ticket: Ticket) -> Any:
            bar.show(ticket.job.op, ticket.job.spec)
            known = _journaled(ticket) if request.options.get("resume", True) else []
            return worker.handle.tune.remote(ticket.job.op, ticket.spec, request.options, known, ticket.go_on)

        stream = Stream(pool, call)
        for ticket in todo:
            stream.put(ticket)
        try:
            for ticket, result, why in stream.results():
                if why is not None:
                    ticket.job.error = why
                elif _accept(request, ticket, result):  # tune the spec specialize() gave, as it has no artifact
                    ticket.spec, ticket.go_on = result.tuned_spec, True
                    stream.put(ticket, first=True)
                    continue
                if result is not None:
                    builds += result.builds
                bar.done(ticket.job.op, ticket.job.spec)
            stream.close()
        except KeyboardInterrupt:
            stream.stop()
            interrupted = EXIT_SIGTERM if signals else EXIT_SIGINT
    for ident, jobs in groups.items():
        summary(console, jobs, ident, request.out_dir)
    for ticket in todo:
        if ticket.deaths:
            console.print(f"retried: {ticket.job.op} {spec_arg(ticket.job.spec)} on another actor after its actor died "
                          f"({'; '.join(ticket.deaths)})", markup=False, highlight=False)
    every = [j for jobs in groups.values() for j in jobs]
    return finish(console, every, bool(todo), interrupted, request.force, builds, time.perf_counter() - start)


def _accept(request: Request, ticket: Ticket, result: JobResult) -> bool:
    """Take one actor's result into its job: journal its measurements, write its artifact. True when the
    job must run again, on the spec ``specialize()`` gave, which has no current artifact."""
    from flyreg._artifacts.store import emit_artifact

    job = ticket.job
    if spec_text(result.tuned_spec) != spec_text(job.spec):
        job.tuned_spec = result.tuned_spec
    job.seconds = result.seconds
    if not result.searched:
        job.skip = None if request.force else skip_reason(job.op, result.tuned_spec, ticket.ident, request.out_dir)
        return job.skip is None
    _journal(result.measurements)
    if result.error is not None or result.report is None:
        job.error = result.error or "the actor returned no result"
        return False
    report = result.report
    try:
        path = emit_artifact(job.op, report.spec, result.ident, report.winner, result.toolchain.get("op", ""),
                             report.winner_ms, report.default_ms, request.out_dir, toolchain=result.toolchain,
                             decision=report.decision)
    except OSError as e:
        job.error = one_line(OSError(f"{job.op}: could not write the artifact of spec {report.spec} into "
                                     f"{str(request.out_dir)!r}: {type(e).__name__}: {e}"))
        return False
    job.result = attrs.evolve(report, artifact=str(path))
    return False


def _journaled(ticket: Ticket) -> list[journal.Measurement]:
    """The journal's rows of the ticket's spec, for its actor to resume from."""
    try:
        return journal.of_spec(ticket.job.op, ticket.spec)
    except (OSError, sqlite3.Error) as e:
        warn_once(f"flyreg: could not read the tuning journal: {e}")
        return []


def _journal(rows: tuple[journal.Measurement, ...]) -> None:
    try:
        journal.append(rows)
    except (OSError, sqlite3.Error) as e:
        warn_once(f"flyreg: could not write the tuning journal: {e}")
