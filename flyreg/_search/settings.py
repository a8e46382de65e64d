"""How a search runs: its settings live in :mod:`flyreg._core.search_terms`, which serving shares without
importing the search; the search's modules read them from here."""

from __future__ import annotations

from flyreg._core.search_terms import RUN_FIELDS, Reference, SearchSettings, names_of

__all__ = ["RUN_FIELDS", "Reference", "SearchSettings", "names_of"]
