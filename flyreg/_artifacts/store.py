"""Offline artifacts: one JSON file per (op, spec, device), named by its lookup key.

Identity rules (see docs/autotune_guide.md, "Offline artifacts"):

* spec values are JSON scalars; tuples, lists and dicts are rejected with ``TypeError``;
* an integral float is the same value as the int (``8192.0`` is ``8192``); bools, numbers and
  strings never match each other (``True`` is not ``1``, ``"8192"`` is not ``8192``);
* a filename part that sanitizing would change (``"a/b"``, ``"../x"``, a string that reads as a
  JSON number) gets a short hash of its exact text, so distinct specs never share a file.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.util
import json
import math
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import platformdirs

from flyreg._core import settings
from flyreg._core.fileio import warn_once, write_json_atomic
from flyreg._version import __version__
from flyreg._core.config import Config, JSONScalar
from flyreg._core.keys import DeviceIdentity, fingerprint, normalize_spec, sanitize

SCHEMA = 1
MAX_ARTIFACT_BYTES = 1 << 20
_FIELDS = ("schema", "op", "spec", "device", "config", "provenance")
#: Integral floats up to this magnitude are read as ints (beyond it a float is not exact).
_EXACT_INT = 2**53

#: A parsed artifact filename: (op part, axis part -> value part, device part).
ParsedName = tuple[str, dict[str, str], str]
Accepts = Callable[[Config], "str | None"]


class ArtifactError(ValueError):
    """A file that is not a well-formed flyreg artifact."""


# -- identity and filenames ---------------------------------------------------------------------
def canonical_value(value: JSONScalar) -> JSONScalar:
    """``value`` as artifacts compare it: an integral float becomes the int it equals."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT_INT:
        return int(value)
    return value


def canonical_spec(spec: object, what: str = "spec") -> dict[str, JSONScalar]:
    """``spec`` checked (str -> JSON scalar, else ``TypeError``/``ValueError``), sorted, integral floats as ints."""
    return {k: canonical_value(v) for k, v in sorted(normalize_spec(spec, what).items())}


def spec_text(spec: Mapping[str, JSONScalar]) -> str:
    """The exact identity of a canonical spec: ``True``, ``1`` and ``"1"`` all differ."""
    return json.dumps(dict(spec), sort_keys=True, separators=(",", ":"))


