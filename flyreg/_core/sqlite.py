"""One SQLite database file flyreg owns: WAL, per-thread connections, and nothing it does not own touched.

What is at a database's path (or at its ``-wal``, ``-shm`` and ``-journal`` companions) decides:

- nothing: a database is created there, on the first write;
- a regular file holding a database of the schema, or an empty one: it is read and written;
- anything else: a regular file that is not such a database (corrupt, another program's), a
  symbolic link (wherever it points), a FIFO, a device, a directory, a socket. It is never opened
  as a database nor written through. It is checked (``lstat``, and a read-only open of a regular
  file) before any connection writes, so another database's journal mode is never switched.
  A *scratch* database (the cache, the journal) renames it and its companions to
  ``<name>.corrupt-<time>`` in the same directory (a link is renamed, never followed) and starts
  a new one; a database that is not scratch (the serving record) is refused (:class:`Unusable`).

A scratch database never raises from a read or a write: when its directory is read-only, when
another process holds its write lock past :data:`BUSY_TIMEOUT`, or when the file cannot be moved
aside, reads get what can be read (or nothing) and writes are dropped, each with one warning.
Readers never take the write lock, and a busy database is never taken for a corrupt one.
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

#: How long a connection waits for a lock another process holds before giving up (seconds).
BUSY_TIMEOUT = 10.0
#: How long moving a file aside waits for ``<name>.lock``, which another process moving it aside holds.
LOCK_TIMEOUT = 2.0
#: The files SQLite keeps beside a database, by suffix.
COMPANIONS = ("-wal", "-shm", "-journal")


class Foreign(Exception):
    """The file at a database path is not one of ours of this schema."""


class Busy(Exception):
    """Another process held a lock on the database for longer than :data:`BUSY_TIMEOUT`."""


class Unusable(OSError):
    """A database flyreg will not open or cannot write: one line saying why."""


def _errorname(e: sqlite3.Error) -> str:
    name = getattr(e, "sqlite_errorname", None)
    if name is not None:
        return str(name)
    text = str(e)  # Python 3.10: no error name
    return "SQLITE_BUSY" if "locked" in text else "SQLITE_NOTADB" if "not a database" in text else "SQLITE_ERROR"


def _is_busy(e: sqlite3.Error) -> bool:
    return _errorname(e).startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))


def _is_foreign(e: sqlite3.Error) -> bool:
    return _errorname(e).startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT"))


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


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "another kind of file"


def _reads_data(path: Path) -> bool:
    """Whether a file of size 0 yields bytes when read (a ``/proc`` or ``/sys`` file does)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return True  # unreadable: not a plain empty file either
    try:
        return bool(os.read(fd, 1))
    except OSError:
        return True
    finally:
        os.close(fd)


def not_plain(path: Path) -> str | None:
    """Why what is at ``path`` or its companions is not a plain file a database may be opened from, or None
    (nothing there counts as plain). Looks with ``lstat``: a symbolic link is never followed."""
    for suffix in ("", *COMPANIONS):
        where = path.with_name(path.name + suffix)
        try:
            info = os.lstat(where)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{where.name} cannot be examined ({e.strerror})"
        if not stat.S_ISREG(info.st_mode):
            return f"{where.name} is not a regular file but {_kind(info.st_mode)}"
        if not suffix and info.st_size == 0 and _reads_data(where):
            return f"{where.name} is not a regular file (it reports size 0 but reads data)"
    return None


