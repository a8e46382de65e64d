"""The scratch disk cache: one JSON file per op, merged under a file lock."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import filelock
import platformdirs

from ._fileio import warn_once, write_json_atomic
from .keys import sanitize

SCHEMA = 1


def cache_dir() -> Path:
    """``FLYREG_CACHE_DIR`` if set, else the user's cache dir; read on every call, never pinned."""
    env = os.environ.get("FLYREG_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("flyreg", appauthor=False))


def cache_file(op: str) -> Path:
    """The scratch cache file of ``op``."""
    return cache_dir() / f"{sanitize(op)}.json"


def _read(path: Path) -> dict[str, Any] | None:
    """The entries of ``path``; ``{}`` when absent, ``None`` (with a warning) when corrupt."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as e:
        warn_once(f"flyreg: cannot read cache file {path}: {e}; ignoring it")
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("entries"), dict):
            raise ValueError("not a flyreg cache file of schema 1")
    except ValueError as e:
        warn_once(f"flyreg: ignoring corrupt cache file {path}: {e}", key=f"corrupt:{path}:{len(text)}")
        return None
    return {k: v for k, v in data["entries"].items() if isinstance(v, dict)}


def load(op: str) -> dict[str, dict[str, Any]]:
    """All entries of ``op``'s cache file, key -> entry; never raises on a bad file."""
    return _read(cache_file(op)) or {}


def store(op: str, key: str, entry: dict[str, Any]) -> Path:
    """Add ``entry`` under ``key`` to ``op``'s cache file, keeping every other process's entries.

    A corrupt file is moved aside (``.corrupt-<time>``), never overwritten.
    """
    path = cache_file(op)
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(path) + ".lock"):
        entries = _read(path)
        if entries is None:
            os.replace(path, path.with_name(f"{path.name}.corrupt-{time.time_ns()}"))
            entries = {}
        entries[key] = entry
        write_json_atomic(path, {"schema": SCHEMA, "op": op, "entries": entries})
    return path


def clear(op: str | None = None) -> list[Path]:
    """Delete ``op``'s cache file, or every op's; returns the files removed."""
    directory = cache_dir()
    paths = [cache_file(op)] if op is not None else sorted(directory.glob("*.json"))
    removed = []
    for p in paths:
        if not p.exists():
            continue
        with filelock.FileLock(str(p) + ".lock"):
            try:
                p.unlink()
                removed.append(p)
            except FileNotFoundError:
                pass
    return removed