def _tag(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def name_part(text: str) -> str:
    """``text`` as one filename part: ASCII ``[A-Za-z0-9._-]``, never starting with ``.``.

    When that changes ``text``, a hash of the exact text is appended (``a/b`` -> ``a_b-1a2b3c4d``).
    """
    part = sanitize(text)
    if part == text and not part.startswith("."):
        return part
    return f"{part.lstrip('.') or '_'}-{_tag(text)}"


def _value_part(value: JSONScalar) -> str:
    value = canonical_value(value)
    if not isinstance(value, str):
        return json.dumps(value).replace("e+", "e")
    try:
        literal = not isinstance(json.loads(value), str)  # "8192", "true": would read as another type
    except (ValueError, RecursionError):
        literal = False
    part = name_part(value)
    return f"{part}-{_tag(value)}" if literal and part == value else part


def lookup_key(op: str, spec: Mapping[str, JSONScalar], device_name: str) -> ParsedName:
    """The filename parts of ``(op, spec, device)``: what :func:`parse_filename` reads back."""
    axes = {name_part(k): _value_part(v) for k, v in canonical_spec(spec).items()}
    return name_part(op), axes, name_part(device_name)


def artifact_filename(op: str, spec: Mapping[str, JSONScalar], device_name: str) -> str:
    """``op,<axis>=<value>,...,device_name=<name>.json``: axes sorted, ASCII ``[A-Za-z0-9._=,-]`` only."""
    op_part, axes, device_part = lookup_key(op, spec, device_name)
    return ",".join([op_part, *(f"{k}={v}" for k, v in axes.items()), f"device_name={device_part}"]) + ".json"


def parse_filename(name: str) -> ParsedName | None:
    """(op, axis -> value text, device name) of an artifact filename, or None if it is not one."""
    if not name.endswith(".json") or name.startswith("."):
        return None
    op, *rest = name[: -len(".json")].split(",")
    if not op or not rest or not rest[-1].startswith("device_name="):
        return None
    axes = dict(p.split("=", 1) for p in rest[:-1] if "=" in p)
    if len(axes) != len(rest) - 1:
        return None
    return op, axes, rest[-1][len("device_name="):]


# -- directories --------------------------------------------------------------------------------
def user_config_dir() -> Path:
    """Where a user's own tuned artifacts go by default (platformdirs; follows ``XDG_CONFIG_HOME``)."""
    return Path(platformdirs.user_config_dir("flyreg", appauthor=False))


def env_config_dirs() -> list[Path]:
    """The directories named by ``FLYREG_CONFIG_DIR`` (``os.pathsep``-separated, expanded), in order."""
    return list(settings.current().config_dirs)


@functools.lru_cache(maxsize=1)
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


_index: dict[Path, dict[str, ParsedName]] = {}


def index(directory: Path) -> dict[str, ParsedName]:
    """Artifact filenames of ``directory`` -> parsed name; listed once per process (see ``_index``)."""
    cached = _index.get(directory)
    if cached is None:
        cached = {}
        try:
            names = os.listdir(directory)
        except OSError:
            names = []
        for name in names:
            parsed = parse_filename(name)
            if parsed is not None:
                cached[name] = parsed
        _index[directory] = cached
    return cached


# -- reading and writing --------------------------------------------------------------------------
@attrs.frozen
class Artifact:
    """The parsed content of one artifact file (``spec`` canonical)."""

    path: Path
    op: str
    spec: dict[str, JSONScalar]
    device: DeviceIdentity
    config: Config
    provenance: dict[str, Any]

    @property
    def filename(self) -> str:
        """The name this content must have to be found by lookup."""
        return artifact_filename(self.op, self.spec, self.device.name)

    def stale(self, op_version: str) -> bool:
        """True when tuned with another toolchain than the current one for ``op_version``."""
        return self.provenance.get("toolchain") != fingerprint(op_version)


def load_artifact(path: Path) -> Artifact:
    """Parse and check one artifact file; raises :class:`ArtifactError` on anything malformed."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ArtifactError("not a regular file")
        if info.st_size > MAX_ARTIFACT_BYTES:
            raise ArtifactError(f"larger than {MAX_ARTIFACT_BYTES} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
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
    except (TypeError, ValueError) as e:
        raise ArtifactError(str(e)) from None
    return Artifact(path, op, spec, DeviceIdentity(device["name"], device["arch"]), config, prov)


def _ms(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def emit_artifact(op: str, spec: Mapping[str, JSONScalar], device: DeviceIdentity, config: Config, op_version: str,
                  time_ms: float | None, default_ms: float | None,
                  out_dir: str | os.PathLike[str] | None = None) -> Path:
    """Write the artifact of ``config`` atomically into ``out_dir`` (default :func:`emit_dir`); returns its path.

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
        "provenance": {"toolchain": fingerprint(op_version), "flyreg": __version__,
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "time_ms": _ms(time_ms), "default_ms": _ms(default_ms)},
    })
    listed = _index.get(directory)
    parsed = parse_filename(path.name)
    if listed is not None and parsed is not None:
        listed[path.name] = parsed
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


# -- lookup -----------------------------------------------------------------------------------------
@attrs.frozen
class OfflineHit:
    """An artifact serving a call; ``nearest`` when tuned for a neighbouring spec."""

    config: Config
    path: Path
    stale: bool
    nearest: bool
    device: DeviceIdentity | None = None


