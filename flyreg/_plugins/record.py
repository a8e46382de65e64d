"""The op record: what an op's ``describe`` hook returns, its spec axes, and the check of every spec against them.

An op that declares no axes keeps its axes implicit: its specs are whatever ``specialize`` and
its workloads give, checked only for being JSON scalars.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from flyreg._core.config import JSONScalar
from flyreg._core.keys import SpecError
from flyreg._core.search_terms import check_in_place_names, check_strategy, check_timing, names_of
from flyreg._core.spec import canonical_value
from flyreg._plugins.schema import Schema, SchemaError, mark_mutated, parse_schema

#: The types an axis may have.
AXIS_TYPES: dict[type, str] = {int: "int", str: "str", float: "float", bool: "bool"}
#: The keys a legacy ``describe()`` dict may have (each one is the record field of that name).
DESCRIBE_KEYS = frozenset({"description", "version", "structural", "restore_value", "reset_to_zero",
                           "ordered_axes", "config_dir", "key_env", "arg_names", "timing", "strategy"})


class RecordError(ValueError):
    """An op record (or a legacy ``describe()`` dict) that is malformed; the message names the field."""


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _typed(kind: type, value: Any) -> JSONScalar:
    """``value`` as a value of ``kind``, else ValueError saying why: ints pass as floats, integral floats as ints."""
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is str:
        ok = isinstance(value, str)
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        ok = False
    elif kind is int and isinstance(value, float):
        ok = value.is_integer()
        value = int(value) if ok else value
    else:
        ok = True
        value = float(value) if kind is float else value
    if not ok:
        raise ValueError(f"{value!r} is not of type {AXIS_TYPES[kind]}")
    return value


def _tuple(value: Any) -> Any:
    """A list (or other iterable) as a tuple; None, a str, a callable or a non-iterable as is, for the check to name."""
    if value is None or isinstance(value, str) or callable(value):
        return value
    try:
        return tuple(value)
    except TypeError:
        return value


@attrs.frozen
class Axis:
    """One spec axis of an op.

    ``type``: ``int``, ``str``, ``float`` or ``bool``. ``values``: the allowed values, where they
    are finite. ``ordered``: a numeric axis along which a spec with no artifact of its own
    borrows the nearest tuned spec's. ``buckets``: the values a given one is rounded to, either a
    tuple (the smallest bucket >= the value, else the largest) or a callable of the value.
    ``device_default``: a callable of the device type (``"cpu"`` or ``"cuda"``) giving the value
    when a spec leaves the axis out and the device is known. ``low`` and ``high``: the range of a
    numeric axis (inclusive; None: open); a value outside it is refused, never bucketed.
    """

    name: str
    type: type
    values: tuple[JSONScalar, ...] | None = attrs.field(default=None, converter=_tuple)
    ordered: bool = False
    buckets: tuple[int | float, ...] | Callable[[Any], JSONScalar] | None = attrs.field(default=None, converter=_tuple)
    device_default: Callable[[str], JSONScalar] | None = None
    low: int | float | None = None
    high: int | float | None = None

    def __attrs_post_init__(self) -> None:
        where = f"Axis {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise RecordError(f"Axis name must be a non-empty str, got {self.name!r}")
        if not any(self.type is t for t in AXIS_TYPES):
            raise RecordError(f"{where}: type must be one of int, str, float, bool, got {self.type!r}")
        if self.values is not None:
            if not isinstance(self.values, tuple) or not self.values:
                raise RecordError(f"{where}: values must be a non-empty tuple of allowed values, got {self.values!r}")
            object.__setattr__(self, "values", tuple(self._member(v, "values") for v in self.values))
        numeric = self.type is int or self.type is float
        if not isinstance(self.ordered, bool):
            raise RecordError(f"{where}: ordered must be a bool, got {self.ordered!r}")
        if self.ordered and not numeric:
            raise RecordError(f"{where}: only an int or float axis can be ordered (nearest lookup), "
                              f"not a {AXIS_TYPES[self.type]} one")
        if self.buckets is not None and not callable(self.buckets):
            steps = tuple(self._member(b, "buckets") for b in self.buckets) if isinstance(self.buckets, tuple) else ()
            if not numeric or not steps or any(a >= b for a, b in zip(steps, steps[1:])):  # type: ignore[operator]
                raise RecordError(f"{where}: buckets must be a callable or a non-empty ascending tuple of "
                                  f"numbers (of an int or float axis), got {self.buckets!r}")
            object.__setattr__(self, "buckets", steps)
        if self.device_default is not None and not callable(self.device_default):
            raise RecordError(f"{where}: device_default must be a callable of the device type, "
                              f"got {self.device_default!r}")
        if (self.low is not None or self.high is not None) and not numeric:
            raise RecordError(f"{where}: only an int or float axis has a range (low, high), "
                              f"not a {AXIS_TYPES[self.type]} one")
        for field in ("low", "high"):
            if getattr(self, field) is not None:
                object.__setattr__(self, field, self._member(getattr(self, field), field))
        if self.low is not None and self.high is not None and self.low > self.high:  # type: ignore[operator]
            raise RecordError(f"{where}: low {self.low!r} is above high {self.high!r}")

    def _member(self, value: Any, field: str) -> JSONScalar:
        try:
            return _typed(self.type, value)
        except ValueError as e:
            raise RecordError(f"Axis {self.name!r}: {field} must be of its type: {e}") from None

    def normalize(self, value: Any) -> JSONScalar:
        """``value`` typed, bucketed and checked against ``values``; ValueError saying what is wrong."""
        value = _typed(self.type, value)
        if not self.within(value):
            raise ValueError(f"{_show(value)} is out of its range {self.range_text()}")
        if isinstance(self.buckets, tuple):
            value = next((b for b in self.buckets if value <= b), self.buckets[-1])  # type: ignore[operator]
        elif self.buckets is not None:
            value = _typed(self.type, self.buckets(value))
        if self.values is not None and value not in self.values:
            raise ValueError(f"{_show(value)} is not one of {'|'.join(map(_show, self.values))}")
        return value

    def within(self, value: Any) -> bool:
        """Whether a typed ``value`` is in the axis' range."""
        return not ((self.low is not None and value < self.low) or (self.high is not None and value > self.high))

    def range_text(self) -> str | None:
        """``>= 1``, ``<= 8`` or ``1..8``: the range (None: open)."""
        if self.low is not None and self.high is not None:
            return f"{_show(self.low)}..{_show(self.high)}"
        if self.low is not None:
            return f">= {_show(self.low)}"
        return f"<= {_show(self.high)}" if self.high is not None else None

    def choices(self) -> tuple[JSONScalar, ...] | None:
        """The values a spec that leaves this axis out stands for: one per bucket of an ordered or bucketed axis."""
        if not (self.ordered or self.buckets is not None):
            return None
        return self.values or (self.buckets if isinstance(self.buckets, tuple) else None)

    def summary(self) -> str:
        """``M (int, ordered, buckets 1|32|256)``: the axis as an error message lists it."""
        parts = [AXIS_TYPES[self.type]]
        if self.ordered:
            parts.append("ordered")
        if self.range_text() is not None:
            parts.append(str(self.range_text()))
        steps = self.choices() if self.buckets is not None else None
        if steps:
            parts.append(f"buckets {'|'.join(map(_show, steps))}")
        elif self.buckets is not None:
            parts.append("bucketed")
        if self.values is not None and not steps:
            parts.append(f"one of {'|'.join(map(_show, self.values))}")
        if self.device_default is not None:
            parts.append("default from the device")
        return f"{self.name} ({', '.join(parts)})"


