"""What ``flyreg tune`` prints: the progress bar, the ``--dry-run`` plan and the summary of the jobs run."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flyreg._core.keys import DeviceIdentity, identity_of
from flyreg._core.spec import spec_arg
from flyreg._core.text import config_str, escape, make_console, ms_text
from flyreg._search.output import uncaptured
from flyreg._tuning.plan import Job


class ProgressBar:
    """The tune's progress bar (on stderr), two levels: the job last started or done and how many are done,
    and under it, while a job's search runs, how many of the configs it plans to time are measured.

    It is the search's progress listener (:class:`flyreg._search.progress.Listener`) inside :meth:`searching`.
    """

    def __init__(self, progress: Any, total: int) -> None:
        self.progress = progress
        self.task = progress.add_task("tuning", total=total)
        self.configs = progress.add_task("  configs", total=None, visible=False)

    def show(self, op: str, spec: dict[str, Any]) -> None:
        """Name the job started last."""
        self.progress.update(self.task, description=f"{op} {spec_arg(spec)}")

    def done(self, op: str, spec: dict[str, Any]) -> None:
        """Count one job done, and name it."""
        self.progress.update(self.task, description=f"{op} {spec_arg(spec)}", advance=1)

    @contextlib.contextmanager
    def searching(self) -> Iterator[None]:
        """While a job runs: the configs line counts its search's configs; hidden again after it."""
        from flyreg._search.progress import listening

        try:
            with listening(self):
                yield
        finally:
            self.progress.update(self.configs, visible=False)

    def planned(self, configs: int, seconds: float | None) -> None:
        within = f" (budget {seconds:g} s)" if seconds is not None else ""
        self.progress.reset(self.configs, total=configs, completed=0, visible=True, description=f"  configs{within}")

    def measured(self, configs: int) -> None:
        self.progress.advance(self.configs, configs)


@contextlib.contextmanager
def progress_bar(total: int) -> Iterator[ProgressBar]:
    """A :class:`ProgressBar` over ``total`` jobs (none shown when there are none)."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    console = make_console(stderr=True)
    with uncaptured(sys.stderr) as stream:  # the bar goes on while a candidate's output is captured
        console.file = stream
        with Progress(*columns, console=console, transient=False, disable=not total) as progress:
            yield ProgressBar(progress, total)


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
        table.add_row(escape(j.op), escape(spec_arg(j.spec) or "-"), escape(action))
    console.print(table)
    n = sum(1 for j in jobs if j.skip is None and j.error is None)
    console.print(f"{n} job(s) to tune, {len(jobs) - n} not; artifacts would go to {out_dir}",
                  markup=False, highlight=False)


def summary(console: Any, jobs: list[Job], ident: DeviceIdentity, out_dir: Path) -> None:
    """The summary table of the jobs tuned on ``ident``, their failed configs, and their counts."""
    from rich.table import Table

    table = Table(title=f"flyreg tune on {ident.name} ({ident.arch})")
    for col, justify in (("op", "left"), ("spec", "left"), ("winner", "left"), ("time", "right"),
                         ("vs default", "right")):
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("why", overflow="fold")  # the rule that chose the winner (Decision.short)
    for col in ("tried", "failed"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("result", overflow="fold", ratio=1)
    for j in jobs:
        spec = spec_arg(j.spec) or "-"
        if j.tuned_spec is not None:
            changed = {k: v for k, v in j.tuned_spec.items() if j.spec.get(k, object()) != v}
            spec += f" (as {spec_arg(changed)})"
        r = j.result
        if r is not None:
            speedup = f"{r.speedup:.2f}x" if r.speedup else "-"
            why = r.decision.short if r.decision is not None else "-"
            table.add_row(escape(j.op), escape(spec), escape(config_str(r.winner)), ms_text(r.winner_ms), speedup,
                          escape(why), str(r.tried), str(len(r.failed) + len(r.rejected)), "written")
            continue
        if j.error:
            state = f"[red]failed[/red]: {escape(j.error)}"
        elif j.skip:
            state = f"skipped: {escape(j.skip)}"
        else:
            state = "[yellow]not run (interrupted)[/yellow]"
        table.add_row(escape(j.op), escape(spec), "", "", "", "", "", "", state)
    console.print(table)
    _failures(console, jobs)
    counts = {s: sum(1 for j in jobs if j.state == s) for s in ("tuned", "skipped", "failed", "pending")}
    line = f"{counts['tuned']} tuned, {counts['skipped']} skipped, {counts['failed']} failed"
    if counts["pending"]:
        line += f", {counts['pending']} not run"
    console.print(f"{line}; artifacts in {out_dir}", markup=False, highlight=False)


#: Failed or rejected configs the summary names per spec; the tuning journal holds them all.
SHOWN_FAILURES = 5


def _failures(console: Any, jobs: list[Job]) -> None:
    """Each tuned spec's first failed or rejected configs, with the reason."""
    lines = []
    for j in jobs:
        if j.result is None:
            continue
        failures = [*j.result.failed, *((c, f"rejected: {why}") for c, why in j.result.rejected)]
        for config, why in failures[:SHOWN_FAILURES]:
            lines.append(f"  {j.op} {spec_arg(j.spec) or '-'}: {config_str(config)}: {why}")
        if len(failures) > SHOWN_FAILURES:
            lines.append(f"  {j.op} {spec_arg(j.spec) or '-'}: and {len(failures) - SHOWN_FAILURES} more")
    if lines:
        console.print("\n".join(["failed configs (all of them are in the tuning journal):", *lines]), markup=False,
                      highlight=False)
