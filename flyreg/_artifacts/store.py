"""Offline artifacts on disk: the lookup directories, and reading and writing one artifact file.

An artifact is one JSON file per (op, spec, device), named by its identity
(:mod:`flyreg._artifacts.names`); whether one may serve a call is :mod:`flyreg._artifacts.usable`'s rule.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import platformdirs

from flyreg._artifacts.names import ParsedName, artifact_filename, parse_filename
from flyreg._core import settings
from flyreg._core.config import Config, JSONScalar
from flyreg._core.decision import Decision
from flyreg._core.fileio import UnreadableFile, read_bounded, warn_once, write_json_atomic
from flyreg._core.keys import DeviceIdentity
from flyreg._core.spec import canonical_spec
from flyreg._core.toolchain import Staleness, fingerprint, staleness
from flyreg._version import __version__

__all__ = ["MAX_ARTIFACT_BYTES", "SCHEMA", "Artifact", "ArtifactError", "emit_artifact", "emit_dir", "env_config_dirs",
           "forget_listings", "index", "listing", "load_artifact", "lookup_dirs", "user_config_dir"]

SCHEMA = 1
MAX_ARTIFACT_BYTES = 1 << 20
_FIELDS = ("schema", "op", "spec", "device", "config", "provenance")


class ArtifactError(ValueError):
    """A file that is not a well-formed flyreg artifact."""


# -- directories --------------------------------------------------------------------------------
def user_config_dir() -> Path:
    """Where a user's own tuned artifacts go by default (platformdirs; follows ``XDG_CONFIG_HOME``)."""
    return Path(platformdirs.user_config_dir("flyreg", appauthor=False))


def env_config_dirs() -> list[Path]:
    """The directories named by ``FLYREG_CONFIG_DIR`` (``os.pathsep``-separated, expanded), in order."""
    return list(settings.current().config_dirs)


def lookup_dirs(plugin_dirs: Iterable[Path] = ()) -> list[Path]:
    """Lookup order: FLYREG_CONFIG_DIR entries, the user's dir, then ``plugin_dirs`` (the ops' own artifacts)."""
    found = [*env_config_dirs(), user_config_dir(), *plugin_dirs]
    return list(dict.fromkeys(found))


def emit_dir() -> Path:
    """Where emission writes: the first ``FLYREG_CONFIG_DIR`` entry, else the user's config dir."""
    dirs = env_config_dirs()
    return dirs[0] if dirs else user_config_dir()


class Listing:
    """The artifact filenames of one directory, grouped by their device part (``device_name=<part>``); the
    rest of a name is parsed only when a lookup asks for its device."""

    def __init__(self, names: Iterable[str]) -> None:
        self.by_device: dict[str, list[str]] = {}
        self._parsed: dict[str, ParsedName | None] = {}
        for name in names:
            self.add(name)

    def add(self, name: str) -> None:
        """Count ``name`` in (an artifact just written); anything not named like an artifact is left out."""
        head, marker, device = name.removesuffix(".json").rpartition(",device_name=")
        if name.endswith(".json") and not name.startswith(".") and marker and head and name not in self._parsed:
            self.by_device.setdefault(device, []).append(name)
            self._parsed[name] = None

    def __contains__(self, name: object) -> bool:
        return name in self._parsed

    def parsed(self, devices: Callable[[str], bool] = lambda device: True) -> dict[str, ParsedName]:
        """Filename -> parsed name, of the files whose device part ``devices`` keeps (default: all)."""
        out = {}
        for device, names in self.by_device.items():
            if not devices(device):
                continue
            for name in names:
                parsed = self._parsed[name]
                if parsed is None:
                    parsed = self._parsed[name] = parse_filename(name)
                if parsed is not None:
                    out[name] = parsed
        return out


#: Each directory's listing, made once per process (a file written by this process is added to it).
_listings: dict[Path, Listing] = {}


def list_names(directory: Path) -> list[str]:
    """The names in ``directory`` (none where it cannot be listed): the one listing lookup makes of it."""
    try:
        return os.listdir(directory)
    except OSError:
        return []


def listing(directory: Path) -> Listing:
    """The artifact filenames of ``directory``, listed the first time this process asks."""
    cached = _listings.get(directory)
    if cached is None:
        cached = _listings[directory] = Listing(list_names(directory))
    return cached


def forget_listings() -> None:
    """Drop every directory's listing, so the next lookup lists the directories again."""
    _listings.clear()


def index(directory: Path) -> dict[str, ParsedName]:
    """Artifact filenames of ``directory`` -> parsed name, every device's (see :func:`listing`)."""
    return listing(directory).parsed()