class OfflineStore:
    """Finds the artifact serving an op's spec on a device, across the lookup directories."""

    def __init__(self, op: str, plugin_dirs: Iterable[str | os.PathLike[str]], ordered_axes: Iterable[str],
                 op_version: str, spec_check: Callable[[dict[str, JSONScalar]], object] | None = None) -> None:
        self.op = op
        self.spec_check = spec_check  # raises ValueError for a spec the op would never look up
        self.plugin_dirs = [Path(d) for d in plugin_dirs]
        self.ordered_axes = tuple(ordered_axes)
        self.op_version = op_version

    def dirs(self) -> list[Path]:
        """Lookup order: FLYREG_CONFIG_DIR entries, the user's dir, plugin dirs, then the shipped dir."""
        shipped = shipped_config_dir()
        found = [*env_config_dirs(), user_config_dir(), *self.plugin_dirs, *([shipped] if shipped else [])]
        return list(dict.fromkeys(found))

    def forget_index(self) -> None:
        """Drop every directory listing, so the next lookup lists the directories again."""
        _index.clear()

    def lookup(self, spec: Mapping[str, JSONScalar], device: DeviceIdentity, accepts: Accepts) -> OfflineHit | None:
        """The artifact for ``spec`` on ``device``, or None; never raises for a bad file (it warns).

        Order: exact spec on this product; exact spec on another product of the same arch (warns);
        then the nearest spec along ``ordered_axes``. Never across architectures.
        """
        spec = canonical_spec(spec)
        dirs = self.dirs()
        exact = artifact_filename(self.op, spec, device.name)
        for d in dirs:
            if exact in index(d):
                art = self._usable(d / exact, spec, device, accepts, same_product=True)
                if art is not None:
                    return self._hit(art, device, nearest=False)
        want_op, want_axes, want_dev = lookup_key(self.op, spec, device.name)
        same: list[tuple[Path, str]] = []
        near: list[tuple[tuple[bool, float, int, str], Path, str]] = []
        for rank, d in enumerate(dirs):
            for fname, (op, axes, dev) in sorted(index(d).items()):
                if op != want_op or fname == exact:
                    continue
                if axes == want_axes:
                    same.append((d, fname))
                elif self.ordered_axes:
                    dist = self._distance(axes, want_axes, spec)
                    if dist is not None:
                        near.append(((dev != want_dev, dist, rank, fname), d, fname))
        for d, fname in same:
            art = self._usable(d / fname, spec, device, accepts, same_product=False)
            if art is not None:
                return self._hit(art, device, nearest=False)
        for _, d, fname in sorted(near, key=lambda t: t[0]):
            art = self._usable(d / fname, None, device, accepts, same_product=False, nearest=True)
            if art is not None and spec_text(self._fixed(art.spec)) == spec_text(self._fixed(spec)):
                return self._hit(art, device, nearest=True)
        return None

    def _fixed(self, spec: Mapping[str, JSONScalar]) -> dict[str, JSONScalar]:
        return {k: v for k, v in spec.items() if k not in self.ordered_axes}

    def _distance(self, axes: dict[str, str], want_axes: dict[str, str], spec: dict[str, JSONScalar]) -> float | None:
        """Sum of |log a - log b| over the ordered axes; None unless every other axis is equal."""
        if set(axes) != set(want_axes):
            return None
        ordered = {name_part(k) for k in self.ordered_axes if k in spec}
        if not ordered or any(axes[k] != v for k, v in want_axes.items() if k not in ordered):
            return None
        total = 0.0
        for k in self.ordered_axes:
            want = spec.get(k)
            if k not in spec:
                continue
            if isinstance(want, bool) or not isinstance(want, (int, float)):
                return None
            try:
                have = float(axes[name_part(k)])
            except ValueError:
                return None
            if not math.isfinite(have):
                return None
            if have > 0 and want > 0:
                total += abs(math.log(have) - math.log(want))
            else:
                total += abs(have - want)
        return total

    def _usable(self, path: Path, spec: dict[str, JSONScalar] | None, device: DeviceIdentity, accepts: Accepts,
                same_product: bool, nearest: bool = False) -> Artifact | None:
        """The artifact at ``path`` if it may serve this call; warns once for each bad file.

        ``spec`` None skips the spec check (nearest lookup). A valid artifact of another
        architecture, or a neighbour whose config the op would not take for this spec, is
        skipped silently: it is not a problem, just not for this call.
        """
        try:
            art = load_artifact(path)
        except ArtifactError as e:
            warn_once(f"flyreg: {self.op}: ignoring malformed artifact {path}: {e}")
            return None
        problems = []
        if art.filename != path.name:
            problems.append(f"its content is {art.filename}, not what its filename says")
        if art.op != self.op:
            problems.append(f"op {art.op!r} != {self.op!r}")
        if spec is not None and spec_text(art.spec) != spec_text(spec):
            problems.append(f"spec {spec_text(art.spec)} != {spec_text(spec)}")
        elif spec is None and self.spec_check is not None:
            try:
                self.spec_check(dict(art.spec))
            except ValueError as e:
                problems.append(str(e))
        if same_product and art.device.name != device.name:
            problems.append(f"device {art.device.name!r} != {device.name!r}")
        if art.device.arch != device.arch:
            if not problems and not same_product:
                return None  # a sound artifact for another architecture: never served here
            problems.append(f"arch {art.device.arch!r} != {device.arch!r}")
        if not problems:
            why = accepts(art.config)
            if why and nearest:
                return None
            if why:
                problems.append(f"config {art.config} rejected: {why}")
        if problems:
            warn_once(f"flyreg: {self.op}: ignoring artifact {path}: {'; '.join(problems)}")
            return None
        return art

    def _hit(self, art: Artifact, device: DeviceIdentity, nearest: bool) -> OfflineHit:
        if art.device.name != device.name:
            warn_once(f"flyreg: {self.op}: no artifact for {device.name}; serving {art.path.name}, "
                      f"tuned on {art.device.name} of the same arch {device.arch}")
        stale = art.stale(self.op_version)
        if stale:
            warn_once(f"flyreg: {self.op}: artifact {art.path} is stale (tuned with "
                      f"{art.provenance.get('toolchain')}, current {fingerprint(self.op_version)}); "
                      f"serving it anyway, re-tune to refresh it")
        return OfflineHit(art.config, art.path, stale, nearest, art.device)
