"""``flyreg report``: an HTML page of what tuning found."""

from __future__ import annotations

from pathlib import Path

import click

from flyreg._cli.common import check_op_names, user_errors


@click.command()
@click.argument("op_names", nargs=-1, metavar="[OP]...")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("flyreg-report"),
              metavar="DIR", show_default=True, help="Directory to write the report page (DIR/index.html) into.")
@user_errors
def report(op_names: tuple[str, ...], out: Path) -> None:
    """Write an HTML report of what tuning found for every tuned op (or the OPs given).

    Per op, from the tuning journal: each spec's winner against the default, its throughput as a
    fraction of the device's peak (for ops that state their work), the spread of every measured
    config, what tuning cost, and which workloads have no current artifact. Plots need
    matplotlib (pip install 'flyreg[report]').
    """
    from flyreg._cli.report import run_report
    from flyreg._search import journal

    names = list(dict.fromkeys(op_names))
    journaled = journal.ops() if names else set()
    check_op_names([n for n in names if n not in journaled])  # a journaled op reports even once uninstalled
    run_report(names, out)
