"""The scratch disk cache: one SQLite database per cache dir (WAL), one row per (op, key).

A lookup is one indexed read and a store one small transaction, whatever the cache's size; op
names, keys and entries of any length are stored as they are. The cache is scratch
(:mod:`flyreg._core.sqlite`): a file at its path that is not a database of this schema (corrupt,
foreign, a link, not a regular file) is moved aside with a warning and rebuilt, never opened
through; a read-only, busy or unusable cache is read as far as it can be and written not at all,
with one warning, and no lookup or store raises because of it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from flyreg._core import settings
from flyreg._core.fileio import remove_abandoned_temps, warn_once
from flyreg._core.sqlite import Database, Schema

DB_NAME = "flyreg-cache.sqlite3"
SCHEMA = Schema("scratch cache", 2, {"entries": ("op", "key", "entry", "updated")}, (
    "CREATE TABLE IF NOT EXISTS entries (op TEXT NOT NULL, key TEXT NOT NULL, entry TEXT NOT NULL, "
    "updated REAL NOT NULL, PRIMARY KEY (op, key)) WITHOUT ROWID",
))


def cache_dir() -> Path:
    """``FLYREG_CACHE_DIR`` (expanded) if set, else the user's cache dir; the environment's current value."""
    return settings.current().cache_dir


def database() -> Path:
    """The cache database of the current cache dir (every op's entries live in it)."""
    return cache_dir() / DB_NAME


DB = Database(database, SCHEMA)


def _decode(path: Path, op: str, key: str, text: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(text)
    except (ValueError, RecursionError) as e:
        warn_once(f"flyreg: ignoring a corrupt entry of op {op!r} in {path}: {e}", key=f"bad-entry:{path}:{op}:{key}")
        return None
    return entry if isinstance(entry, dict) else None


def get(op: str, key: str) -> dict[str, Any] | None:
    """The entry of ``op`` under ``key``, or None; one indexed read, never raises on a bad database."""
    rows = DB.read("SELECT entry FROM entries WHERE op = ? AND key = ?", (op, key))
    return _decode(database(), op, key, rows[0][0]) if rows else None


def starting_with(op: str, prefix: str) -> dict[str, dict[str, Any]]:
    """The entries of ``op`` whose key starts with ``prefix``, key -> entry: one indexed range read, which
    reads only those rows however many the op has (a spec-only lookup: :func:`flyreg._core.keys.cache_key_prefix`)."""
    out = {}
    # Keys are ASCII JSON, so every key starting with the prefix sorts below the prefix followed by U+FFFF.
    rows = DB.read("SELECT key, entry FROM entries WHERE op = ? AND key >= ? AND key < ? ORDER BY key",
                   (op, prefix, prefix + "\uffff"))
    for key, text in rows:
        entry = _decode(database(), op, key, text)
        if entry is not None:
            out[key] = entry
    return out


def counts() -> dict[str, int]:
    """Entries per op in the current cache database."""
    return {op: n for op, n in DB.read("SELECT op, COUNT(*) FROM entries GROUP BY op ORDER BY op", ())}


def store(op: str, key: str, entry: dict[str, Any]) -> Path:
    """Add (or replace) ``entry`` under ``key`` for ``op``: one small transaction; returns the database."""
    text = json.dumps(entry, sort_keys=True)
    with DB.write() as conn:
        conn.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?)", (op, key, text, time.time()))
    return database()


def clear(op: str | None = None) -> int:
    """Delete ``op``'s entries, or every op's, and the temp files killed writers left; returns entries removed.

    Anything else in the cache directory (a user's file, a database moved aside) is left alone. A cache
    that cannot be written (read-only, busy, unusable) raises :class:`~flyreg._core.sqlite.Unusable`
    and loses nothing.
    """
    remove_abandoned_temps(cache_dir())
    if not DB.read("SELECT 1 FROM entries LIMIT 1"):
        return 0
    with DB.write(strict=True) as conn:
        if op is None:
            cur = conn.execute("DELETE FROM entries")
        else:
            cur = conn.execute("DELETE FROM entries WHERE op = ?", (op,))
    return cur.rowcount


def close() -> None:
    """Close this thread's connections (tests; a process's connections close at exit)."""
    DB.close()
