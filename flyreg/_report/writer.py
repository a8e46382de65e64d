"""``flyreg report``: write the HTML report of what tuning found, and print a one-screen summary."""

from __future__ import annotations

import statistics
from pathlib import Path

import click

from flyreg._core.fileio import write_text_atomic
from flyreg._core.keys import DeviceIdentity
from flyreg._core.text import escape, make_console
from flyreg._report.data import OpReport, collect
from flyreg._report.page import page
from flyreg._report.plots import missing_matplotlib
from flyreg._search import journal

#: The page inside the report directory.
PAGE = "index.html"


def run_report(op_names: list[str], out: Path) -> None:
    """Write ``out``/index.html for ``op_names`` (every op in the journal when empty), print the summary
    and the page's path. No matplotlib, or nothing journaled: a one-line error (ClickException)."""
    why = missing_matplotlib()
    if why is not None:
        raise click.ClickException(why)
    reports = collect(op_names or None)
    where = journal.database()
    if not reports:
        what = f" of {', '.join(op_names)}" if op_names else ""
        raise click.ClickException(f"the tuning journal {where} holds no measurements{what}: run flyreg tune first")
    for name in op_names:
        if not any(r.op == name for r in reports):
            click.echo(f"flyreg: warning: the tuning journal holds no measurements of {name}; it is left out",
                       err=True)
    path = (out / PAGE).absolute()
    try:
        write_text_atomic(path, page(reports, str(where)))
    except OSError as e:
        raise click.ClickException(f"cannot write the report into {out}: {e.strerror or e}") from None
    summary(reports)
    click.echo(f"report: {path}")


def _range(values: list[float], digits: int, suffix: str) -> str:
    """``1.20x (1.00x-2.31x)``: the median and the range of ``values``; ``-`` when there are none."""
    if not values:
        return "-"
    mid = f"{statistics.median(values):.{digits}f}{suffix}"
    if len(values) == 1:
        return mid
    return f"{mid} ({min(values):.{digits}f}{suffix}-{max(values):.{digits}f}{suffix})"


def summary(reports: list[OpReport]) -> None:
    """One table per device, a row per op: the served configs' speedups and fraction of the bound, cost,
    coverage; then the peaks. Names (an op's, a device's) are escaped: they are not markup."""
    from rich.table import Table

    console = make_console()
    devices: dict[DeviceIdentity, list[OpReport]] = {}
    for r in reports:
        devices.setdefault(r.device, []).append(r)
    for device, found in devices.items():
        table = Table(title=escape(f"flyreg report on {device.name} ({device.arch})"))
        for col, justify in (("op", "left"), ("specs", "right"), ("vs default", "right"), ("of bound", "right"),
                             ("timed", "right"), ("failed", "right"), ("measuring", "right"),
                             ("current", "right")):
            table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for r in found:
            speedups = [s.speedup for s in r.specs if s.speedup is not None]
            bounds = [b for s in r.specs if (b := s.of_bound(r.peak)) is not None]
            workloads = [c for c in r.coverage if c.workload]
            current = f"{sum(c.state == 'current' for c in workloads)}/{len(workloads)}" if workloads else "-"
            table.add_row(escape(r.op), str(len(r.specs)), _range(speedups, 2, "x"), _range(bounds, 2, ""),
                          str(r.timed), str(r.failures), f"{r.span_s:.1f} s", current)
        console.print(table)
        peaks = list(dict.fromkeys(how for r in found for how in r.peaks))
        console.print(f"peak of {device.name} ({device.arch}): {'; '.join(peaks)}", markup=False, highlight=False)
    console.print("current: workloads with a current artifact; the page lists the others", markup=False,
                  highlight=False)
