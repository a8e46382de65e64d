"""Artifact identity: the filename an (op, spec, device) artifact has, and reading one back.

A spec's part of the name is :func:`flyreg._core.spec.spec_parts` (see its identity rules and
docs/autotune_guide.md, "Offline artifacts").
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from flyreg._core.config import JSONScalar
from flyreg._core.spec import name_part, spec_parts

#: A parsed artifact filename: (op part, axis part -> value part, device part).
ParsedName = tuple[str, dict[str, str], str]


#: The most bytes a file name may have on common file systems.
MAX_NAME_BYTES = 255
#: A value part cut to fit keeps this many leading characters, then ``-`` and a hash of the whole part.
_KEPT = 24


def lookup_key(op: str, spec: Mapping[str, JSONScalar], device_name: str) -> ParsedName:
    """The filename parts of ``(op, spec, device)``: what :func:`parse_filename` reads back. Where the name
    would pass :data:`MAX_NAME_BYTES`, the longest value parts are cut, each to its head and a hash of it, until
    it fits (a name that fits is never cut, so no artifact written before moves)."""
    op_part, axes, device_part = name_part(op), spec_parts(spec), name_part(device_name)
    while axes and len(_joined(op_part, axes, device_part)) > MAX_NAME_BYTES:
        longest = max(axes, key=lambda k: len(axes[k]))
        if len(axes[longest]) <= _KEPT + 17:
            break  # nothing left to cut: writing it names the OS's error
        axes[longest] = f"{axes[longest][:_KEPT]}-{hashlib.sha256(axes[longest].encode()).hexdigest()[:16]}"
    return op_part, axes, device_part


def _joined(op_part: str, axes: Mapping[str, str], device_part: str) -> str:
    return ",".join([op_part, *(f"{k}={v}" for k, v in axes.items()), f"device_name={device_part}"]) + ".json"


def artifact_filename(op: str, spec: Mapping[str, JSONScalar], device_name: str) -> str:
    """``op,<axis>=<value>,...,device_name=<name>.json``: axes sorted, ASCII ``[A-Za-z0-9._=,-]`` only."""
    return _joined(*lookup_key(op, spec, device_name))


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
