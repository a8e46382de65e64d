"""What flyreg keeps on disk, read as its documented formats: the tuning journal, the scratch cache, artifacts.

The tests read these files the way a user's tool would (``sqlite3`` opened read-only, JSON), never
through flyreg's internals; docs/autotune_guide.md and docs/cli.md describe the formats.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from flyreg import Config, DeviceIdentity

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


def record_calls(path: Path) -> dict[str, int]:
    """Calls per op in the serving record at ``path`` (its table ``served``); none while it has no table yet."""
    try:
        rows = _rows(path, "SELECT op, SUM(calls) FROM served GROUP BY op")
    except sqlite3.OperationalError:  # being created by its first writer
        return {}
    return {op: int(n) for op, n in rows}


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


@contextlib.contextmanager
def elsewhere_cache() -> Iterator[None]:
    """Within it, searches keep their scratch-cache entries and journal in a directory of their own."""
    with tempfile.TemporaryDirectory() as scratch:
        saved = os.environ.get("FLYREG_CACHE_DIR")
        os.environ["FLYREG_CACHE_DIR"] = scratch
        try:
            yield
        finally:
            if saved is None:
                del os.environ["FLYREG_CACHE_DIR"]
            else:
                os.environ["FLYREG_CACHE_DIR"] = saved


def emit(directory: str | os.PathLike[str], op: str, spec: Mapping[str, Any], config: Config,
         op_version: str = "0", device: str = "cpu") -> Path:
    """The artifact of ``config`` for ``(op, spec)`` on this machine's ``device``, written into ``directory`` by a
    real search (of that one config) as any emission writes it; the search leaves no scratch-cache entry behind."""
    import torch

    import flyreg

    with elsewhere_cache():
        tuner = flyreg.autotune_builder(op, lambda c, s: (lambda x: x), lambda x: dict(spec), [config],
                                        version=op_version, build_cache=flyreg.BuildCache(), warmup=0, rep=1)
        return Path(str(tuner.tune(torch.zeros(1, device=device), out_dir=directory).artifact))


@functools.cache
def _this_machine() -> tuple[tuple[str, str], tuple[tuple[str, str], ...]]:
    with tempfile.TemporaryDirectory() as out:
        data = read_json(emit(out, "on_disk_probe", {"n": 1}, Config({"K": 1})))
    toolchain = {k: v for k, v in data["provenance"]["toolchain"].items() if k != "op"}
    return (data["device"]["name"], data["device"]["arch"]), tuple(sorted(toolchain.items()))


def this_device() -> DeviceIdentity:
    """The identity of this machine's CPU, as its artifacts record it."""
    return DeviceIdentity(*_this_machine()[0])


def this_toolchain(op_version: str) -> dict[str, str]:
    """The toolchain an artifact tuned here now records, with the op's version."""
    return {**dict(_this_machine()[1]), "op": op_version}


def artifact_name(op: str, spec: Mapping[str, Any], device_name: str) -> str:
    """The documented artifact filename, ``op,<axis>=<value>,...,device_name=<name>.json`` (axes sorted), for
    parts that are already filename-safe (ints, bools and plain names)."""
    def part(value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value)
        assert text and all(c.isascii() and (c.isalnum() or c in "._-") for c in text) and not text.startswith("."), \
            f"{value!r} is not a plain filename part"
        assert not isinstance(value, str) or not _reads_as_json(value), f"{value!r} would read as a number"
        return text

    axes = [f"{part(k)}={part(v)}" for k, v in sorted(spec.items())]
    return ",".join([part(op), *axes, f"device_name={part(device_name)}"]) + ".json"


def _reads_as_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def write_artifact(directory: str | os.PathLike[str], op: str, spec: Mapping[str, Any], config: Config, *,
                   device: DeviceIdentity | None = None, op_version: str = "0",
                   toolchain: Mapping[str, str] | None = None, name: str | None = None) -> Path:
    """Write an artifact in the documented format (docs/autotune_guide.md), current on this machine unless
    ``toolchain`` says otherwise; named for its content unless ``name`` is given. Returns its path."""
    device = device if device is not None else this_device()
    path = Path(directory) / (name if name is not None else artifact_name(op, spec, device.name))
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_json(path, {
        "schema": 1, "op": op, "spec": dict(spec), "device": {"name": device.name, "arch": device.arch},
        "config": config.to_json(),
        "provenance": {"toolchain": dict(toolchain) if toolchain is not None else this_toolchain(op_version),
                       "flyreg": "0", "date": "2026-01-01T00:00:00+00:00", "time_ms": 1.0, "default_ms": 2.0},
    })


def rewrite_cache_entries(op: str, text: Callable[[str], str]) -> None:
    """Replace the stored text of each of ``op``'s scratch-cache entries by ``text(old)``, as a hand edit would."""
    with sqlite3.connect(cache_dir() / SCRATCH_CACHE) as conn:
        for key, old in conn.execute("SELECT key, entry FROM entries WHERE op = ?", (op,)).fetchall():
            conn.execute("UPDATE entries SET entry = ? WHERE op = ? AND key = ?", (text(old), op, key))
    conn.close()