def _checked_field(check: Callable[..., Any], *args: Any) -> Any:
    """What ``check`` (one of :mod:`flyreg._core.search_terms`' checks, which the search settings share)
    makes of a field, its error a :class:`RecordError`."""
    try:
        return check("", *args)
    except (TypeError, ValueError) as e:
        raise RecordError(str(e)) from None


def _names(field: str, optional: bool = False) -> Callable[[Any], tuple[str, ...] | None]:
    """A converter of a list of names to a tuple, raising :class:`RecordError` naming ``field``."""

    def convert(value: Any) -> tuple[str, ...] | None:
        if value is None:  # a legacy dict's way of leaving it out
            return None if optional else ()
        return _checked_field(names_of, field, value)  # type: ignore[no-any-return]

    return convert


def _text(field: str, default: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value is None:  # a legacy dict's way of leaving it out
            return default
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise RecordError(f"{field} must be a string, got {value!r}")
        return str(value)

    return convert


def _path(value: Any) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise RecordError(f"config_dir must be a path, got {value!r}")
    return Path(value)


def _axes(value: Any) -> tuple[Axis, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, Axis) for a in value):
        raise RecordError(f"axes must be a list of Axis, got {value!r}")
    return tuple(value)


@attrs.frozen
class OpRecord:
    """What an op declares about itself; every field is optional. Checked when made.

    ``strategy`` names the search strategy the op prefers for a large config space (a name in
    :data:`flyreg._core.search_terms.STRATEGIES`); None lets flyreg choose.
    ``ordered_axes`` is for an op that declares no ``axes``; otherwise it is derived from the
    axes' ``ordered`` flags. ``restore_value`` and ``reset_to_zero`` must be among ``arg_names``.

    ``torch_schema`` (``"(Tensor x, Tensor weight, float eps=1e-06) -> Tensor"``, no op name)
    makes the op ``torch.ops.flyreg.<op>`` (see :mod:`flyreg.torch`); the in-place arguments are
    marked mutated in it from ``restore_value`` and ``reset_to_zero``. Its fake (meta)
    implementation is ``torch_fake`` (a function of the op's arguments returning empty outputs),
    or derived from ``output_like``: the name of the Tensor argument whose shape, dtype and
    device the one output has. A schema returning ``()`` needs neither.
    """

    description: str = attrs.field(default="", converter=_text("description", ""))
    version: str = attrs.field(default="0", converter=_text("version", "0"))
    structural: tuple[str, ...] | None = attrs.field(default=None, converter=_names("structural", optional=True))
    arg_names: tuple[str, ...] | None = attrs.field(default=None, converter=_names("arg_names", optional=True))
    restore_value: tuple[str, ...] = attrs.field(default=(), converter=_names("restore_value"))
    reset_to_zero: tuple[str, ...] = attrs.field(default=(), converter=_names("reset_to_zero"))
    axes: tuple[Axis, ...] = attrs.field(default=(), converter=_axes)
    ordered_axes: tuple[str, ...] = attrs.field(default=(), converter=_names("ordered_axes"))
    config_dir: Path | None = attrs.field(default=None, converter=_path)
    key_env: tuple[str, ...] = attrs.field(default=(), converter=_names("key_env"))
    timing: str = "steady"
    strategy: str | None = None
    torch_schema: str | None = None
    torch_fake: Callable[..., Any] | None = None
    output_like: str | None = None

    def __attrs_post_init__(self) -> None:
        _checked_field(check_timing, self.timing)
        _checked_field(check_strategy, self.strategy)
        _checked_field(check_in_place_names, self.restore_value, self.reset_to_zero, self.arg_names)
        self._check_torch()
        names = [a.name for a in self.axes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise RecordError(f"axes declares {twice} more than once")
        if self.axes:
            flagged = tuple(a.name for a in self.axes if a.ordered)
            if self.ordered_axes and self.ordered_axes != flagged:
                raise RecordError(f"ordered_axes {list(self.ordered_axes)} is derived from the axes; "
                                  f"mark those axes Axis(..., ordered=True) instead")
            object.__setattr__(self, "ordered_axes", flagged)

    def _check_torch(self) -> None:
        if self.torch_schema is None:
            extra = [f for f in ("torch_fake", "output_like") if getattr(self, f) is not None]
            if extra:
                raise RecordError(f"{' and '.join(extra)} describe a torch op, but no torch_schema is given")
            return
        schema = self.schema()
        assert schema is not None
        if self.arg_names is not None and schema.names[:len(self.arg_names)] != self.arg_names:
            raise RecordError(f"torch_schema's arguments {list(schema.names)} must begin with arg_names "
                              f"{list(self.arg_names)}, in order")
        if self.torch_fake is not None and not callable(self.torch_fake):
            raise RecordError(f"torch_fake must be a function of the op's arguments, got {self.torch_fake!r}")
        if self.output_like is not None:
            like = schema.arg(self.output_like) if isinstance(self.output_like, str) else None
            if like is None or not like.is_tensor:
                raise RecordError(f"output_like must name a Tensor argument of torch_schema "
                                  f"{[a.name for a in schema.args if a.is_tensor]}, got {self.output_like!r}")
            if self.torch_fake is not None:
                raise RecordError("give torch_fake or output_like, not both")
            if schema.returns.replace(" ", "") != "Tensor":
                raise RecordError(f"output_like derives one new Tensor; torch_schema returns {schema.returns!r}: "
                                  f"give a torch_fake instead")
        elif self.torch_fake is None and not schema.returns_nothing:
            raise RecordError(f"torch_schema returns {schema.returns!r}: give output_like (the argument the output "
                              f"is shaped like) or a torch_fake")

    def schema(self) -> Schema | None:
        """The parsed ``torch_schema`` with its in-place arguments marked mutated; None without one."""
        if self.torch_schema is None:
            return None
        try:
            return mark_mutated(parse_schema(self.torch_schema), (*self.restore_value, *self.reset_to_zero))
        except SchemaError as e:
            raise RecordError(str(e)) from None

    @classmethod
    def of(cls, raw: object) -> OpRecord:
        """The record of what ``describe()`` returned: a record, a legacy dict of its fields, or None."""
        if raw is None:
            return cls()
        if isinstance(raw, OpRecord):
            return raw
        if not isinstance(raw, Mapping):
            raise RecordError(f"describe() must return an OpRecord (or a dict of its fields), got {type(raw).__name__}")
        unknown = set(raw) - DESCRIBE_KEYS
        if unknown:
            raise RecordError(f"describe() returned unknown keys {sorted(map(str, unknown))}; "
                              f"known: {sorted(DESCRIBE_KEYS)}")
        return cls(**raw)


def check_spec(op: str, record: OpRecord, spec: Mapping[str, Any], device: str | None = None) -> dict[str, JSONScalar]:
    """``spec`` checked against the op's declared axes and normalized (typed, bucketed).

    With ``device`` (``"cpu"`` or ``"cuda"``) an axis left out that has a ``device_default``
    gets it. Without, the spec is one as stored (an artifact): complete, and already what the
    check makes of it. Any problem raises one :class:`SpecError` naming the op, every offending
    axis, and the allowed axes and values. An op that declares no axes gets ``spec`` back as is.
    """
    return _checked(op, record, spec, device, spec)


def _checked(op: str, record: OpRecord, spec: Mapping[str, Any], device: str | None,
             given: Mapping[str, Any]) -> dict[str, JSONScalar]:
    """:func:`check_spec`, naming ``given`` (what the user wrote) as the spec in its error."""
    if not record.axes:
        return dict(spec)
    declared = {a.name: a for a in record.axes}
    problems: list[str] = []
    missing = [a.name for a in record.axes if a.name not in spec and (device is None or a.device_default is None)]
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    for name in (k for k in spec if k not in declared):
        close = difflib.get_close_matches(str(name), list(declared), n=1)
        problems.append(f"unknown axis {name}" + (f" (did you mean {close[0]}?)" if close else ""))
    out: dict[str, JSONScalar] = {}
    for axis in record.axes:
        if axis.name in spec:
            value, source = spec[axis.name], ""
        elif device is not None and axis.device_default is not None:
            value, source = axis.device_default(device), f" (its default on {device})"
        else:
            continue
        try:
            out[axis.name] = axis.normalize(value)
        except (ValueError, TypeError) as e:  # TypeError: from an op's bucketing rule
            problems.append(f"{axis.name}{source}: {e}")
            continue
        if device is None and json.dumps(canonical_value(out[axis.name])) != json.dumps(canonical_value(value)):
            problems.append(f"{axis.name}: {_show(value)} is not normalized (the op makes it {_show(out[axis.name])})")
    if problems:
        raise SpecError(f"{op}: spec {dict(given)} does not fit the op's axes: {'; '.join(problems)}. "
                        f"Axes: {'; '.join(a.summary() for a in record.axes)}")
    return out


def spec_rows(op: str, record: OpRecord, spec: Mapping[str, Any], device: str) -> list[dict[str, JSONScalar]]:
    """The checked specs ``spec`` stands for on ``device``: one per bucket of each ordered or bucketed axis
    it leaves out (in declaration order), the device's defaults filled in. Raises one :class:`SpecError`."""
    open_axes = [a for a in record.axes if a.name not in spec and a.choices()]
    grid = itertools.product(*(a.choices() or () for a in open_axes))
    rows = [{**spec, **{a.name: v for a, v in zip(open_axes, values)}} for values in grid]
    return [_checked(op, record, row, device, spec) for row in rows]
