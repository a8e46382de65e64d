"""Artifact identity: canonical specs and the filename an (op, spec, device) artifact has.

Identity rules (see docs/autotune_guide.md, "Offline artifacts"):

* spec values are JSON scalars; tuples, lists and dicts are rejected with ``TypeError``;
* an integral float is the same value as the int (``8192.0`` is ``8192``); bools, numbers and
  strings never match each other (``True`` is not ``1``, ``"8192"`` is not ``8192``);
* a filename part that sanitizing would change (``"a/b"``, ``"../x"``, a string that reads as a
  JSON number) gets a short hash of its exact text, so distinct specs never share a file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from flyreg._core.config import JSONScalar
from flyreg._core.keys import normalize_spec, sanitize

#: Integral floats up to this magnitude are read as ints (beyond it a float is not exact).
_EXACT_INT = 2**53

#: A parsed artifact filename: (op part, axis part -> value part, device part).
ParsedName = tuple[str, dict[str, str], str]


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
