"""The jobs of ``flyreg tune``: plan (op, spec) pairs, tune each with a progress bar, summarize."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from .keys import DeviceIdentity, identity_of, normalize_spec
from .offline import OfflineStore, artifact_filename, emit_dir, index, load_artifact, name_part


@attrs.define
class Job:
    """One (op, spec) to tune; ``skip`` says why it won't be, ``result`` what tuning gave."""

    op: str
    spec: dict[str, Any]
    skip: str | None = None
    result: Any = None
    error: str | None = None


def count_artifacts(op: str, device: DeviceIdentity, plugin_dirs: Iterable[Path]) -> int:
    """How many artifacts of ``op`` for this device product exist across the lookup directories."""
    names: set[str] = set()
    for d in OfflineStore(op, [str(p) for p in plugin_dirs], (), "0").dirs():
        for fname, (fop, _axes, dev) in index(d).items():
            if fop == name_part(op) and dev == name_part(device.name):
                names.add(fname)
    return len(names)


def _current(path: Path, op_version: str) -> bool:
    from .keys import fingerprint

    try:
        return load_artifact(path).provenance.get("toolchain") == fingerprint(op_version)
    except ValueError:
        return False


def plan_jobs(op_names: list[str], specs: list[dict[str, Any]], device: str, out: Path | None,
              force: bool) -> list[Job]:
    """The jobs to run: each op's ``--spec`` values or declared workloads; current artifacts are skipped."""
    from .registry import REGISTRY, ops

    if not op_names:
        op_names = [i.name for i in ops() if i.status == "ok"]
    ident = identity_of(device)
    out_dir = out if out is not None else emit_dir()
    jobs = []
    for name in op_names:
        try:
            plugin = REGISTRY.plugin(name)
        except (LookupError, RuntimeError) as e:
            if specs or len(op_names) == 1:
                raise
            jobs.append(Job(name, {}, error=str(e)))
            continue
        for spec in specs or plugin.workloads(device):
            spec = normalize_spec(spec, "--spec")
            job = Job(name, spec)
            path = out_dir / artifact_filename(name, spec, ident.name)
            if not force and path.is_file() and _current(path, plugin.description.version):
                job.skip = f"current artifact {path.name}"
            jobs.append(job)
        if not specs and not plugin.workloads(device):
            jobs.append(Job(name, {}, error="declares no workloads; pass --spec"))
    return jobs


def _tune_one(job: Job, device: str, out: Path | None) -> None:
    from .registry import REGISTRY

    plugin = REGISTRY.plugin(job.op)
    if not plugin.implements("make_inputs"):
        raise ValueError(f"op {job.op!r} has no make_inputs hook, so it cannot be tuned offline")
    args, kwargs = plugin.make_inputs(dict(job.spec), device)
    job.result = REGISTRY.tuner(job.op).tune(*args, out_dir=out, **kwargs)


def run_jobs(jobs: list[Job], device: str, out: Path | None, dry_run: bool) -> int:
    """Run the jobs with a progress bar and print the summary; returns the exit code."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    console = make_console()
    todo = [j for j in jobs if j.skip is None and j.error is None]
    if dry_run:
        for j in jobs:
            state = j.error or (f"skip ({j.skip})" if j.skip else "tune")
            console.print(f"{j.op} {json.dumps(j.spec, sort_keys=True)}: {state}", markup=False)
        return 0
    interrupted = False
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("tuning", total=len(todo))
        for job in todo:
            progress.update(task, description=f"{job.op} {json.dumps(job.spec, sort_keys=True)}")
            try:
                _tune_one(job, device, out)
            except KeyboardInterrupt:
                interrupted = True
                job.error = "interrupted"
                break
            except Exception as e:  # one failing job never stops the others
                job.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            progress.advance(task)
    _summary(console, jobs, device)
    if interrupted:
        console.print("interrupted: artifacts written so far are kept", markup=False)
        return 130
    return 1 if any(j.error for j in jobs) else 0


def make_console() -> Any:
    """A rich console; wide enough for the summary when the output is not a terminal."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


def _summary(console: Any, jobs: list[Job], device: str) -> None:
    from rich.table import Table

    ident = identity_of(device)
    table = Table(title=f"flyreg tune on {ident.name} ({ident.arch})")
    for col in ("op", "spec", "winner", "time (us)", "vs default", "tried", "failed", "result"):
        table.add_column(col)
    for j in jobs:
        spec = ",".join(f"{k}={v}" for k, v in sorted(j.spec.items()))
        r = j.result
        if r is not None:
            speedup = f"{r.speedup:.2f}x" if r.speedup else "-"
            table.add_row(j.op, spec, repr(r.winner), f"{r.winner_ms * 1e3:.1f}", speedup, str(r.tried),
                          str(len(r.failed) + len(r.rejected)), Path(r.artifact).name if r.artifact else "")
        else:
            state = j.error or (f"skipped: {j.skip}" if j.skip else "not run (interrupted)")
            table.add_row(j.op, spec, "", "", "", "", "", state)
    console.print(table)
