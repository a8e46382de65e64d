"""The scratch disk cache: one JSON file per op, merged under a file lock."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import filelock

from flyreg._core import settings
from flyreg._core.fileio import warn_once, write_json_atomic
from flyreg._artifacts.store import name_part

SCHEMA = 1


def cache_dir() -> Path:
    """``FLYREG_CACHE_DIR`` (expanded) if set, else the user's cache dir; the environment's current value."""
    return settings.current().cache_dir


def cache_file(op: str) -> Path:
    """The scratch cache file of ``op``; distinct ops never share one (``a/b`` and ``a_b`` differ)."""
    return cache_dir() / f"{name_part(op)}.json"


def _parse(text: str) -> dict[str, Any]:
    """The content of a flyreg cache file of this schema; ``ValueError`` for anything else."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("entries"), dict):
        raise ValueError("not a flyreg cache file of schema 1")
    return data


def _read(path: Path, op: str | None = None) -> dict[str, Any] | None:
    """The entries of ``path``; ``{}`` when absent, ``None`` (with a warning) when corrupt or of another op.

    With ``op``, a file whose ``"op"`` field names another op is not this op's cache (a file
    written by hand, or by a flyreg that gave two ops one file name) and is ignored like a
    corrupt one.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        warn_once(f"flyreg: cannot read cache file {path}: {e}; ignoring it")
        return None
    try:
        data = _parse(text)
    except (ValueError, RecursionError) as e:
        warn_once(f"flyreg: ignoring corrupt cache file {path}: {e}", key=f"corrupt:{path}:{len(text)}")
        return None
    if op is not None and "op" in data and data["op"] != op:
        warn_once(f"flyreg: ignoring cache file {path}: it holds the entries of op {data.get('op')!r}, "
                  f"not {op!r}", key=f"other-op:{path}:{op}")
        return None
    return {k: v for k, v in data["entries"].items() if isinstance(v, dict)}


def _is_cache_file(path: Path) -> bool:
    """True when ``path`` is a flyreg cache file of this schema (read quietly: no warning)."""
    try:
        _parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return True


def load(op: str) -> dict[str, dict[str, Any]]:
    """All entries of ``op``'s cache file, key -> entry; never raises on a bad file."""
    return _read(cache_file(op), op) or {}


def store(op: str, key: str, entry: dict[str, Any]) -> Path:
    """Add ``entry`` under ``key`` to ``op``'s cache file, keeping every other process's entries.

    A corrupt file, or one holding another op's entries, is moved aside (``.corrupt-<time>``),
    never overwritten.
    """
    path = cache_file(op)
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(f"{path}.lock"):
        entries = _read(path, op)
        if entries is None:
            os.replace(path, path.with_name(f"{path.name}.corrupt-{time.time_ns()}"))
            entries = {}
        entries[key] = entry
        write_json_atomic(path, {"schema": SCHEMA, "op": op, "entries": entries})
    return path


def clear(op: str | None = None) -> list[Path]:
    """Delete ``op``'s cache file, or every op's; returns the files removed.

    Only flyreg cache files are deleted: anything else in the cache directory (a user's
    ``notes.json``, a corrupt file, a file moved aside) is left alone. Lock files stay, as
    filelock expects: deleting one another process may be waiting on would break its lock.
    """
    directory = cache_dir()
    if op is not None:
        paths = [cache_file(op)]
    else:
        try:
            paths = sorted(p for p in directory.glob("*.json") if p.is_file())
        except OSError:
            paths = []
    removed = []
    for p in paths:
        if not _is_cache_file(p):  # absent (no lock file is made for it), or not ours
            continue
        with filelock.FileLock(f"{p}.lock"):
            if not _is_cache_file(p):  # deleted or replaced by another process meanwhile
                continue
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return removed