# -- reading and writing --------------------------------------------------------------------------
@attrs.frozen
class Artifact:
    """The parsed content of one artifact file (``spec`` canonical); ``decision`` is why its search chose its
    config (``provenance.decision``), None in an artifact written before flyreg recorded it."""

    path: Path
    op: str
    spec: dict[str, JSONScalar]
    device: DeviceIdentity
    config: Config
    provenance: dict[str, Any]
    decision: Decision | None = None

    @property
    def filename(self) -> str:
        """The name this content must have to be found by lookup."""
        return artifact_filename(self.op, self.spec, self.device.name)

    def staleness(self, op_version: str | None) -> Staleness:
        """How its recorded toolchain compares with this machine's, for what its spec's backend depends on."""
        return staleness(self.provenance["toolchain"], self.spec, self.device.arch, op_version)

    def stale(self, op_version: str) -> bool:
        """True when something its spec's backend depends on changed since it was tuned (or the op's version)."""
        return self.staleness(op_version).stale


def load_artifact(path: Path) -> Artifact:
    """Parse and check one artifact file; raises :class:`ArtifactError` on anything malformed."""
    try:
        data = json.loads(read_bounded(path, MAX_ARTIFACT_BYTES).decode("utf-8"))
    except UnreadableFile as e:
        raise ArtifactError(str(e).rpartition(" is ")[2]) from None
    except (OSError, ValueError, RecursionError) as e:
        raise ArtifactError(f"unreadable JSON: {type(e).__name__}: {e}") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"top level is {type(data).__name__}, expected an object")
    missing = [f for f in _FIELDS if f not in data]
    if missing:
        raise ArtifactError(f"missing fields {missing}")
    if type(data["schema"]) is not int or data["schema"] != SCHEMA:
        raise ArtifactError(f"schema {data['schema']!r}, expected {SCHEMA}")
    op, device, prov = data["op"], data["device"], data["provenance"]
    if not isinstance(op, str) or not op:
        raise ArtifactError(f"'op' is {op!r}, expected a non-empty string")
    if not isinstance(device, dict) or not all(isinstance(device.get(k), str) and device[k] for k in ("name", "arch")):
        raise ArtifactError(f"'device' is {device!r}, expected {{'name': str, 'arch': str}}")
    if not isinstance(prov, dict) or not isinstance(prov.get("toolchain"), dict):
        raise ArtifactError("'provenance' must be an object with a 'toolchain' object")
    try:
        spec = canonical_spec(data["spec"], "'spec'")
        config = Config.from_json(data["config"])
        decision = Decision.from_json(prov["decision"]) if prov.get("decision") is not None else None
    except (TypeError, ValueError) as e:
        raise ArtifactError(str(e)) from None
    return Artifact(path, op, spec, DeviceIdentity(device["name"], device["arch"]), config, prov, decision)


def _ms(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def emit_artifact(op: str, spec: Mapping[str, JSONScalar], device: DeviceIdentity, config: Config, op_version: str,
                  time_ms: float | None, default_ms: float | None,
                  out_dir: str | os.PathLike[str] | None = None,
                  toolchain: Mapping[str, str] | None = None, decision: Decision | None = None) -> Path:
    """Write the artifact of ``config`` atomically into ``out_dir`` (default :func:`emit_dir`); returns its path.

    ``toolchain`` is the one the config was tuned with (default: this process's, :func:`fingerprint`
    of ``op_version``): a config tuned in another process on another machine records that one.
    ``decision`` (why the search chose ``config``) is stored as ``provenance.decision`` when given.

    A malformed file already at that name (or one whose content is not what its name says) is
    moved aside to ``<name>.corrupt-<time>`` first, never overwritten; a well-formed artifact
    there is replaced. Raises ``TypeError`` for a spec value that is not a JSON scalar (a tuple, a list).
    """
    if not isinstance(op, str) or not op:
        raise ValueError(f"op must be a non-empty string, got {op!r}")
    directory = Path(out_dir) if out_dir is not None else emit_dir()
    spec = canonical_spec(spec)
    path = directory / artifact_filename(op, spec, device.name)
    if path.resolve().parent != directory.resolve():  # cannot happen with sanitized names; kept as a guard
        raise ValueError(f"artifact path {path} escapes the config dir {directory}")
    _set_aside_if_malformed(path)
    write_json_atomic(path, {
        "schema": SCHEMA, "op": op, "spec": spec, "device": device.to_json(), "config": config.to_json(),
        "provenance": {"toolchain": dict(toolchain) if toolchain is not None else fingerprint(op_version), "flyreg": __version__,
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "time_ms": _ms(time_ms), "default_ms": _ms(default_ms),
                       **({"decision": decision.to_json()} if decision is not None else {})},
    })
    listed = _listings.get(directory)
    if listed is not None:
        listed.add(path.name)
    return path


def _set_aside_if_malformed(path: Path) -> None:
    """Move whatever is at ``path`` to ``<name>.corrupt-<time>`` unless it is an artifact named by its content."""
    if not os.path.lexists(path):
        return
    try:
        if load_artifact(path).filename == path.name:
            return
        why = "its content is not what its name says"
    except ArtifactError as e:
        why = str(e)
    aside = path.with_name(f"{path.name}.corrupt-{time.time_ns()}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:  # gone meanwhile
        return
    warn_once(f"flyreg: {path} was not a usable artifact ({why}); moved it aside to {aside.name} "
              f"before writing the new one")
