"""The ``flyreg`` command: list, tune, show, check, report and cache.

Never imported by ``import flyreg``: click and rich load only when the command runs.
Each command is a module of this package; this one assembles the group and runs it.

Exit codes: 0 success; 1 a failure (a job that failed, a broken op named on its own, an
artifact problem found by ``check``); 2 a usage error (bad option or value, unknown op);
130 interrupted by Ctrl-C (143 by SIGTERM during ``tune``). Every user error is one line on
stderr, ``flyreg: error: ...``, with no traceback.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import click

from flyreg._cli.cache import cache
from flyreg._cli.check import check
from flyreg._cli.list_ops import list_ops
from flyreg._cli.report import report
from flyreg._cli.show import show
from flyreg._cli.tune import tune
from flyreg._version import __version__


class _Group(click.Group):
    """The ``flyreg`` group: its help ends with every environment variable flyreg reads."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from flyreg._core.settings import help_rows

        with formatter.section("Environment (a bad value warns and the default is used)"):
            formatter.write_dl(help_rows())


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="flyreg")
def cli() -> None:
    """flyreg: list, tune and serve the configs of registered GPU kernels."""


cli.add_command(list_ops)
cli.add_command(tune)
cli.add_command(show)
cli.add_command(check)
cli.add_command(report)
cli.add_command(cache)


# -- entry point ----------------------------------------------------------------------------------------
def _one_line_warnings() -> None:
    """flyreg's own warnings as the one line they are, not ``file:line: Category: message``."""
    from flyreg._core.fileio import FlyregWarning

    original = warnings.showwarning

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        if issubclass(category, FlyregWarning):
            text = str(message)
            click.echo(text if text.startswith("flyreg") else f"flyreg: warning: {text}", err=True)
        else:
            original(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def _raised_here(e: BaseException) -> bool:
    """Whether ``e`` was raised by the CLI's own code (its innermost frame is in this package), not by a plugin."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and Path(tb.tb_frame.f_code.co_filename).resolve().parent == Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> None:
    """Console entry point (also ``python -m flyreg``)."""
    from flyreg._cli import supervise

    args = sys.argv[1:] if argv is None else list(argv)
    how = supervise.wanted(args, in_process=argv is not None)
    if how is not None:
        code = supervise.run(args, how, in_process=argv is not None)
        if code is not None:
            sys.exit(code)
    supervise.child_setup()  # a supervised child (a fork returns here): marks its loads on the pipe
    _one_line_warnings()
    try:
        code = cli.main(args=args, prog_name="flyreg", standalone_mode=False)
    except SystemExit as e:  # a failure status, or a command's own exit; an exit 0 from code it called is not an end
        if (isinstance(e.code, int) and e.code != 0) or _raised_here(e):
            supervise.mark_done()
        raise
    except click.exceptions.Abort:
        click.echo("flyreg: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        if isinstance(e, getattr(click.exceptions, "NoArgsIsHelpError", ())):  # bare `flyreg`: the help (click >= 8.2)
            e.show()
        else:
            click.echo(f"flyreg: error: {e.format_message()}", err=True)
        supervise.mark_done()  # a user error ends the command as it should
        sys.exit(e.exit_code)
    except BrokenPipeError:  # flyreg list | head
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    status = code if isinstance(code, int) else 0
    if status == 0:
        supervise.mark_done()
    sys.exit(status)
