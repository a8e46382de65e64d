"""Atomic JSON writes and one-time warnings."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

_warned: set[str] = set()
_umask: int | None = None


class FlyregWarning(UserWarning):
    """A problem flyreg recovered from (a bad file, a failed config, a fallback)."""


def warn_once(message: str, key: str | None = None) -> None:
    """Emit ``message`` as a :class:`FlyregWarning` once per process for ``key`` (default: the message)."""
    k = key if key is not None else message
    if k in _warned:
        return
    _warned.add(k)
    warnings.warn(message, FlyregWarning, stacklevel=3)


def _file_mode() -> int:
    """The mode a plain ``open()`` would give a new file (``mkstemp`` would leave it 0600)."""
    global _umask
    if _umask is None:
        _umask = os.umask(0o022)
        os.umask(_umask)
    return 0o666 & ~_umask


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` so a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, _file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
