"""Offline artifacts: one JSON file per (op, spec, device), named by its lookup key."""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import platformdirs

from ._fileio import warn_once, write_json_atomic
from ._version import __version__
from .config import Config, JSONScalar
from .keys import DeviceIdentity, fingerprint, normalize_spec, sanitize

SCHEMA = 1
MAX_ARTIFACT_BYTES = 1 << 20


class ArtifactError(ValueError):
    """A file that is not a well-formed flyreg artifact."""


@attrs.frozen
class Artifact:
    """The parsed content of one artifact file."""

    path: Path
    op: str
    spec: dict[str, JSONScalar]
    device: DeviceIdentity
    config: Config
    provenance: dict[str, Any]


@attrs.frozen
class OfflineHit:
    """An artifact serving a call; ``nearest`` when tuned for a neighbouring spec."""

    config: Config
    path: Path
    stale: bool
    nearest: bool


def _value_text(value: JSONScalar) -> str:
    return sanitize(value) if isinstance(value, str) else json.dumps(value)


def artifact_filename(op: str, spec: dict[str, JSONScalar], device_name: str) -> str:
    """``op,<axis>=<value>,...,device_name=<name>.json``, axes sorted, ASCII ``[A-Za-z0-9._=,-]`` only."""
    parts = [sanitize(op)]
    parts += [f"{sanitize(k)}={sanitize(_value_text(v))}" for k, v in sorted(spec.items())]
    parts.append(f"device_name={sanitize(device_name)}")
    return ",".join(parts) + ".json"


def _parse_filename(name: str) -> tuple[str, dict[str, str], str] | None:
    """(op, axis -> value text, device name) of an artifact filename, or None if it is not one."""
    if not name.endswith(".json") or name.startswith("."):
        return None
    op, *rest = name[: -len(".json")].split(",")
    axes = dict(p.split("=", 1) for p in rest if "=" in p)
    if len(axes) != len(rest) or "device_name" not in axes:
        return None
    device = axes.pop("device_name")
    return op, axes, device


def user_config_dir() -> Path:
    """Where a user's own tuned artifacts go by default."""
    return Path(platformdirs.user_config_dir("flyreg", appauthor=False))


def env_config_dirs() -> list[Path]:
    """The directories named by ``FLYREG_CONFIG_DIR`` (``os.pathsep``-separated), in order."""
    return [Path(p) for p in os.environ.get("FLYREG_CONFIG_DIR", "").split(os.pathsep) if p]


def shipped_config_dir() -> Path | None:
    """The artifacts shipped inside the installed flyreg package."""
    try:
        spec = importlib.util.find_spec("flyreg.offline_configs")
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    tree = Path(__file__).resolve().parent.parent / "offline_configs"
    return tree if tree.is_dir() else None


def emit_dir() -> Path:
    """Where emission writes: the first ``FLYREG_CONFIG_DIR`` entry, else the user's config dir."""
    dirs = env_config_dirs()
    return dirs[0] if dirs else user_config_dir()


