"""What ``flyreg tune`` shows: the progress bar, and the text of specs, configs and times in its tables.

Part of the command (imports rich when used); never imported by ``import flyreg``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from flyreg._core.config import Config


class ProgressBar:
    """The tune's progress bar (on stderr): the job last started or done, how many are done, times."""

    def __init__(self, progress: Any, total: int) -> None:
        self.progress = progress
        self.task = progress.add_task("tuning", total=total)

    def show(self, op: str, spec: dict[str, Any]) -> None:
        """Name the job started last."""
        self.progress.update(self.task, description=f"{op} {spec_str(spec)}")

    def done(self, op: str, spec: dict[str, Any]) -> None:
        """Count one job done, and name it."""
        self.progress.update(self.task, description=f"{op} {spec_str(spec)}", advance=1)


@contextlib.contextmanager
def progress_bar(total: int) -> Iterator[ProgressBar]:
    """A :class:`ProgressBar` over ``total`` jobs (none shown when there are none)."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=make_console(stderr=True), transient=False, disable=not total) as progress:
        yield ProgressBar(progress, total)


def make_console(stderr: bool = False) -> Any:
    """A rich console; wide enough for the summary when the output is not a terminal."""
    from rich.console import Console

    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=160)


def config_str(config: Config) -> str:
    """``Config(BLOCK_N=1024, num_warps=4)`` -> ``BLOCK_N=1024 num_warps=4``."""
    return " ".join(f"{k}={v}" for k, v in (*config.knobs, *config.hint_items)) or "(no knobs)"


def spec_str(spec: dict[str, Any]) -> str:
    """``{"N": 4096, "dtype": "bfloat16"}`` -> ``N=4096,dtype=bfloat16``: what ``--spec`` takes back.

    Values are written as JSON, except strings that read back as themselves (``"8192"`` is quoted).
    """
    return ",".join(f"{k}={v if isinstance(v, str) and not _reads_as_json(v) else json.dumps(v)}"
                    for k, v in sorted(spec.items()))


def _reads_as_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def time_text(ms: float) -> str:
    """A time in ms as the summary shows it: microseconds below 1 ms."""
    return f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.3f} ms"


def escape(text: str) -> str:
    """``text`` with rich's markup characters escaped."""
    from rich.markup import escape as markup_escape

    return markup_escape(text)
