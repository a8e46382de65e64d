"""The tuning journal: every measurement a search takes (or the failure in its place), appended as taken.

One SQLite database beside the scratch cache (``flyreg-journal.sqlite3``), safe under concurrent
writers. A search asks it first for what is already measured for the same op, spec, device,
toolchain and timing method, and times only the rest: an interrupted tune run again re-times
nothing. Reports and regret measurements read it. A corrupt or foreign file is moved aside with a
warning and a new journal starts.

Every row is validated as it is read (:class:`Measurement`'s validators, on texts read at most
:data:`MAX_JSON_CHARS` and :data:`MAX_ERROR_CHARS` long): a row another program wrote, with a
negative or text median, a nested config or a huge error text, is skipped with one warning per
journal, and never ranks. A failure's text is cut to :data:`MAX_ERROR_CHARS` when it is written.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from flyreg._artifacts.cache import cache_dir
from flyreg._core.config import Config, JSONScalar
from flyreg._core.fileio import warn_once
from flyreg._core.spec import spec_text
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


#: The longest failure text a row may hold (a failure's reason with its output's tail fits).
MAX_ERROR_CHARS = 16384
#: The longest JSON text (spec, config, device, toolchain) a row may hold.
MAX_JSON_CHARS = 65536
#: The columns read back, each text cut one past its limit so an over-long one is seen, never loaded whole.
_READ = ", ".join([*(f"substr({c}, 1, {MAX_JSON_CHARS + 1})" if c in ("spec", "config", "device", "toolchain")
                     else f"substr({c}, 1, {MAX_ERROR_CHARS + 1})" if c == "error" else c for c in COLUMNS)])


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
        return (self.op, spec_text(self.spec), _text(dict(self.device)), _text(dict(self.toolchain)), self.timing)


@attrs.frozen
class Machine:
    """Where a search measures: the device identity and the toolchain its configs depend on (the scratch
    cache's key holds the same)."""

    device: Mapping[str, str]
    toolchain: Mapping[str, str]

    def context(self, op: str, spec: Mapping[str, JSONScalar], timing: str) -> Context:
        return Context(op, spec, self.device, self.toolchain, timing)


def _finite(minimum: float) -> Any:
    """An attrs validator: None, or a finite real number (not a bool) >= ``minimum``."""

    def check(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < minimum:
            raise ValueError(f"{attribute.name} must be a finite number >= {minimum:g}, got {value!r:.40}")

    return check


def _reps(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"reps must be an int >= 1, got {value!r:.40}")


def _error(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not isinstance(value, str) or len(value) > MAX_ERROR_CHARS):
        raise ValueError(f"error must be a text of at most {MAX_ERROR_CHARS} characters")


def _flat(what: str, value_types: tuple[type, ...]) -> Any:
    """An attrs validator: a dict of str keys to values of ``value_types`` (JSON scalars: no nesting)."""

    def check(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, value_types)
                                                  for k, v in value.items()):
            raise ValueError(f"{what} must be a flat JSON object of scalars")

    return check


_SCALARS = (str, int, float, bool, type(None))


@attrs.frozen
class Measurement:
    """One journal row: a config's median time and spread, or the reason it failed (exactly one of them).

    Validated when made: a row read back that breaks a rule is skipped (see the module's docstring)."""

    op: str = attrs.field(validator=attrs.validators.instance_of(str))
    spec: dict[str, JSONScalar] = attrs.field(validator=_flat("spec", _SCALARS))
    config: Config = attrs.field(validator=attrs.validators.instance_of(Config))
    device: dict[str, str] = attrs.field(validator=_flat("device", _SCALARS))
    toolchain: dict[str, str] = attrs.field(validator=_flat("toolchain", _SCALARS))
    timing: str = attrs.field(validator=attrs.validators.instance_of(str))
    median_ms: float | None = attrs.field(validator=_finite(0.0))
    spread: float | None = attrs.field(validator=_finite(0.0))
    reps: int | None = attrs.field(validator=_reps)
    error: str | None = attrs.field(validator=_error)
    created: float = attrs.field(validator=_finite(0.0))

    def __attrs_post_init__(self) -> None:
        if (self.median_ms is None) == (self.error is None):
            raise ValueError("a row holds either a median (a measurement) or an error (a failure)")

    @property
    def failed(self) -> bool:
        return self.error is not None


def record(ctx: Context, config: Config, median_ms: float | None = None, spread: float | None = None,
           reps: int | None = None, error: str | None = None) -> None:
    """Append one measurement (a time, or ``error``) durably: committed when this returns."""
    if (median_ms is None) == (error is None):
        raise ValueError("record() takes either median_ms (a measurement) or error (a failure), not both or neither")
    op, spec, device, toolchain, timing = ctx.key()
    error = _cut(error)
    with DB.write() as conn:
        conn.execute("INSERT INTO measurements (op, spec, config, device, toolchain, timing, median_ms, spread, reps, "
                     "error, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (op, spec, _text(config.to_json()), device, toolchain, timing, median_ms, spread, reps, error,
                      time.time()))


