"""Bounded reads, atomic writes (with the clean-up of killed writers' temp files) and one-time warnings."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

_warned: set[str] = set()
_umask: int | None = None
_swept: set[tuple[int, Path]] = set()

#: A temp file older than this is taken as abandoned even if a process of its writer's pid is alive
#: (pids are reused); no write of a small JSON file takes that long.
STALE_TEMP_SECONDS = 3600.0


class FlyregWarning(UserWarning):
    """A problem flyreg recovered from (a bad file, a failed config, a fallback)."""


class UnreadableFile(OSError):
    """A file flyreg will not read: not a regular file, or over its size cap."""


def warn_once(message: str, key: str | None = None) -> None:
    """Emit ``message`` as a :class:`FlyregWarning` once per process for ``key`` (default: the message)."""
    k = key if key is not None else message
    if k in _warned:
        return
    _warned.add(k)
    warnings.warn(message, FlyregWarning, stacklevel=3)


def read_bounded(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them.

    Opened non-blocking, so a FIFO never blocks; a FIFO, a device (``/dev/zero``), a directory or
    a file over ``max_bytes`` raises :class:`UnreadableFile`; a missing file ``FileNotFoundError``.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile(f"{path} is not a regular file")
        if info.st_size > max_bytes:
            raise UnreadableFile(f"{path} is larger than {max_bytes} bytes")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:  # it grew after fstat
            raise UnreadableFile(f"{path} is larger than {max_bytes} bytes")
        return data
    finally:
        os.close(fd)


def _file_mode() -> int:
    """The mode a plain ``open()`` would give a new file (``mkstemp`` would leave it 0600)."""
    global _umask
    if _umask is None:
        _umask = os.umask(0o022)
        os.umask(_umask)
    return 0o666 & ~_umask


#: Bytes of a target's name kept in its temp file's name: the pid, the random part and ``.tmp`` then
#: still fit a file name of 255 bytes.
_TEMP_STEM_BYTES = 200


def _temp_stem(name: str) -> str:
    """The target's name as its temp files carry it: whole, or cut with a hash of the whole when long."""
    raw = name.encode("utf-8", "surrogatepass")
    if len(raw) <= _TEMP_STEM_BYTES:
        return name
    head = raw[:_TEMP_STEM_BYTES - 17].decode("utf-8", "ignore")
    return f"{head}~{hashlib.sha256(raw).hexdigest()[:16]}"


def _temp_prefix(name: str) -> str:
    return f".{_temp_stem(name)}."


_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]+\.tmp$")


def process_gone(pid: int) -> bool:
    """True when no process of ``pid`` exists on this machine (one of another user's counts as existing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def remove_abandoned_temps(directory: Path, name: str | None = None,
                           max_age: float = STALE_TEMP_SECONDS) -> list[Path]:
    """Delete the temp files of killed writers in ``directory`` (of target ``name``, or of any target).

    A temp file is abandoned when the process that made it (its pid is in its name) is gone, or
    when it is older than ``max_age`` seconds. Returns the files removed.
    """
    removed: list[Path] = []
    now = time.time()
    try:
        candidates = list(directory.iterdir())
    except OSError:
        return removed
    for path in candidates:
        m = _TEMP.match(path.name)
        if m is None or (name is not None and m["name"] != _temp_stem(name)):
            continue
        try:
            info = path.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        pid = int(m["pid"])
        if pid == os.getpid() or not (process_gone(pid) or now - info.st_mtime > max_age):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` so a reader sees the old file or the new one, never half
    (:func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees the old file or the new one, never half.

    The temp file's name carries the writer's pid; a process's first write into a directory
    removes the temp files that killed writers left there (one listing per directory and process).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if (os.getpid(), path.parent) not in _swept:
        remove_abandoned_temps(path.parent)
        _swept.add((os.getpid(), path.parent))
    fd, tmp = tempfile.mkstemp(prefix=f"{_temp_prefix(path.name)}{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, _file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