def load_artifact(path: Path) -> Artifact:
    """Parse and check one artifact file; raises :class:`ArtifactError` on anything malformed."""
    try:
        if path.stat().st_size > MAX_ARTIFACT_BYTES:
            raise ArtifactError(f"larger than {MAX_ARTIFACT_BYTES} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ArtifactError(f"unreadable JSON: {e}") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"top level is {type(data).__name__}, expected an object")
    missing = {"schema", "op", "spec", "device", "config", "provenance"} - set(data)
    if missing:
        raise ArtifactError(f"missing fields {sorted(missing)}")
    if data["schema"] != SCHEMA:
        raise ArtifactError(f"schema {data['schema']!r}, expected {SCHEMA}")
    op, device, prov = data["op"], data["device"], data["provenance"]
    if not isinstance(op, str) or not op:
        raise ArtifactError(f"'op' is {op!r}, expected a non-empty string")
    if not isinstance(device, dict) or not all(isinstance(device.get(k), str) and device[k] for k in ("name", "arch")):
        raise ArtifactError(f"'device' is {device!r}, expected {{'name': str, 'arch': str}}")
    if not isinstance(prov, dict) or not isinstance(prov.get("toolchain"), dict):
        raise ArtifactError("'provenance' must be an object with a 'toolchain' object")
    try:
        spec = normalize_spec(data["spec"], "'spec'")
        config = Config.from_json(data["config"])
    except (TypeError, ValueError) as e:
        raise ArtifactError(str(e)) from None
    return Artifact(path, op, spec, DeviceIdentity(device["name"], device["arch"]), config, prov)


def emit_artifact(op: str, spec: dict[str, JSONScalar], device: DeviceIdentity, config: Config, op_version: str,
                  time_ms: float | None, default_ms: float | None,
                  out_dir: str | os.PathLike[str] | None = None) -> Path:
    """Write the artifact of ``config`` atomically into ``out_dir`` (default :func:`emit_dir`); returns its path."""
    directory = Path(out_dir) if out_dir is not None else emit_dir()
    spec = normalize_spec(spec)
    path = directory / artifact_filename(op, spec, device.name)
    if path.resolve().parent != directory.resolve():
        raise ValueError(f"artifact path {path} escapes the config dir {directory}")
    write_json_atomic(path, {
        "schema": SCHEMA, "op": op, "spec": spec, "device": device.to_json(), "config": config.to_json(),
        "provenance": {"toolchain": fingerprint(op_version), "flyreg": __version__,
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "time_ms": time_ms, "default_ms": default_ms},
    })
    return path


_index: dict[Path, dict[str, tuple[str, dict[str, str], str]]] = {}


def index(directory: Path) -> dict[str, tuple[str, dict[str, str], str]]:
    """Artifact filenames of ``directory`` -> parsed name; scanned once per process."""
    cached = _index.get(directory)
    if cached is None:
        cached = {}
        try:
            for name in os.listdir(directory):
                parsed = _parse_filename(name)
                if parsed is not None:
                    cached[name] = parsed
        except OSError:
            pass
        _index[directory] = cached
    return cached


class OfflineStore:
    """Finds the artifact serving an op's spec on a device, across the lookup directories."""

    def __init__(self, op: str, plugin_dirs: Iterable[str], ordered_axes: tuple[str, ...], op_version: str) -> None:
        self.op = op
        self.plugin_dirs = [Path(d) for d in plugin_dirs]
        self.ordered_axes = ordered_axes
        self.op_version = op_version

    def dirs(self) -> list[Path]:
        """Lookup order: FLYREG_CONFIG_DIR, the user's dir, plugin dirs, then the shipped dir."""
        shipped = shipped_config_dir()
        found = [*env_config_dirs(), user_config_dir(), *self.plugin_dirs, *([shipped] if shipped else [])]
        return list(dict.fromkeys(found))

    def forget_index(self) -> None:
        _index.clear()

    def _read(self, path: Path, spec: dict[str, JSONScalar] | None, device: DeviceIdentity, same_name: bool,
              accepts: Callable[[Config], str | None]) -> Artifact | None:
        try:
            art = load_artifact(path)
        except ArtifactError as e:
            warn_once(f"flyreg: ignoring malformed artifact {path}: {e}")
            return None
        problems = []
        if art.op != self.op:
            problems.append(f"op {art.op!r} != {self.op!r}")
        if spec is not None and art.spec != spec:
            problems.append(f"spec {art.spec} != {spec}")
        if same_name and art.device.name != device.name:
            problems.append(f"device {art.device.name!r} != {device.name!r}")
        if art.device.arch != device.arch:
            problems.append(f"arch {art.device.arch!r} != {device.arch!r}")
        why = None if problems else accepts(art.config)
        if problems or why:
            warn_once(f"flyreg: ignoring artifact {path}: {'; '.join(problems) or why}")
            return None
        return art

    def _hit(self, art: Artifact, nearest: bool) -> OfflineHit:
        stale = art.provenance.get("toolchain") != fingerprint(self.op_version)
        return OfflineHit(art.config, art.path, stale, nearest)

    def lookup(self, spec: dict[str, JSONScalar], device: DeviceIdentity,
               accepts: Callable[[Config], str | None]) -> OfflineHit | None:
        """Exact spec on this product, then on another product of the same arch (with a warning),
        then the nearest spec along the ordered axes; never across architectures."""
        dirs = self.dirs()
        name = artifact_filename(self.op, spec, device.name)
        for d in dirs:
            if name in index(d):
                art = self._read(d / name, spec, device, True, accepts)
                if art is not None:
                    return self._hit(art, False)
        prefix = name[: -len(f"device_name={sanitize(device.name)}.json")]
        for d in dirs:
            for fname in sorted(index(d)):
                if fname.startswith(prefix) and fname != name:
                    art = self._read(d / fname, spec, device, False, accepts)
                    if art is not None:
                        warn_once(f"flyreg: {self.op}: no artifact for {device.name}; serving {fname}, "
                                  f"tuned on {art.device.name} of the same arch {device.arch}")
                        return self._hit(art, False)
        return self._nearest(dirs, spec, device, accepts) if self.ordered_axes else None

    def _nearest(self, dirs: list[Path], spec: dict[str, JSONScalar], device: DeviceIdentity,
                 accepts: Callable[[Config], str | None]) -> OfflineHit | None:
        want = {k: _value_text(v) for k, v in spec.items()}
        fixed = {k: v for k, v in want.items() if k not in self.ordered_axes}
        scored = []
        for d in dirs:
            for fname, (op, axes, dev) in index(d).items():
                if op != sanitize(self.op) or set(axes) != {sanitize(k) for k in want}:
                    continue
                if any(axes.get(sanitize(k)) != sanitize(v) for k, v in fixed.items()):
                    continue
                dist = _log_distance(axes, spec, self.ordered_axes)
                if dist is not None:
                    scored.append((dev != sanitize(device.name), dist, str(d / fname)))
        for _, _, path in sorted(scored):
            art = self._read(Path(path), None, device, False, accepts)
            if art is None:
                continue
            if any(art.spec.get(k) != v for k, v in spec.items() if k not in self.ordered_axes):
                continue
            return self._hit(art, True)
        return None


def _log_distance(axes: dict[str, str], spec: dict[str, JSONScalar], ordered: tuple[str, ...]) -> float | None:
    total = 0.0
    for k in ordered:
        if k not in spec:
            continue
        try:
            have, want = float(axes[sanitize(k)]), float(spec[k])  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError):
            return None
        if have <= 0 or want <= 0:
            total += abs(have - want)
        else:
            total += abs(math.log(have) - math.log(want))
    return total
