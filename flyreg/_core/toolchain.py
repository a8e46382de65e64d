"""The toolchain a stored config was tuned with, and what of it each backend depends on.

An artifact (or a scratch-cache entry) records the whole toolchain it was tuned with
(:func:`fingerprint`), but it is stale only when something its spec's backend depends on
changed (:func:`staleness`):

* the op's version, always;
* the backend's library: ``triton`` for a spec whose ``backend`` axis is ``"triton"``, ``torch``
  for ``"torch"`` or ``"cpu"`` and for a spec with no ``backend`` axis; an unknown backend name
  depends on both;
* the device's platform: CUDA for an ``sm_*`` architecture, HIP for a ``gfx*`` one, nothing
  for the CPU.

The flyreg version is never compared. Where the platform (or the library) is absent here (an
H200's artifact checked on a machine without CUDA), those parts cannot be compared: they are
reported as unknown, never as stale.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Mapping

import attrs

from flyreg._version import __version__

#: The spec axis naming an op's backend, and the libraries each backend name depends on.
BACKEND_AXIS = "backend"
BACKEND_LIBRARIES: dict[str, tuple[str, ...]] = {"triton": ("triton",), "torch": ("torch",), "cpu": ("torch",)}
#: What a spec without a ``backend`` axis depends on, and what an unknown backend name depends on.
NO_BACKEND = "torch"
UNKNOWN_BACKEND_LIBRARIES = ("torch", "triton")


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def toolchain() -> tuple[tuple[str, str], ...]:
    """flyreg, torch, Triton, CUDA and HIP versions where present; computed once per process."""
    parts: dict[str, str | None] = {"flyreg": __version__}
    parts["torch"] = _dist_version("torch")
    parts["triton"] = _dist_version("triton") or _dist_version("pytorch-triton")
    try:
        import torch

        parts["cuda"] = getattr(torch.version, "cuda", None)
        parts["hip"] = getattr(torch.version, "hip", None)
    except ImportError:
        pass
    return tuple((k, str(v)) for k, v in parts.items() if v)


def fingerprint(op_version: str) -> dict[str, str]:
    """What a stored config records: the whole :func:`toolchain` plus the op's own version."""
    return {**dict(toolchain()), "op": op_version}


def backend_of(spec: Mapping[str, object]) -> str:
    """The backend a spec runs on: its ``backend`` axis when that is a string, else :data:`NO_BACKEND`."""
    value = spec.get(BACKEND_AXIS)
    return value if isinstance(value, str) else NO_BACKEND


def platform_of(arch: str) -> str | None:
    """The toolchain part a device architecture needs: ``cuda`` (``sm_*``), ``hip`` (``gfx*``), else None."""
    if arch.startswith("sm_"):
        return "cuda"
    if arch.startswith("gfx"):
        return "hip"
    return None


def depends_on(spec: Mapping[str, object], arch: str) -> tuple[str, ...]:
    """The toolchain parts (besides the op's version) a config of ``spec`` on ``arch`` depends on."""
    libraries = BACKEND_LIBRARIES.get(backend_of(spec), UNKNOWN_BACKEND_LIBRARIES)
    platform = platform_of(arch)
    return (*libraries, platform) if platform else libraries


def current(spec: Mapping[str, object], arch: str, op_version: str) -> dict[str, str]:
    """The parts of this machine's toolchain a config of ``spec`` on ``arch`` depends on, and the op version.

    What the scratch-cache key holds: a change to anything else (installing Triton for a torch
    op) keeps every entry.
    """
    here = dict(toolchain())
    return {**{k: here[k] for k in depends_on(spec, arch) if k in here}, "op": op_version}


@attrs.frozen
class Staleness:
    """How a recorded toolchain compares with this machine's, for what the config depends on.

    ``changed``: (part, recorded, current) for each part that differs; ``unknown``: the parts
    this machine has no version of (no CUDA here for an ``sm_90`` artifact), so not compared.
    """

    changed: tuple[tuple[str, str | None, str | None], ...] = ()
    unknown: tuple[str, ...] = ()

    @property
    def stale(self) -> bool:
        return bool(self.changed)

    def reason(self) -> str:
        """``triton 3.6.0 -> 3.9.0, op 2 -> 3``: what changed, as one line (empty when current)."""
        return ", ".join(f"{k} {had or 'none'} -> {now or 'none'}" for k, had, now in self.changed)


def staleness(recorded: Mapping[str, object], spec: Mapping[str, object], arch: str,
              op_version: str | None) -> Staleness:
    """Compare a stored config's ``recorded`` toolchain with this machine's, for what ``spec`` on ``arch`` depends on.

    ``op_version`` None (an op not registered here) leaves the op version out. When the device's
    platform is absent here, none of its backend's parts are compared: this machine's Triton says
    nothing about the Triton an ``sm_90`` kernel is built with elsewhere.
    """
    here = dict(toolchain())
    parts = depends_on(spec, arch)
    platform = platform_of(arch)
    unknown: tuple[str, ...]
    compared: tuple[str, ...]
    if platform is not None and platform not in here:
        unknown, compared = parts, ()
    else:
        unknown = tuple(k for k in parts if k not in here)
        compared = tuple(k for k in parts if k in here)
    changed = [(k, _text(recorded.get(k)), here[k]) for k in compared if _text(recorded.get(k)) != here[k]]
    if op_version is not None and _text(recorded.get("op")) != op_version:
        changed.append(("op", _text(recorded.get("op")), op_version))
    return Staleness(tuple(changed), unknown)


def _text(value: object) -> str | None:
    return None if value is None else str(value)
