"""``flyreg report``: an HTML page of what tuning found."""

from __future__ import annotations

from pathlib import Path

import click

from flyreg._cli.common import check_op_names, user_errors


def _out_dir(_ctx: click.Context, _param: click.Parameter, value: str) -> Path:
    """``--out`` as a path; an empty one is refused (it would write into the current directory)."""
    if not value.strip():
        raise click.BadParameter(f"expected a directory, got {value!r}", param_hint="--out")
    return Path(value)


@click.command()
@click.argument("op_names", nargs=-1, metavar="[OP]...")
@click.option("--out", type=click.Path(file_okay=False), default="flyreg-report", callback=_out_dir,
              metavar="DIR", show_default=True, help="Directory to write the report page (DIR/index.html) into.")
@user_errors
def report(op_names: tuple[str, ...], out: Path) -> None:
    """Write an HTML report of what tuning found for every tuned op (or the OPs given).

    Per op, from the tuning journal and the artifacts: each spec's served config (its artifact's)
    and why its search chose it, against the default, its throughput as a fraction of the peak
    stored when it was tuned (for ops that state their work), the band of every measured config,
    what tuning cost, and which workloads have no current artifact. Plots need matplotlib
    (pip install 'flyreg[report]').
    """
    from flyreg._report.writer import run_report
    from flyreg._search import journal

    names = list(dict.fromkeys(op_names))
    journaled = journal.ops() if names else set()
    check_op_names([n for n in names if n not in journaled])  # a journaled op reports even once uninstalled
    run_report(names, out)
