"""The jobs of ``flyreg tune``: plan (op, spec) pairs, tune each with a progress bar, summarize.

Part of the command (imports rich); never imported by ``import flyreg``.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from flyreg._artifacts.names import canonical_spec, name_part, spec_text
from flyreg._artifacts.store import index, lookup_dirs
from flyreg._core.keys import DeviceIdentity, identity_of
from flyreg._cli.tune_output import config_str, escape, make_console, progress_bar, spec_str, time_text

#: Exit codes of ``flyreg tune``.
EXIT_OK, EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 130, 143


@attrs.define
class Job:
    """One (op, spec) to tune.

    ``skip`` says why it is not tuned (not a failure), ``error`` why it failed, ``result`` is the
    tuner's report, and ``tuned_spec`` the spec ``specialize()`` gave its inputs when that
    differs from ``spec`` (a row count bucketed, an axis the op adds).
    """

    op: str
    spec: dict[str, Any]
    skip: str | None = None
    error: str | None = None
    result: Any = None
    tuned_spec: dict[str, Any] | None = None
    seconds: float | None = None

    @property
    def state(self) -> str:
        if self.error is not None:
            return "failed"
        if self.skip is not None:
            return "skipped"
        return "tuned" if self.result is not None else "pending"


def count_artifacts(op: str, device: DeviceIdentity, plugin_dirs: Iterable[Path]) -> int:
    """How many artifacts of ``op`` for this device product exist across the lookup directories."""
    names: set[str] = set()
    for d in lookup_dirs(plugin_dirs):
        for fname, (fop, _axes, dev) in index(d).items():
            if fop == name_part(op) and dev == name_part(device.name):
                names.add(fname)
    return len(names)


def skip_reason(op: str, spec: dict[str, Any], ident: DeviceIdentity, out_dir: Path) -> str | None:
    """"current artifact" when lookup would serve the artifact in ``out_dir`` for ``spec`` as it is
    (the resolution chain's current-artifact source), so tuning it again is not needed. Any other
    file at that name is re-tuned (and, if malformed, moved aside first)."""
    from flyreg._plugins.registry import REGISTRY
    from flyreg._runtime.resolution import current_artifact

    try:
        current = current_artifact(REGISTRY.tuner(op), spec, ident, out_dir)
    except Exception:  # the op's hooks fail on its spec: the tune reports why
        return None
    return "current artifact" if current is not None else None


def one_line(e: BaseException, typed: bool = True) -> str:
    """``e`` as one line: ``TypeName: first line of its message``, or with ``typed=False`` the line alone.

    A LookupError's message is its text (a KeyError's key stays quoted: ``KeyError: 'backend'``).
    """
    lookup = isinstance(e, LookupError) and not isinstance(e, KeyError) and len(e.args) == 1
    lines = (str(e.args[0]) if lookup else str(e)).strip().splitlines()
    if not lines:
        return type(e).__name__
    return f"{type(e).__name__}: {lines[0]}" if typed else lines[0]


def _matches(spec: dict[str, Any], where: list[dict[str, Any]]) -> bool:
    """True when ``spec`` has every axis value of one of the ``where`` filters (or there are none)."""
    return not where or any(all(k in spec and spec[k] == v for k, v in w.items()) for w in where)


def plan_jobs(op_names: list[str], specs: list[dict[str, Any]], device: str, out_dir: Path,
              force: bool, where: list[dict[str, Any]] | None = None,
              ident: DeviceIdentity | None = None) -> list[Job]:
    """The jobs: each op's ``--spec`` values or declared workloads (those matching a ``where``
    filter, when given); current artifacts are skipped. ``device`` is the device type or string the
    hooks are asked about; ``ident`` the product whose artifacts count (default: ``device``'s).

    ``op_names`` empty means every registered op: a broken op becomes a failed job, a disabled
    one (or one that declares nothing to tune here) a skipped job. An op named explicitly that
    is unusable raises (one line) when it is the only one, and fails its job otherwise.
    """
    from flyreg._plugins.registry import REGISTRY, OpUnavailableError, ops

    explicit = bool(op_names)
    if explicit:
        names = op_names
        unavailable: dict[str, Job] = {}
    else:
        infos = ops()
        names = [i.name for i in infos if i.status == "ok"]
        unavailable = {i.name: (Job(i.name, {}, error=f"plugin is broken: {i.error}") if i.status == "broken"
                                else Job(i.name, {}, skip="disabled by FLYREG_DISABLE_OPS"))
                       for i in infos if i.status != "ok"}
        names = sorted([*names, *unavailable])
    ident = ident if ident is not None else identity_of(device)
    jobs: list[Job] = []
    for name in names:
        if name in unavailable:
            jobs.append(unavailable[name])
            continue
        try:
            plugin = REGISTRY.plugin(name)
        except OpUnavailableError as e:
            if len(op_names) == 1:
                raise
            jobs.append(Job(name, {}, error=str(e)))
            continue
        if not plugin.implements("make_inputs"):
            why = "no make_inputs hook, so it cannot be tuned offline"
            jobs.append(Job(name, {}, error=why) if explicit else Job(name, {}, skip=why))
            continue
        wanted = specs
        if not wanted:
            try:
                wanted = plugin.workloads(device)
            except Exception as e:  # a plugin's failing hook fails its op only
                jobs.append(Job(name, {}, error=f"workloads() failed: {one_line(e)}"))
                continue
            if not wanted:
                why = f"declares no workloads for {device}; pass --spec"
                jobs.append(Job(name, {}, error=why) if explicit else Job(name, {}, skip=why))
                continue
        seen: set[str] = set()
        axes: set[str] = set()
        matched = 0
        for raw in wanted:
            if specs:  # the user's: a spec that does not fit the op's axes is a usage error (SpecError)
                spec = canonical_spec(plugin.check_spec(raw, device))
            else:
                try:
                    spec = canonical_spec(plugin.check_spec(canonical_spec(raw, "workload spec"), device))
                except (TypeError, ValueError) as e:
                    jobs.append(Job(name, {}, error=f"bad workload {raw!r}: {one_line(e)}"))
                    continue
            axes.update(spec)
            if where and not _matches(spec, where):
                continue
            matched += 1
            if spec_text(spec) in seen:
                continue
            seen.add(spec_text(spec))
            job = Job(name, spec)
            if not force:
                job.skip = skip_reason(name, spec, ident, out_dir)
            jobs.append(job)
        if where and not matched and not specs:
            unknown = sorted({k for w in where for k in w} - axes)
            why = (f"--where names axes {unknown} that no workload has (its axes: {', '.join(sorted(axes))})"
                   if unknown else f"no workload for {device} matches --where")
            jobs.append(Job(name, {}, error=why) if explicit else Job(name, {}, skip=why))
    return jobs


def job_inputs(op: str, spec: dict[str, Any], device: str) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
    """The inputs ``make_inputs`` makes for ``spec`` on ``device``, and the spec ``specialize()`` computes from them
    (checked and canonical): what a job tunes, here or on a Ray actor."""
    from flyreg._plugins.registry import REGISTRY

    plugin = REGISTRY.plugin(op)
    args, kwargs = plugin.make_inputs(dict(spec), device)
    tuned = canonical_spec(plugin.check_spec(canonical_spec(plugin.specialize(args, kwargs),
                                                            f"{op}: specialize() result"), device))
    return args, kwargs, tuned


def _tune_one(job: Job, device: str, out_dir: Path, force: bool, options: dict[str, Any]) -> None:
    from flyreg._plugins.registry import REGISTRY

    tuner = REGISTRY.tuner(job.op)
    args, kwargs, spec = job_inputs(job.op, job.spec, device)
    if spec_text(spec) != spec_text(job.spec):
        job.tuned_spec = spec
        if not force:
            job.skip = skip_reason(job.op, spec, identity_of(device), out_dir)
            if job.skip:
                return
    job.result = tuner.tune(*args, out_dir=out_dir, search_options=options, **kwargs)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[list[int]]:
    """While tuning, SIGTERM stops like Ctrl-C (so no temp file is left); yields the signal seen."""
    seen: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
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
             options: dict[str, Any] | None = None) -> int:
    """Run the jobs with a progress bar, print the summary; returns the exit code. ``options`` are each
    search's run options (:meth:`Autotuner.tune`'s ``search_options``; default: resume from the journal).

    0: every job tuned or skipped; 1: some job failed; 130 (143): stopped by SIGINT (SIGTERM),
    with every artifact written so far kept and no partial file left.
    """
    from flyreg._runtime.builds import BUILD_CACHE

    todo = [j for j in jobs if j.skip is None and j.error is None]
    interrupted: int | None = None
    builds0, start = BUILD_CACHE.builds, time.perf_counter()
    with sigterm_as_interrupt() as signals:
        try:
            with progress_bar(len(todo)) as bar:
                for job in todo:
                    bar.show(job.op, job.spec)
                    t0 = time.perf_counter()
                    try:
                        _tune_one(job, device, out_dir, force, options if options is not None else {"resume": True})
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
        console.print(f"cost: {timed} configs benchmarked{journaled}, {builds} builds, {seconds:.1f} s",
                      markup=False, highlight=False)
    if interrupted is not None:
        again = "the same command without --force" if force else "the same command"
        console.print(f"interrupted: the artifacts written so far are kept; run {again} again to tune the rest",
                      markup=False, highlight=False)
        return interrupted
    return EXIT_FAILED if any(j.error for j in jobs) else EXIT_OK


def print_plan(jobs: list[Job], device: str, out_dir: Path, ident: DeviceIdentity | None = None) -> None:
    """The ``--dry-run`` table: each job and what ``tune`` would do with it (on ``ident``, default ``device``'s)."""
    from rich.table import Table

    ident = ident if ident is not None else identity_of(device)
    console = make_console()
    table = Table(title=f"flyreg tune --dry-run on {ident.name} ({ident.arch})")
    table.add_column("op", no_wrap=True)
    table.add_column("spec", no_wrap=True)
    table.add_column("action", overflow="fold", ratio=1)
    for j in jobs:
        action = f"fail: {j.error}" if j.error else f"skip: {j.skip}" if j.skip else "tune"
        table.add_row(escape(j.op), escape(spec_str(j.spec) or "-"), escape(action))
    console.print(table)
    n = sum(1 for j in jobs if j.skip is None and j.error is None)
    console.print(f"{n} job(s) to tune, {len(jobs) - n} not; artifacts would go to {out_dir}",
                  markup=False, highlight=False)


def summary(console: Any, jobs: list[Job], ident: DeviceIdentity, out_dir: Path) -> None:
    """The summary table of the jobs tuned on ``ident``, and their counts."""
    from rich.table import Table

    table = Table(title=f"flyreg tune on {ident.name} ({ident.arch})")
    for col, justify in (("op", "left"), ("spec", "left"), ("winner", "left"), ("time", "right"),
                         ("vs default", "right"), ("tried", "right"), ("failed", "right")):
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("result", overflow="fold", ratio=1)
    for j in jobs:
        spec = spec_str(j.spec) or "-"
        if j.tuned_spec is not None:
            changed = {k: v for k, v in j.tuned_spec.items() if j.spec.get(k, object()) != v}
            spec += f" (as {spec_str(changed)})"
        r = j.result
        if r is not None:
            speedup = f"{r.speedup:.2f}x" if r.speedup else "-"
            table.add_row(escape(j.op), escape(spec), config_str(r.winner), time_text(r.winner_ms), speedup,
                          str(r.tried), str(len(r.failed) + len(r.rejected)), "written")
            continue
        if j.error:
            state = f"[red]failed[/red]: {escape(j.error)}"
        elif j.skip:
            state = f"skipped: {escape(j.skip)}"
        else:
            state = "[yellow]not run (interrupted)[/yellow]"
        table.add_row(escape(j.op), escape(spec), "", "", "", "", "", state)
    console.print(table)
    counts = {s: sum(1 for j in jobs if j.state == s) for s in ("tuned", "skipped", "failed", "pending")}
    line = f"{counts['tuned']} tuned, {counts['skipped']} skipped, {counts['failed']} failed"
    if counts["pending"]:
        line += f", {counts['pending']} not run"
    console.print(f"{line}; artifacts in {out_dir}", markup=False, highlight=False)
