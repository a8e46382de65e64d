"""Every ``FLYREG_*`` environment variable, read and validated in one place.

:data:`VARIABLES` is the one table of them: the README's table and ``flyreg --help`` are made
from it. :func:`current` is what the runtime asks; it re-reads the environment only when one of
the variables a :class:`Settings` depends on has changed, so asking costs a few dictionary
lookups. It is asked when a key is first resolved, never on the steady-state call.

A bad value warns once (naming the variable, the value and what is allowed) and the default
is used. In every directory setting a leading ``~`` and ``$VAR`` or ``${VAR}`` are expanded
(:func:`expand_path`), the same way wherever the directory is used.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from flyreg._core.fileio import warn_once

#: Variables that ``~`` and the default directories follow, besides those a value names.
_ALSO_WATCHED = ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")
_REFERENCE = re.compile(r"\$(\w+)|\$\{([^}]*)\}")
_TRUE = ("1", "true", "yes", "on")
#: The longest duration a seconds setting may name: every wait flyreg hands one to (an event's, a
#: lock's, a pipe's poll) accepts it on every platform (``threading.TIMEOUT_MAX`` is about 9.2e9 s on
#: Linux and 4.3e6 s on Windows); a longer one would raise OverflowError at the wait.
MAX_SECONDS = min(1e6, threading.TIMEOUT_MAX)
_FALSE = ("0", "false", "no", "off")


def expand_path(text: str, environ: Mapping[str, str] | None = None) -> Path:
    """``text`` as a path, ``$VAR`` and ``${VAR}`` replaced from ``environ`` (default: the process
    environment; an unset variable stays as written) and a leading ``~`` made the home directory."""
    env = os.environ if environ is None else environ
    text = _REFERENCE.sub(lambda m: env.get(m[1] or m[2], m[0]), text)
    if text == "~" or text.startswith(("~/", "~" + os.sep)):
        home = env.get("HOME") or os.path.expanduser("~")
        text = home + text[1:]
    elif text.startswith("~"):
        text = os.path.expanduser(text)  # ~user
    return Path(text)


def _references(text: str) -> list[str]:
    """The variables ``text`` names as ``$VAR`` or ``${VAR}``."""
    return [m[1] or m[2] for m in _REFERENCE.finditer(text)]


def _bool(raw: str, environ: Mapping[str, str]) -> bool:
    word = raw.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError


def _positive_int(raw: str, environ: Mapping[str, str]) -> int:
    n = int(raw.strip())
    if n < 1:
        raise ValueError
    return n


def _positive_seconds(raw: str, environ: Mapping[str, str]) -> float:
    seconds = float(raw.strip())
    if not math.isfinite(seconds) or seconds <= 0 or seconds > MAX_SECONDS:
        raise ValueError
    return seconds


_SECONDS = f"seconds > 0, at most {MAX_SECONDS:,.0f}"


def _path(raw: str, environ: Mapping[str, str]) -> Path:
    return expand_path(raw.strip(), environ)


def _directories(raw: str, environ: Mapping[str, str]) -> tuple[Path, ...]:
    return tuple(expand_path(p.strip(), environ) for p in raw.split(os.pathsep) if p.strip())


def _names(raw: str, environ: Mapping[str, str]) -> frozenset[str]:
    return frozenset(n.strip() for n in raw.split(",") if n.strip())


def _user_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("flyreg", appauthor=False))


def default_compile_threads() -> int:
    """Threads binding a search's candidates when ``FLYREG_COMPILE_THREADS`` is unset: the CPU count, at most 16."""
    return min(16, os.cpu_count() or 1)


def default_compile_workers() -> int:
    """Processes compiling an isolated search's candidates when ``FLYREG_COMPILE_WORKERS`` is unset: the CPU
    count, at most 8 (each imports torch and the op's backend)."""
    return min(8, os.cpu_count() or 1)


@attrs.frozen
class Variable:
    """One environment variable: its ``name``, the :class:`Settings` ``field`` it sets, what values
    are ``allowed`` and its ``default`` (as the docs say them), its ``meaning``, how to ``parse`` a
    value (``ValueError`` when not allowed) and the ``default_value`` used when unset or bad; ``directories``
    marks a path-valued variable, whose ``$VAR`` references are followed."""

    name: str
    field: str
    allowed: str
    default: str
    meaning: str
    parse: Callable[[str, Mapping[str, str]], Any]
    default_value: Callable[[], Any]
    directories: bool = False