def _cut(error: str | None) -> str | None:
    """``error`` cut to :data:`MAX_ERROR_CHARS`, keeping its start and its end (where a captured output's tail is)."""
    if error is None or len(error) <= MAX_ERROR_CHARS:
        return error
    half = MAX_ERROR_CHARS // 2 - 20
    return f"{error[:half]} [... {len(error) - 2 * half} characters cut ...] {error[-half:]}"


def _json(text: object, what: str) -> Any:
    if not isinstance(text, str) or len(text) > MAX_JSON_CHARS:
        raise ValueError(f"{what} must be a JSON text of at most {MAX_JSON_CHARS} characters")
    return json.loads(text)


def _row(r: tuple[Any, ...]) -> Measurement:
    """The measurement of one row; ValueError, TypeError or RecursionError when it does not validate."""
    return Measurement(r[1], _json(r[2], "spec"), Config.from_json(_json(r[3], "config")), _json(r[4], "device"),
                       _json(r[5], "toolchain"), r[6], r[7], r[8], r[9], r[10], r[11])


def _valid(rows: Iterable[tuple[Any, ...]]) -> list[Measurement]:
    """The rows that validate, in order; those that do not are skipped with one warning per journal."""
    out, bad, first = [], 0, ""
    for r in rows:
        try:
            out.append(_row(r))
        except (TypeError, ValueError, RecursionError) as e:  # written by another program: never fatal, never ranks
            bad += 1
            first = first or f"row {r[0]}: {type(e).__name__}: {str(e)[:200]}"
    if bad:
        path = database()
        warn_once(f"flyreg: the tuning journal {path} holds rows that do not validate; they are skipped "
                  f"({bad} here, the first: {first})", key=f"journal-invalid:{path}")
    return out


def _select(where: str, params: tuple[Any, ...] = ()) -> list[Measurement]:
    return _valid(DB.read(f"SELECT {_READ} FROM measurements {where} ORDER BY id", params))


def measured(ctx: Context, *others: Context) -> dict[Config, Measurement]:
    """The latest measurement of each config already journaled under ``ctx``, or under any of ``others``, which
    differ from it only in their toolchain (one indexed query; the row written last wins)."""
    op, spec, device, toolchain, timing = ctx.key()
    toolchains = list(dict.fromkeys([toolchain, *(o.key()[3] for o in others)]))
    rows = _select(f"WHERE op = ? AND spec = ? AND device = ? AND toolchain IN ({', '.join('?' * len(toolchains))}) "
                   "AND timing = ?", (op, spec, device, *toolchains, timing))
    return {m.config: m for m in rows}


def measurements(op: str | None = None) -> list[Measurement]:
    """Every journaled measurement (of ``op``), oldest first: what reports read."""
    return _select("WHERE op = ?", (op,)) if op is not None else _select("")


def ops() -> set[str]:
    """The ops the journal holds measurements of (installed or not)."""
    return {str(op) for (op,) in DB.read("SELECT DISTINCT op FROM measurements", ())}


def close() -> None:
    """Close this thread's connections (tests)."""
    DB.close()


def of_spec(op: str, spec: Mapping[str, JSONScalar]) -> list[Measurement]:
    """Every journaled measurement of ``op`` on ``spec`` (any device, toolchain and timing), oldest first."""
    return _select("WHERE op = ? AND spec = ?", (op, spec_text(spec)))


def last_id() -> int:
    """The id of the newest row (0 for an empty or absent journal): :func:`after` reads what came since."""
    rows = DB.read("SELECT MAX(id) FROM measurements")
    return int(rows[0][0] or 0) if rows else 0


def after(mark: int) -> list[Measurement]:
    """The measurements appended after the row ``mark`` (a :func:`last_id`), oldest first."""
    return _select("WHERE id > ?", (mark,))


def append(rows: Iterable[Measurement]) -> None:
    """Append measurements taken elsewhere (another process's journal) as they are, in one transaction."""
    values = [(m.op, spec_text(m.spec), _text(m.config.to_json()), _text(m.device), _text(m.toolchain), m.timing,
               m.median_ms, m.spread, m.reps, _cut(m.error), m.created) for m in rows]
    if not values:
        return
    with DB.write() as conn:
        conn.executemany("INSERT INTO measurements (op, spec, config, device, toolchain, timing, median_ms, spread, "
                         "reps, error, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", values)
