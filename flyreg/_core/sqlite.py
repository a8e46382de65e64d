"""One SQLite database file flyreg owns: WAL, per-thread connections, foreign files moved aside.

A file at the path that is not a database of the given schema (corrupt, another program's, not a
regular file) is renamed to ``<name>.corrupt-<time>`` with a warning and a new database starts:
nothing a user wrote is deleted, and no read or write raises because of a bad file.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import filelock

from flyreg._core.fileio import warn_once

#: How long a writer waits for another process's transaction before giving up (seconds).
BUSY_TIMEOUT = 30.0


class Foreign(Exception):
    """The file at a database path is not one of ours of this schema."""


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction, taken at once (``BEGIN IMMEDIATE``) so concurrent writers queue."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@attrs.frozen
class Schema:
    """What a database must hold: its ``tables`` (name -> column names, in order), their DDL, a version."""

    what: str
    version: int
    tables: dict[str, tuple[str, ...]]
    ddl: tuple[str, ...]


def _check_regular(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise Foreign("not a regular file")


def open_database(path: Path, schema: Schema) -> sqlite3.Connection:
    """A connection to ``path`` with ``schema`` in place; :class:`Foreign` when the file is not ours."""
    _check_regular(path)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        with transaction(conn):
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            ours = {"meta", *schema.tables}
            if tables and tables != ours:
                raise Foreign(f"it holds the tables {sorted(tables)}, not flyreg's")
            conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            for ddl in schema.ddl:
                conn.execute(ddl)
            row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema', ?)", (f"{schema.what}/{schema.version}",))
            elif row[0] != f"{schema.what}/{schema.version}":
                raise Foreign(f"schema {row[0]}, expected {schema.what}/{schema.version}")
        for table, columns in schema.tables.items():
            have = tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))
            if have != columns:
                raise Foreign(f"table {table!r} has columns {list(have)}")
    except (sqlite3.DatabaseError, Foreign) as e:
        conn.close()
        raise Foreign(str(e)) from None
    return conn


def _move_aside(path: Path, schema: Schema, why: str) -> None:
    """Rename ``path`` (and its WAL files) to ``<name>.corrupt-<time>``, under a lock; never delete it."""
    with filelock.FileLock(f"{path}.lock"):
        try:
            with contextlib.closing(open_database(path, schema)):
                return  # another process rebuilt it meanwhile
        except Foreign:
            pass
        stamp = time.time_ns()
        for suffix in ("", "-wal", "-shm"):
            src = path.with_name(path.name + suffix)
            if os.path.lexists(src):
                os.replace(src, path.with_name(f"{path.name}{suffix}.corrupt-{stamp}"))
    warn_once(f"flyreg: the {schema.what} {path} is unusable ({why}); moved it aside as "
              f"{path.name}.corrupt-{stamp} and started a new one", key=f"aside:{path}:{stamp}")


class Database:
    """The database at ``locate()`` (re-read on every use, so a changed directory setting is followed)."""

    def __init__(self, locate: Callable[[], Path], schema: Schema) -> None:
        self.locate = locate
        self.schema = schema
        self._local = threading.local()

    def connection(self, create: bool) -> sqlite3.Connection | None:
        """This thread's connection; None when the file is absent and ``create`` is false."""
        path = self.locate()
        conns: dict[tuple[int, Path], sqlite3.Connection] = getattr(self._local, "conns", None) or {}
        self._local.conns = conns
        key = (os.getpid(), path)
        conn = conns.get(key)
        if conn is not None:
            if path.is_file():
                return conn
            conns.pop(key).close()  # deleted or replaced under us: reopen
        if not create and not os.path.lexists(path):
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = open_database(path, self.schema)
        except Foreign as e:
            _move_aside(path, self.schema, str(e))
            conn = open_database(path, self.schema)
        conns[key] = conn
        return conn

    def read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of a query; ``[]`` (with a warning) when the database is absent or damaged."""
        try:
            conn = self.connection(create=False)
            return [] if conn is None else conn.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as e:
            warn_once(f"flyreg: cannot read the {self.schema.what} {self.locate()}: {e}; ignoring it",
                      key=f"read:{self.schema.what}:{e}")
            return []

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A connection inside one write transaction (the database is created if absent)."""
        conn = self.connection(create=True)
        assert conn is not None
        with transaction(conn):
            yield conn

    def close(self) -> None:
        """Close this thread's connections (tests; a process's connections close at exit)."""
        for conn in (getattr(self._local, "conns", None) or {}).values():
            conn.close()
        self._local.conns = {}
