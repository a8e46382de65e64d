"""Who hears how far a search has got: how many configs it plans to time, and each one measured.

A caller (``flyreg tune``'s progress bar) installs a :class:`Listener` around a search with
:func:`listening`; the search tells it through :func:`planned` and :func:`measured`, which do
nothing when no one listens. The listener is per context (a :class:`contextvars.ContextVar`),
so concurrent searches in other threads tell their own listeners, or none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol


class Listener(Protocol):
    def planned(self, configs: int, seconds: float | None) -> None:
        """A search starts that times at most ``configs`` configs, within ``seconds`` (its budget; None: none)."""

    def measured(self, configs: int) -> None:
        """``configs`` more configs were timed, read from the journal, or failed."""


_LISTENER: ContextVar[Listener | None] = ContextVar("flyreg_search_listener", default=None)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Searches started in this context tell ``listener`` how far they have got."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def planned(configs: int, seconds: float | None = None) -> None:
    listener = _LISTENER.get()
    if listener is not None:
        listener.planned(configs, seconds)


def measured(configs: int) -> None:
    listener = _LISTENER.get()
    if listener is not None:
        listener.measured(configs)
