"""A spec (axis name -> JSON scalar) checked, compared, keyed, printed and named: every text flyreg makes of one.

* :func:`normalize_spec` checks a spec and gives it as it reads back from JSON; :func:`canonical_spec`
  also sorts it and makes an integral float the int it equals, as artifacts compare specs;
* :func:`spec_text` is a canonical spec's exact identity (artifacts, the journal, the serving record);
  :func:`spec_key` keys the in-memory tables;
* :func:`spec_line` prints a spec in problems and warnings, :func:`spec_arg` as ``--spec`` takes it back;
* :func:`spec_parts` names a spec in an artifact's filename (``N=4096``, ``dtype=bfloat16``), each part
  ASCII ``[A-Za-z0-9._-]``: a part that sanitizing would change (``"a/b"``, ``"../x"``, a string that
  reads as a JSON number) gets a short hash of its exact text, so distinct specs never share a name.

Identity rules: spec values are JSON scalars (tuples, lists and dicts are a ``TypeError``); an integral
float is the same value as the int (``8192.0`` is ``8192``); bools, numbers and strings never match each
other (``True`` is not ``1``, ``"8192"`` is not ``8192``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

from flyreg._core.config import JSONScalar, check_scalar

#: Integral floats up to this magnitude are read as ints (beyond it a float is not exact).
_EXACT_INT = 2**53
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


# -- checking and comparing ------------------------------------------------------------------------
def normalize_spec(spec: object, what: str = "spec") -> dict[str, JSONScalar]:
    """Check ``spec`` is a mapping of str -> JSON scalar and return it as it reads back from JSON.

    Tuples become lists in JSON, so non-scalar values are rejected here rather than left to
    collide later; ints that are floats stay distinct as JSON keeps them.
    """
    if not isinstance(spec, Mapping):
        raise TypeError(f"{what} must be a dict of axis -> JSON scalar, got {type(spec).__name__}")
    out: dict[str, JSONScalar] = {}
    for k, v in spec.items():
        if not isinstance(k, str) or not k:
            raise TypeError(f"{what} axis names must be non-empty strings, got {k!r}")
        out[k] = check_scalar(v, f"{what}[{k!r}]")
    return json.loads(json.dumps(out, sort_keys=True))


def canonical_value(value: JSONScalar) -> JSONScalar:
    """``value`` as artifacts compare it: an integral float becomes the int it equals."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT_INT:
        return int(value)
    return value


def canonical_spec(spec: object, what: str = "spec") -> dict[str, JSONScalar]:
    """``spec`` checked (str -> JSON scalar, else ``TypeError``/``ValueError``), sorted, integral floats as ints."""
    return {k: canonical_value(v) for k, v in sorted(normalize_spec(spec, what).items())}


# -- keying ----------------------------------------------------------------------------------------
def spec_text(spec: Mapping[str, JSONScalar]) -> str:
    """The exact identity of a canonical spec: ``True``, ``1`` and ``"1"`` all differ."""
    return json.dumps(dict(spec), sort_keys=True, separators=(",", ":"))


def spec_key(spec: Mapping[str, JSONScalar]) -> str:
    """``spec`` as a key of the in-memory tables (types kept: ``1`` and ``True`` differ)."""
    return repr(sorted(spec.items()))


# -- printing --------------------------------------------------------------------------------------
def spec_line(spec: Mapping[str, JSONScalar]) -> str:
    """``N=2048,dtype=float32``: a spec in one line, in its own order, as problems name it."""
    return ",".join(f"{k}={v}" for k, v in spec.items())


def spec_arg(spec: Mapping[str, JSONScalar]) -> str:
    """``{"N": 4096, "dtype": "bfloat16"}`` -> ``N=4096,dtype=bfloat16``: what ``--spec`` takes back.

    Values are written as JSON, except strings that read back as themselves (``"8192"`` is quoted).
    """
    return ",".join(f"{k}={v if isinstance(v, str) and not _reads_as_json(v) else json.dumps(v)}"
                    for k, v in sorted(spec.items()))


def _reads_as_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


# -- naming ----------------------------------------------------------------------------------------
def sanitize(text: str) -> str:
    """Map ``text`` to ASCII letters, digits and ``._-`` (runs of anything else become ``_``)."""
    return _UNSAFE.sub("_", text).strip("_") or "_"


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


def spec_parts(spec: Mapping[str, JSONScalar]) -> dict[str, str]:
    """Axis part -> value part of ``spec`` (checked and canonical), sorted: how a filename names it."""
    return {name_part(k): _value_part(v) for k, v in canonical_spec(spec).items()}
