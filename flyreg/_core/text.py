"""How flyreg writes things for a person to read: an error as one line, a config as the options take it, a time,
rich's console and markup escaping (rich loads on first use). A spec's text is :mod:`flyreg._core.spec`'s."""

from __future__ import annotations

from typing import Any

from flyreg._core.config import Config


def one_line(e: BaseException, typed: bool = True) -> str:
    """``e`` as one line: ``TypeName: first line of its message``, or with ``typed=False`` the line alone.

    A LookupError's message is its text (a KeyError's key stays quoted: ``KeyError: 'backend'``).
    """
    lookup = isinstance(e, LookupError) and not isinstance(e, KeyError) and len(e.args) == 1
    lines = (str(e.args[0]) if lookup else str(e)).strip().splitlines()
    if not lines:
        return type(e).__name__
    return f"{type(e).__name__}: {lines[0]}" if typed else lines[0]


def make_console(stderr: bool = False) -> Any:
    """A rich console; wide enough for the summary when the output is not a terminal."""
    from rich.console import Console

    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=160)


def config_str(config: Config) -> str:
    """``Config(BLOCK_N=1024, num_warps=4)`` -> ``BLOCK_N=1024 num_warps=4``."""
    return " ".join(f"{k}={v}" for k, v in (*config.knobs, *config.hint_items)) or "(no knobs)"



def ms_text(ms: float) -> str:
    """A time in ms as the summary shows it (us below 1 ms)."""
    return f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.3f} ms"


def escape(text: str) -> str:
    """``text`` safe in rich markup."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)