VARIABLES: tuple[Variable, ...] = (
    Variable("FLYREG_AUTOTUNE", "autotune", "1/0, true/false, yes/no, on/off", "off",
             "search every new key afresh and re-write its cache entry and artifact", _bool, lambda: False),
    Variable("FLYREG_CACHE_DIR", "cache_dir", "a directory", "the user cache dir, `~/.cache/flyreg` on Linux",
             "the scratch disk cache", _path, _user_cache_dir, directories=True),
    Variable("FLYREG_CONFIG_DIR", "config_dirs", "directories separated by `os.pathsep`", "none",
             "artifact dirs, looked up first; the first is where tuning writes, else the user config dir",
             _directories, tuple, directories=True),
    Variable("FLYREG_DISABLE_OPS", "disable_ops", "op names separated by commas", "none",
             "ops to treat as disabled; a name no registered op has warns, and `*` is not a wildcard",
             _names, frozenset),
    Variable("FLYREG_COMPILE_THREADS", "compile_threads", "an int >= 1", "the CPU count, at most 16",
             "threads that bind (and so compile) a search's candidates", _positive_int, default_compile_threads),
    Variable("FLYREG_COMPILE_WORKERS", "compile_workers", "an int >= 1", "the CPU count, at most 8",
             "processes that compile an isolated search's candidates (`flyreg tune --isolate`)", _positive_int,
             default_compile_workers),
    Variable("FLYREG_CANDIDATE_TIMEOUT", "candidate_timeout", _SECONDS, "30",
             "the least time an isolated candidate may take before it counts as hung (the limit is 20 times "
             "the slowest candidate so far, at least this)", _positive_seconds, lambda: 30.0),
    Variable("FLYREG_PLUGIN_TIMEOUT", "plugin_timeout", _SECONDS, "30",
             "how long an op's plugin may take to import and describe itself before it is marked broken", _positive_seconds, lambda: 30.0),
    Variable("FLYREG_RECORD", "record", "a file", "none",
             "record which config source served each spec the process called, and how often, into this "
             "SQLite file every `FLYREG_RECORD_INTERVAL` seconds, on SIGTERM and at exit (`flyreg tune "
             "--from-record`, `flyreg check --against-record`); anything there but a record or an empty "
             "file is refused", _path, lambda: None, directories=True),
    Variable("FLYREG_RECORD_INTERVAL", "record_interval", _SECONDS, "30",
             "how often a serving record's counts are added to its file while the process runs: the most "
             "a SIGKILL can lose", _positive_seconds, lambda: 30.0),
)

NAMES = tuple(v.name for v in VARIABLES)


@attrs.frozen
class Settings:
    """flyreg's settings, one field per entry of :data:`VARIABLES` (``from_env({})`` holds the
    defaults); directories are expanded."""

    autotune: bool
    cache_dir: Path
    config_dirs: tuple[Path, ...]
    disable_ops: frozenset[str]
    compile_threads: int
    compile_workers: int
    candidate_timeout: float
    plugin_timeout: float
    record: Path | None = None
    record_interval: float = 30.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings ``environ`` (default: the process environment) sets; an unset or empty
        variable gets its default, and so does a bad value, with a one-time warning."""
        env = os.environ if environ is None else environ
        values = {}
        for var in VARIABLES:
            raw = env.get(var.name, "")
            if raw.strip():
                try:
                    values[var.field] = var.parse(raw, env)
                    continue
                except ValueError:
                    warn_once(f"flyreg: ignoring {var.name}={raw!r}: expected {var.allowed}; "
                              f"using the default ({var.default})", key=f"setting:{var.name}={raw}")
            values[var.field] = var.default_value()
        return cls(**values)


def _watched(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The variables whose values the settings of ``environ`` depend on."""
    named = [n for v in VARIABLES if v.directories for n in _references(environ.get(v.name, ""))]
    return tuple(dict.fromkeys([*NAMES, *_ALSO_WATCHED, *named]))


@attrs.frozen
class _Read:
    """Settings read from the environment, with the raw values of the variables they depend on."""

    settings: Settings
    keys: tuple[Any, ...]
    raw: tuple[Any, ...]


def _raw(keys: tuple[Any, ...]) -> tuple[Any, ...]:
    """The values of the process environment under ``keys`` (encoded as :func:`_keys` makes them)."""
    data = getattr(os.environ, "_data", None)
    if data is None:
        return tuple(map(os.environ.get, keys))
    return tuple(map(data.get, keys))


def _keys(names: tuple[str, ...]) -> tuple[Any, ...]:
    """``names`` as keys of the environment's own mapping: ``os.environ.get`` raises and catches a
    KeyError for each unset name (a few microseconds each); the mapping it wraps does not."""
    if getattr(os.environ, "_data", None) is None:
        return names
    return tuple(map(os.environ.encodekey, names))  # type: ignore[attr-defined]


_lock = threading.Lock()
_last: _Read | None = None


def current() -> Settings:
    """The settings of the process environment as it is now (re-read only when a watched variable changed)."""
    global _last
    last = _last
    if last is not None and _raw(last.keys) == last.raw:
        return last.settings
    with _lock:
        watched = _watched(os.environ)
        keys = _keys(watched)
        raw = _raw(keys)  # before the values are read: a change in between makes the next call read again
        settings = Settings.from_env({n: v for n in watched if (v := os.environ.get(n)) is not None})
        _last = _Read(settings, keys, raw)
    return settings


def set_cache_dir(directory: Path) -> None:
    """Make ``directory`` this process's scratch cache dir (where the tuning journal lives too), as
    ``FLYREG_CACHE_DIR`` does, for it and the processes it starts: a Ray actor's private dir."""
    os.environ["FLYREG_CACHE_DIR"] = str(directory)


def markdown_table() -> str:
    """The table of every variable, as the README shows it."""
    rows = ["| variable | values | default | effect |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.allowed} | {v.default} | {v.meaning} |" for v in VARIABLES]
    return "\n".join(rows)


def help_rows() -> list[tuple[str, str]]:
    """(name, text) of every variable, as ``flyreg --help`` lists them."""
    return [(v.name, f"{v.meaning[:1].upper()}{v.meaning[1:]}. Values: {v.allowed}. Default: {v.default}."
             .replace("`", "")) for v in VARIABLES]
