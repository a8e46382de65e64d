"""The scratch disk cache: one SQLite database per cache dir (WAL), one row per (op, key).

A lookup is one indexed read and a store one small transaction, whatever the cache's size; op
names, keys and entries of any length are stored as they are. A file that is not a database of
this schema (corrupt, foreign, not a regular file) is moved aside with a warning and rebuilt.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import filelock

from flyreg._core import settings
from flyreg._core.fileio import remove_abandoned_temps, warn_once

SCHEMA = 2
DB_NAME = "flyreg-cache.sqlite3"
#: How long a writer waits for another process's transaction before giving up (seconds).
BUSY_TIMEOUT = 30.0

_local = threading.local()
_DDL = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS entries (op TEXT NOT NULL, key TEXT NOT NULL, entry TEXT NOT NULL, "
    "updated REAL NOT NULL, PRIMARY KEY (op, key)) WITHOUT ROWID",
)


def cache_dir() -> Path:
    """``FLYREG_CACHE_DIR`` (expanded) if set, else the user's cache dir; the environment's current value."""
    return settings.current().cache_dir


def database() -> Path:
    """The cache database of the current cache dir (every op's entries live in it)."""
    return cache_dir() / DB_NAME


class _Foreign(Exception):
    """The file at the database path is not a flyreg cache database of this schema."""


def _check_regular(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise _Foreign("not a regular file")


def _open(path: Path) -> sqlite3.Connection:
    """A connection to ``path`` with this schema in place; :class:`_Foreign` when the file is not ours."""
    _check_regular(path)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        with _transaction(conn):
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and tables != {"meta", "entries"}:
                raise _Foreign(f"it holds the tables {sorted(tables)}, not flyreg's")
            for ddl in _DDL:
                conn.execute(ddl)
            row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
            elif row[0] != str(SCHEMA):
                raise _Foreign(f"schema {row[0]}, expected {SCHEMA}")
        cols = [r[1] for r in conn.execute("PRAGMA table_info(entries)")]
        if cols != ["op", "key", "entry", "updated"]:
            raise _Foreign(f"table 'entries' has columns {cols}")
    except (sqlite3.DatabaseError, _Foreign) as e:
        conn.close()
        raise _Foreign(str(e)) from None
    return conn


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _move_aside(path: Path, why: str) -> None:
    """Rename ``path`` (and its WAL files) to ``<name>.corrupt-<time>``, under a lock; never delete it."""
    with filelock.FileLock(f"{path}.lock"):
        try:
            with contextlib.closing(_open(path)):
                return  # another process rebuilt it meanwhile
        except _Foreign:
            pass
        stamp = time.time_ns()
        for suffix in ("", "-wal", "-shm"):
            src = path.with_name(path.name + suffix)
            if os.path.lexists(src):
                os.replace(src, path.with_name(f"{path.name}{suffix}.corrupt-{stamp}"))
    warn_once(f"flyreg: the scratch cache {path} is unusable ({why}); moved it aside as "
              f"{path.name}.corrupt-{stamp} and started a new one", key=f"cache-aside:{path}:{stamp}")


def _connection(create: bool) -> sqlite3.Connection | None:
    """This thread's connection to the current cache database; None when absent and ``create`` is false."""
    path = database()
    conns: dict[tuple[int, Path], sqlite3.Connection] = getattr(_local, "conns", None) or {}
    _local.conns = conns
    key = (os.getpid(), path)
    conn = conns.get(key)
    if conn is not None:
        if path.is_file():
            return conn
        conns.pop(key).close()  # deleted or replaced under us (cache clear, a test): reopen
    if not create and not os.path.lexists(path):
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = _open(path)
    except _Foreign as e:
        _move_aside(path, str(e))
        conn = _open(path)
    conns[key] = conn
    return conn


def _decode(path: Path, op: str, key: str, text: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(text)
    except (ValueError, RecursionError) as e:
        warn_once(f"flyreg: ignoring a corrupt entry of op {op!r} in {path}: {e}", key=f"bad-entry:{path}:{op}:{key}")
        return None
    return entry if isinstance(entry, dict) else None


def _read(sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    try:
        conn = _connection(create=False)
        return [] if conn is None else conn.execute(sql, params).fetchall()
    except sqlite3.DatabaseError as e:  # damaged after opening: warn, serve nothing from it
        warn_once(f"flyreg: cannot read the scratch cache {database()}: {e}; ignoring it", key=f"cache-read:{e}")
        return []


def get(op: str, key: str) -> dict[str, Any] | None:
    """The entry of ``op`` under ``key``, or None; one indexed read, never raises on a bad database."""
    rows = _read("SELECT entry FROM entries WHERE op = ? AND key = ?", (op, key))
    return _decode(database(), op, key, rows[0][0]) if rows else None


def load(op: str) -> dict[str, dict[str, Any]]:
    """Every entry of ``op``, key -> entry (for listing and lookups by spec; a call uses :func:`get`)."""
    out = {}
    for key, text in _read("SELECT key, entry FROM entries WHERE op = ? ORDER BY key", (op,)):
        entry = _decode(database(), op, key, text)
        if entry is not None:
            out[key] = entry
    return out


def counts() -> dict[str, int]:
    """Entries per op in the current cache database."""
    return {op: n for op, n in _read("SELECT op, COUNT(*) FROM entries GROUP BY op ORDER BY op", ())}


def store(op: str, key: str, entry: dict[str, Any]) -> Path:
    """Add (or replace) ``entry`` under ``key`` for ``op``: one small transaction; returns the database."""
    text = json.dumps(entry, sort_keys=True)
    conn = _connection(create=True)
    assert conn is not None
    with _transaction(conn):
        conn.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?)", (op, key, text, time.time()))
    return database()


def clear(op: str | None = None) -> int:
    """Delete ``op``'s entries, or every op's, and the temp files killed writers left; returns entries removed.

    Anything else in the cache directory (a user's file, a database moved aside) is left alone.
    """
    remove_abandoned_temps(cache_dir())
    conn = _connection(create=False)
    if conn is None:
        return 0
    with _transaction(conn):
        if op is None:
            cur = conn.execute("DELETE FROM entries")
        else:
            cur = conn.execute("DELETE FROM entries WHERE op = ?", (op,))
    return cur.rowcount


def close() -> None:
    """Close this thread's connections (tests; a process's connections close at exit)."""
    for conn in (getattr(_local, "conns", None) or {}).values():
        conn.close()
    _local.conns = {}
