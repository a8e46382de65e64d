"""What flyreg keeps on disk, read as its documented formats: the tuning journal, the scratch cache, artifacts.

The tests read these files the way a user's tool would (``sqlite3`` opened read-only, JSON), never
through flyreg's internals; docs/autotune_guide.md and docs/cli.md describe the formats.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flyreg import Config

JOURNAL = "flyreg-journal.sqlite3"
SCRATCH_CACHE = "flyreg-cache.sqlite3"


def cache_dir() -> Path:
    """The cache dir the tests point ``FLYREG_CACHE_DIR`` at."""
    return Path(os.environ["FLYREG_CACHE_DIR"])


def _rows(path: Path, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if not path.exists():
        return []
    with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as conn:
        return conn.execute(query, params).fetchall()


def journal_rows(op: str | None = None) -> list[dict[str, Any]]:
    """The journal's measurements (of ``op``), oldest first; JSON columns parsed, ``config`` a :class:`Config`."""
    where, params = ("WHERE op = ?", (op,)) if op is not None else ("", ())
    columns = ("op", "spec", "config", "device", "toolchain", "timing", "median_ms", "spread", "reps", "error", "created")
    out = []
    for row in _rows(cache_dir() / JOURNAL, f"SELECT {', '.join(columns)} FROM measurements {where} ORDER BY id", params):
        m = dict(zip(columns, row))
        for k in ("spec", "device", "toolchain"):
            m[k] = json.loads(m[k])
        m["config"] = Config.from_json(json.loads(m["config"]))
        out.append(m)
    return out


def first_round(rows: list[dict[str, Any]], timing: str = "cpu") -> list[dict[str, Any]]:
    """The rows of ``timing``'s first round (not the final round's re-times)."""
    return [m for m in rows if m["timing"] == timing]


def read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def write_json(path: str | os.PathLike[str], data: dict[str, Any]) -> Path:
    path = Path(path)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def cache_entries(op: str | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """The scratch cache's entries (of ``op``): (op, key) -> the entry's JSON object."""
    where, params = ("WHERE op = ?", (op,)) if op is not None else ("", ())
    rows = _rows(cache_dir() / SCRATCH_CACHE, f"SELECT op, key, entry FROM entries {where} ORDER BY op, key", params)
    return {(o, k): json.loads(e) for o, k, e in rows}


#: Python source that ends a writer script: ``work(worker)`` runs in WORKERS forks of the script's process
#: (so torch is imported once), "ready" is printed once they are started, and the process exits 0 when
#: every fork returned. The script defines ``workers`` and ``work`` before it.
RUN_FORKS = """
import os as _os, sys as _sys
_pids = []
for _worker in range(workers):
    _pid = _os.fork()
    if _pid == 0:
        _code = 1
        try:
            work(_worker)
            _code = 0
        finally:
            _os._exit(_code)
    _pids.append(_pid)
print("ready", flush=True)
_sys.exit(max(_os.waitstatus_to_exitcode(_os.waitpid(p, 0)[1]) != 0 for p in _pids))
"""


def journal_times(op: str, times: Mapping[Config, float | str], *, final: bool = False, spread: float = 0.0,
                  reps: int = 3) -> None:
    """Append to the journal a measurement of each config of ``times`` (a median in ms, or a failure's text)
    in the context of ``op``'s latest first-round measurement (same spec, device, toolchain), of the first
    round or, with ``final``, of the final round. A search of that context that resumes reads them as its
    timings, the latest of a config winning (docs/autotune_guide.md)."""
    path = cache_dir() / JOURNAL
    with sqlite3.connect(path) as conn:
        context = conn.execute("SELECT op, spec, device, toolchain, timing FROM measurements WHERE op = ? AND "
                               "timing NOT LIKE '% final %' ORDER BY id DESC LIMIT 1", (op,)).fetchone()
        assert context is not None, f"op {op!r} has no measurement to take the context of"
        timing = f"{context[4]} final x8" if final else context[4]
        for config, t in times.items():
            text = json.dumps(config.to_json(), sort_keys=True, separators=(",", ":"))
            timed = not isinstance(t, str)
            conn.execute("INSERT INTO measurements (op, spec, config, device, toolchain, timing, median_ms, spread, "
                         "reps, error, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (*context[:2], text, *context[2:4], timing, t if timed else None, spread if timed else None,
                          reps if timed else None, None if timed else t, time.time()))
    conn.close()


def latest_cache_key(op: str) -> str:
    """The key of ``op``'s entry stored last."""
    rows = _rows(cache_dir() / SCRATCH_CACHE, "SELECT key FROM entries WHERE op = ? ORDER BY updated DESC LIMIT 1",
                 (op,))
    assert rows, f"op {op!r} has no scratch-cache entry"
    return str(rows[0][0])
