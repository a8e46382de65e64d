"""The tuning journal: every measurement a search takes (or the failure in its place), appended as taken.

One SQLite database beside the scratch cache (``flyreg-journal.sqlite3``), safe under concurrent
writers. A search asks it first for what is already measured for the same op, spec, device,
toolchain and timing method, and times only the rest: an interrupted tune run again re-times
nothing. Reports and regret measurements read it. A corrupt or foreign file is moved aside with a
warning and a new journal starts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from flyreg._artifacts.cache import cache_dir
from flyreg._core.config import Config, JSONScalar
from flyreg._core.sqlite import Database, Schema

DB_NAME = "flyreg-journal.sqlite3"
COLUMNS = ("id", "op", "spec", "config", "device", "toolchain", "timing", "median_ms", "spread", "reps", "error",
           "created")
SCHEMA = Schema("tuning journal", 1, {"measurements": COLUMNS}, (
    "CREATE TABLE IF NOT EXISTS measurements (id INTEGER PRIMARY KEY, op TEXT NOT NULL, spec TEXT NOT NULL, "
    "config TEXT NOT NULL, device TEXT NOT NULL, toolchain TEXT NOT NULL, timing TEXT NOT NULL, median_ms REAL, "
    "spread REAL, reps INTEGER, error TEXT, created REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS measurements_key ON measurements (op, spec, device, toolchain, timing)",
))


def database() -> Path:
    """The journal of the current cache dir."""
    return cache_dir() / DB_NAME


DB = Database(database, SCHEMA)


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@attrs.frozen
class Context:
    """What makes measurements comparable: the op, its spec, the device, the toolchain, the timing method."""

    op: str
    spec: Mapping[str, JSONScalar]
    device: Mapping[str, str]
    toolchain: Mapping[str, str]
    timing: str

    def key(self) -> tuple[str, str, str, str, str]:
        return (self.op, _text(dict(self.spec)), _text(dict(self.device)), _text(dict(self.toolchain)), self.timing)


@attrs.frozen
class Machine:
    """Where a search measures: the device identity and the toolchain its configs depend on (the scratch
    cache's key holds the same)."""

    device: Mapping[str, str]
    toolchain: Mapping[str, str]

    def context(self, op: str, spec: Mapping[str, JSONScalar], timing: str) -> Context:
        return Context(op, spec, self.device, self.toolchain, timing)


@attrs.frozen
class Measurement:
    """One journal row: a config's median time and spread, or the reason it failed."""

    op: str
    spec: dict[str, JSONScalar]
    config: Config
    device: dict[str, str]
    toolchain: dict[str, str]
    timing: str
    median_ms: float | None
    spread: float | None
    reps: int | None
    error: str | None
    created: float

    @property
    def failed(self) -> bool:
        return self.error is not None


def record(ctx: Context, config: Config, median_ms: float | None = None, spread: float | None = None,
           reps: int | None = None, error: str | None = None) -> None:
    """Append one measurement (a time, or ``error``) durably: committed when this returns."""
    if (median_ms is None) == (error is None):
        raise ValueError("record() takes either median_ms (a measurement) or error (a failure), not both or neither")
    op, spec, device, toolchain, timing = ctx.key()
    with DB.write() as conn:
        conn.execute("INSERT INTO measurements (op, spec, config, device, toolchain, timing, median_ms, spread, reps, "
                     "error, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (op, spec, _text(config.to_json()), device, toolchain, timing, median_ms, spread, reps, error,
                      time.time()))


def _row(r: tuple[Any, ...]) -> Measurement | None:
    try:
        return Measurement(r[1], json.loads(r[2]), Config.from_json(json.loads(r[3])), json.loads(r[4]),
                           json.loads(r[5]), r[6], r[7], r[8], r[9], r[10], r[11])
    except (TypeError, ValueError):  # a row written by hand: skipped, never fatal
        return None


def measured(ctx: Context) -> dict[Config, Measurement]:
    """The latest measurement of each config already journaled under ``ctx`` (one indexed query)."""
    rows = DB.read(f"SELECT {', '.join(COLUMNS)} FROM measurements WHERE op = ? AND spec = ? AND device = ? AND "
                   "toolchain = ? AND timing = ? ORDER BY id", ctx.key())
    out: dict[Config, Measurement] = {}
    for r in rows:
        m = _row(r)
        if m is not None:
            out[m.config] = m
    return out


def measurements(op: str | None = None) -> list[Measurement]:
    """Every journaled measurement (of ``op``), oldest first: what reports read."""
    where, params = ("WHERE op = ?", (op,)) if op is not None else ("", ())
    rows = DB.read(f"SELECT {', '.join(COLUMNS)} FROM measurements {where} ORDER BY id", params)
    return [m for m in map(_row, rows) if m is not None]


def ops() -> set[str]:
    """The ops the journal holds measurements of (installed or not)."""
    return {str(op) for (op,) in DB.read("SELECT DISTINCT op FROM measurements", ())}


def close() -> None:
    """Close this thread's connections (tests)."""
    DB.close()


def of_spec(op: str, spec: Mapping[str, JSONScalar]) -> list[Measurement]:
    """Every journaled measurement of ``op`` on ``spec`` (any device, toolchain and timing), oldest first."""
    rows = DB.read(f"SELECT {', '.join(COLUMNS)} FROM measurements WHERE op = ? AND spec = ? ORDER BY id",
                   (op, _text(dict(spec))))
    return [m for m in map(_row, rows) if m is not None]


def last_id() -> int:
    """The id of the newest row (0 for an empty or absent journal): :func:`after` reads what came since."""
    rows = DB.read("SELECT MAX(id) FROM measurements")
    return int(rows[0][0] or 0) if rows else 0


def after(mark: int) -> list[Measurement]:
    """The measurements appended after the row ``mark`` (a :func:`last_id`), oldest first."""
    rows = DB.read(f"SELECT {', '.join(COLUMNS)} FROM measurements WHERE id > ? ORDER BY id", (mark,))
    return [m for m in map(_row, rows) if m is not None]


def append(rows: Iterable[Measurement]) -> None:
    """Append measurements taken elsewhere (another process's journal) as they are, in one transaction."""
    values = [(m.op, _text(m.spec), _text(m.config.to_json()), _text(m.device), _text(m.toolchain), m.timing,
               m.median_ms, m.spread, m.reps, m.error, m.created) for m in rows]
    if not values:
        return
    with DB.write() as conn:
        conn.executemany("INSERT INTO measurements (op, spec, config, device, toolchain, timing, median_ms, spread, "
                         "reps, error, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", values)
