"""The serving record's file: which config source served each spec, and how many calls, across processes.

One SQLite database (WAL) that any number of processes add to at once: each flush is one
transaction adding its calls to the row of its (op, spec, device, source, origin, nearest).
flyreg writes only a record it made, an empty regular file, or where nothing is: anything else at
the path (a device such as ``/dev/null``, a FIFO, a directory, a ``/proc`` file, a symbolic link,
a file that is not a record) is refused (:func:`refusal`), never renamed, replaced or opened for
writing. Read (``flyreg tune --from-record``, ``flyreg check --against-record``), it is an error.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from flyreg._core.config import JSONScalar
from flyreg._core.keys import DeviceIdentity
from flyreg._core.spec import spec_text
from flyreg._core.sqlite import Database, Foreign, Schema, check, not_plain

COLUMNS = ("op", "spec", "device", "source", "origin", "nearest", "path", "config", "calls", "first_seen",
           "last_seen")
SCHEMA = Schema("serving record", 1, {"served": COLUMNS}, (
    "CREATE TABLE IF NOT EXISTS served (op TEXT NOT NULL, spec TEXT NOT NULL, device TEXT NOT NULL, "
    "source TEXT NOT NULL, origin TEXT NOT NULL, nearest INTEGER NOT NULL, path TEXT, config TEXT, "
    "calls INTEGER NOT NULL, first_seen REAL NOT NULL, last_seen REAL NOT NULL, "
    "PRIMARY KEY (op, spec, device, source, origin, nearest))",
))
_ADD = (f"INSERT INTO served ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
        "ON CONFLICT (op, spec, device, source, origin, nearest) DO UPDATE SET calls = calls + excluded.calls, "
        "path = excluded.path, config = excluded.config, last_seen = excluded.last_seen")


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@attrs.frozen
class Served:
    """One row of a record: ``calls`` calls of ``op`` with ``spec`` on ``device`` served by ``source``.

    ``source`` is where the first resolution of a call key found its config (``memory``, ``cache``,
    ``offline``, ``default``, ``search``); ``origin`` where that config came from (a ``memory``
    hit's origin is the earlier resolution's); ``nearest`` that an artifact tuned for a
    neighbouring spec served it; ``path`` the artifact or cache file, ``config`` the config served.
    """

    op: str
    spec: dict[str, JSONScalar]
    device: DeviceIdentity
    source: str
    origin: str
    nearest: bool
    path: str | None
    config: dict[str, Any] | None
    calls: int
    first_seen: float = 0.0
    last_seen: float = 0.0

    @property
    def untuned(self) -> bool:
        """Served by the op's default or by an artifact tuned for another spec: what tuning it would change."""
        return self.origin == "default" or (self.origin == "offline" and self.nearest)

    def row(self) -> tuple[Any, ...]:
        return (self.op, spec_text(self.spec), _text(self.device.to_json()), self.source, self.origin, int(self.nearest),
                self.path, _text(self.config) if self.config is not None else None, self.calls, self.first_seen,
                self.last_seen)


def refusal(path: Path) -> str | None:
    """Why flyreg will not write a serving record at ``path``, or None: it writes only a record, an empty
    regular file, or where nothing is (looked at without following a link or writing anything)."""
    why = not_plain(path)
    if why is None:
        try:
            check(path, SCHEMA)
        except Foreign as e:
            why = f"it is not a serving record ({e})"
    return None if why is None else f"{path}: {why}"


def add(path: Path, served: Iterable[Served]) -> None:
    """Add the calls of ``served`` to the record at ``path`` (created if absent), in one transaction;
    :class:`~flyreg._core.sqlite.Unusable` when what is there is not a record or cannot be written."""
    rows = [s.row() for s in served]
    if not rows:
        return
    db = Database(lambda: path, SCHEMA, scratch=False)
    try:
        with db.write() as conn:
            conn.executemany(_ADD, rows)
    finally:
        db.close()


class NotARecord(ValueError):
    """A file given as a serving record that is not one."""


def read(path: str | os.PathLike[str]) -> list[Served]:
    """Every row of the record at ``path``, by op, spec and device (none from an empty file). Raises
    FileNotFoundError when there is no file and :class:`NotARecord` when the file is not a serving
    record; changes nothing on disk."""
    where = Path(path)
    if not where.exists():
        raise FileNotFoundError(2, "no serving record (nothing recorded there yet?)", str(where))
    why = not_plain(where.resolve())  # a link the user named is followed: reading writes nothing
    if why is not None:
        raise NotARecord(f"{where} is not a serving record: {why}")
    try:
        with contextlib.closing(sqlite3.connect(f"{where.absolute().as_uri()}?mode=ro", uri=True)) as conn:
            if not conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]:
                return []  # empty, or being created by a first writer: nothing recorded yet
            row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
            if row is None or row[0] != f"{SCHEMA.what}/{SCHEMA.version}":
                raise NotARecord(f"{where} is not a serving record: schema {row[0] if row else None!r}")
            rows = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM served ORDER BY op, spec, device").fetchall()
    except sqlite3.DatabaseError as e:
        raise NotARecord(f"{where} is not a serving record: {e}") from None
    return [s for s in map(_served, rows) if s is not None]


def _served(r: tuple[Any, ...]) -> Served | None:
    try:
        spec, device = json.loads(r[1]), json.loads(r[2])
        if not isinstance(spec, dict) or not isinstance(device, dict):
            return None
        return Served(r[0], spec, DeviceIdentity(device["name"], device["arch"]), r[3], r[4],
                      bool(r[5]), r[6], json.loads(r[7]) if r[7] else None, int(r[8]), float(r[9]), float(r[10]))
    except (TypeError, ValueError, KeyError):  # a row written by hand: skipped
        return None