def _check_schema(conn: sqlite3.Connection, schema: Schema) -> bool:
    """Whether ``conn``'s database holds ``schema`` (True) or nothing yet (False); :class:`Foreign` otherwise.
    Reads only: no lock beyond a reader's."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return False
    ours = {"meta", *schema.tables}
    if tables != ours:
        raise Foreign(f"it holds the tables {sorted(tables)}, not flyreg's")
    row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
    if row is None or row[0] != f"{schema.what}/{schema.version}":
        raise Foreign(f"schema {row[0] if row else None}, expected {schema.what}/{schema.version}")
    for table, columns in schema.tables.items():
        have = tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))
        if have != columns:
            raise Foreign(f"table {table!r} has columns {list(have)}")
    return True


def _create_schema(conn: sqlite3.Connection, schema: Schema) -> None:
    with transaction(conn):
        if _check_schema(conn, schema):  # another process created it meanwhile
            return
        conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        for ddl in schema.ddl:
            conn.execute(ddl)
        conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (f"{schema.what}/{schema.version}",))


def writable(path: Path) -> bool:
    """Whether this process may create and write the database ``path`` (its directory and the file, if any)."""
    directory = path.parent
    if not os.access(directory, os.W_OK | os.X_OK):
        return False
    return not os.path.lexists(path) or os.access(path, os.W_OK)


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection, on a read-only file system too (where a WAL database's ``-shm`` cannot be
    made, the file is read as immutable: nothing can write it there)."""
    uri = path.absolute().as_uri()
    for query in ("mode=ro", "mode=ro&immutable=1"):
        conn = sqlite3.connect(f"{uri}?{query}", uri=True, timeout=BUSY_TIMEOUT, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError as e:
            conn.close()
            if not _errorname(e).startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY")) or "immutable" in query:
                raise
    raise AssertionError("unreachable")


def open_database(path: Path, schema: Schema, write: bool) -> sqlite3.Connection | None:
    """A connection to ``path`` with ``schema`` in place: opened for writing (the database created if
    absent) with ``write``, else read-only; None when reading and there is no database yet.

    :class:`Foreign` when what is there is not ours, :class:`Busy` when another process holds it past
    :data:`BUSY_TIMEOUT`; nothing is written before the file is known to be ours (or empty).
    """
    why = not_plain(path)
    if why is not None:
        raise Foreign(why)
    if not write and not os.path.lexists(path):
        return None
    conn: sqlite3.Connection | None = None
    try:
        if write:
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
        else:
            conn = _connect_read_only(path)
        ours = _check_schema(conn, schema)
        if write:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")  # the file is ours or empty: never another's
            conn.execute("PRAGMA synchronous=NORMAL")
            if not ours:
                _create_schema(conn, schema)
        elif not ours:
            conn.close()
            return None
    except (sqlite3.Error, Foreign) as e:
        if conn is not None:
            conn.close()
        if isinstance(e, sqlite3.Error) and _is_busy(e):
            raise Busy(str(e)) from None
        if isinstance(e, Foreign) or _is_foreign(e):
            raise Foreign(str(e)) from None
        raise
    return conn


def check(path: Path, schema: Schema) -> None:
    """:class:`Foreign` when what is at ``path`` is neither absent, nor empty, nor a database of ``schema``.
    Reads only; a busy or unreadable file gives no verdict."""
    try:
        conn = open_database(path, schema, write=False)
    except (Busy, sqlite3.Error):
        return
    if conn is not None:
        conn.close()


def move_aside(path: Path, schema: Schema, why: str) -> str | None:
    """Rename ``path`` and its companions to ``<name>.corrupt-<time>`` under ``<name>.lock``, never deleting or
    following anything; None when done (or another process did it), else why it could not be."""
    lock = path.with_name(path.name + ".lock")
    bad = not_plain(lock)
    if bad is not None:
        return bad
    try:
        with filelock.FileLock(str(lock), timeout=LOCK_TIMEOUT):
            try:
                check(path, schema)
                return None  # another process moved it aside meanwhile
            except Foreign:
                pass
            stamp = time.time_ns()
            for suffix in ("", *COMPANIONS):
                src = path.with_name(path.name + suffix)
                if os.path.lexists(src):
                    os.replace(src, path.with_name(f"{path.name}{suffix}.corrupt-{stamp}"))
    except filelock.Timeout:
        return f"another process holds {lock.name}"
    except OSError as e:
        return f"it cannot be moved aside ({e.strerror or e})"
    warn_once(f"flyreg: the {schema.what} {path} is unusable ({why}); moved it aside as "
              f"{path.name}.corrupt-{stamp} and started a new one", key=f"aside:{path}:{stamp}")
    return None


class Database:
    """The database at ``locate()`` (re-read on every use, so a changed directory setting is followed).

    A ``scratch`` database (the default) never raises from :meth:`read` or :meth:`write`: what it cannot
    do it skips with one warning, and it moves aside what is not its own. One that is not scratch (a
    serving record) moves nothing and raises :class:`Unusable` instead.
    """

    def __init__(self, locate: Callable[[], Path], schema: Schema, scratch: bool = True) -> None:
        self.locate = locate
        self.schema = schema
        self.scratch = scratch
        self._local = threading.local()

    def _conns(self) -> dict[tuple[int, Path, bool], tuple[sqlite3.Connection, tuple[int, int]]]:
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        return conns

    def _open(self, path: Path, write: bool) -> sqlite3.Connection | None:
        """A new connection; a foreign file moved aside first (scratch) or :class:`Unusable`."""
        try:
            return open_database(path, self.schema, write)
        except Foreign as e:
            if not self.scratch:
                raise Unusable(f"{path} is not a {self.schema.what} flyreg may write ({e}); "
                               "left as it is") from None
            if not writable(path):
                raise Unusable(f"the {self.schema.what} {path} is unusable ({e}) and its directory is "
                               "read-only") from None
            cannot = move_aside(path, self.schema, str(e))
            if cannot is not None:
                raise Unusable(f"the {self.schema.what} {path} is unusable ({e}), and {cannot}") from None
            return open_database(path, self.schema, write)

    def connection(self, create: bool) -> sqlite3.Connection | None:
        """This thread's connection (a writer's with ``create``, else a reader's); None when there is no
        database and ``create`` is false. Raises :class:`Foreign`, :class:`Busy`, :class:`Unusable`
        or ``sqlite3.Error``."""
        path = self.locate()
        conns = self._conns()
        key = (os.getpid(), path, create)
        held = conns.get(key)
        if held is not None:
            try:
                info = os.lstat(path)
                same = stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) == held[1]
            except OSError:
                same = False
            if same:
                return held[0]
            conns.pop(key)[0].close()  # deleted or replaced under us: open again
        if create and not writable(path):
            path.parent.mkdir(parents=True, exist_ok=True)  # an absent dir is made; a read-only one raises
            if not writable(path):
                raise Unusable(f"the {self.schema.what} {path} is read-only here")
        elif create:
            path.parent.mkdir(parents=True, exist_ok=True)
        conn = self._open(path, create)
        if conn is None:
            return None
        info = os.lstat(path)
        conns[key] = (conn, (info.st_dev, info.st_ino))
        return conn

    def _why(self, e: BaseException) -> str:
        """One line: why the database could not be read or written."""
        if isinstance(e, Unusable):
            return str(e)
        path = self.locate()
        if isinstance(e, Busy) or (isinstance(e, sqlite3.Error) and _is_busy(e)):
            return f"the {self.schema.what} {path} is busy: another process held it for more than {BUSY_TIMEOUT:g} s"
        text = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return f"cannot use the {self.schema.what} {path}: {text}"

    def _failed(self, e: BaseException, strict: bool, doing: str) -> None:
        """Raise :class:`Unusable` (``strict``), else warn once that this read or write is skipped."""
        why = self._why(e)
        if strict:
            raise Unusable(why) from None
        warn_once(f"flyreg: {why}; {doing}", key=f"skip:{self.schema.what}:{doing}:{why}")

    def read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of a query; ``[]`` when there is no database. Takes no write lock. A scratch database that is
        busy, damaged or unusable gives ``[]`` with one warning; another raises :class:`Unusable`."""
        try:
            conn = self.connection(create=False)
            return [] if conn is None else conn.execute(sql, params).fetchall()
        except (sqlite3.Error, Busy, OSError) as e:
            self._failed(e, not self.scratch, "reading nothing from it")
            return []

    @contextlib.contextmanager
    def write(self, strict: bool | None = None) -> Iterator[sqlite3.Connection]:
        """A connection inside one write transaction (the database is created if absent).

        Not ``strict`` (a scratch database's default), a write that cannot be made (a read-only
        directory, a busy or unusable database) warns once and goes to a throwaway in-memory
        database instead; ``strict`` (the default of one that is not scratch), it raises
        :class:`Unusable` saying why.
        """
        strict = not self.scratch if strict is None else strict
        conn = self._begin(strict)
        if conn is None:
            with contextlib.closing(sqlite3.connect(":memory:", isolation_level=None)) as sink:
                for ddl in self.schema.ddl:
                    sink.execute(ddl)
                yield sink
            return
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            self._failed(e, strict, "this write is dropped")

    def _begin(self, strict: bool) -> sqlite3.Connection | None:
        """This thread's writer inside ``BEGIN IMMEDIATE``; None when the write is skipped (not ``strict``)."""
        try:
            conn = self.connection(create=True)
            assert conn is not None
            conn.execute("BEGIN IMMEDIATE")
            return conn
        except (sqlite3.Error, Busy, OSError) as e:
            self._failed(e, strict, "this write is dropped")
            return None

    def close(self) -> None:
        """Close this thread's connections (tests; a process's connections close at exit)."""
        for conn, _ in self._conns().values():
            conn.close()
        self._local.conns = {}
