"""``flyreg show OP`` without a spec: what the op takes, its call signature, spec axes, buckets and workloads."""

from __future__ import annotations

import json
from typing import Any

import click

from flyreg._core.keys import DeviceIdentity
from flyreg._core.spec import spec_arg
from flyreg._core.text import one_line
from flyreg._plugins.record import AXIS_TYPES, Axis, OpRecord

#: The device types an axis' device default is shown for.
DEVICE_TYPES = ("cpu", "cuda")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def signature(op: str, record: OpRecord, arg_names: tuple[str, ...]) -> str | None:
    """``rmsnorm(Tensor x, Tensor weight, float eps=1e-06) -> Tensor`` from the torch schema, else
    ``op(x, weight)`` from the argument names (the record's, else the tuner's); None when neither is known."""
    schema = record.schema()
    if schema is not None:
        return f"{op}({', '.join(a.text() for a in schema.args)}) -> {schema.returns}"
    names = record.arg_names or arg_names
    return f"{op}({', '.join(names)})" if names else None


def bucket_rule(axis: Axis) -> str | None:
    """How a value is rounded to its bucket, in words (None: it is not)."""
    if axis.buckets is None:
        return None
    if isinstance(axis.buckets, tuple):
        return "the smallest bucket at least the value, the largest above them"
    name = getattr(axis.buckets, "__name__", type(axis.buckets).__name__)
    doc = (getattr(axis.buckets, "__doc__", None) or "").strip().splitlines()
    if name == "<lambda>":
        return "by a function of the value"
    return f"{name}: {doc[0]}" if doc else f"by {name}"


def device_defaults(axis: Axis) -> dict[str, Any]:
    """The value a spec leaving ``axis`` out gets on each device type (the error, where the op's rule raises)."""
    if axis.device_default is None:
        return {}
    out: dict[str, Any] = {}
    for device in DEVICE_TYPES:
        try:
            out[device] = axis.device_default(device)
        except Exception as e:  # an op's rule: shown, never fatal
            out[device] = f"<{one_line(e)}>"
    return out


def axis_json(axis: Axis) -> dict[str, Any]:
    return {"name": axis.name, "type": AXIS_TYPES[axis.type], "values": list(axis.values) if axis.values else None,
            "low": axis.low, "high": axis.high, "ordered": axis.ordered,
            "buckets": list(axis.choices() or ()) if axis.buckets is not None else None,
            "bucket_rule": bucket_rule(axis), "device_default": device_defaults(axis) or None}


def axis_lines(axis: Axis) -> list[str]:
    """One axis as ``show`` prints it: its type and what it allows on the first line, its buckets and device
    default under it."""
    facts = [AXIS_TYPES[axis.type]]
    if axis.ordered:
        facts.append("ordered (an untuned spec borrows the nearest tuned one's config)")
    if axis.range_text() is not None:
        facts.append(str(axis.range_text()))
    if axis.values is not None and axis.buckets is None:
        facts.append(f"one of {'|'.join(map(_text, axis.values))}")
    lines = [", ".join(facts)]
    rule = bucket_rule(axis)
    if rule is not None:
        steps = axis.choices()
        lines.append(f"buckets {'|'.join(map(_text, steps))}; {rule}" if steps else f"bucketed {rule}")
    defaults = device_defaults(axis)
    if defaults:
        lines.append("default from the device: " + ", ".join(f"{_text(v)} on {d}" for d, v in defaults.items()))
    return lines


def overview(op: str, record: OpRecord, arg_names: tuple[str, ...], ident: DeviceIdentity, device: str,
             workloads: list[dict[str, Any]] | str) -> dict[str, Any]:
    """What ``show OP`` prints, as JSON; ``workloads`` are the op's on ``device``, or why there are none."""
    return {"op": op, "description": record.description, "version": record.version,
            "call": signature(op, record, arg_names), "device": ident.to_json(),
            "axes": [axis_json(a) for a in record.axes] if record.axes else None,
            "workloads": workloads}


def print_overview(data: dict[str, Any], record: OpRecord, device: str) -> None:
    """The text form of :func:`overview` on ``device``, a line per fact, an indented block per axis and workload."""
    click.echo(f"op:        {data['op']}")
    if data["description"]:
        click.echo(f"about:     {data['description']}")
    click.echo(f"version:   {data['version']}")
    click.echo(f"call:      {data['call'] or 'not declared (no arg_names or torch_schema in its record)'}")
    click.echo(f"device:    {data['device']['name']} ({data['device']['arch']})")
    if not record.axes:
        click.echo("axes:      not declared: a spec is whatever the op's specialize() computes")
    else:
        click.echo("axes:")
        width = max(len(a.name) for a in record.axes)
        for axis in record.axes:
            first, *rest = axis_lines(axis)
            click.echo(f"  {axis.name:<{width}}  {first}")
            for line in rest:
                click.echo(f"  {'':<{width}}  {line}")
    workloads = data["workloads"]
    if isinstance(workloads, str):
        click.echo(f"workloads: {workloads}")
        return
    click.echo(f"workloads: {len(workloads)} on {device} (what `flyreg tune {data['op']}` tunes there)")
    for spec in workloads:
        click.echo(f"  {spec_arg(spec)}")


def show_op(op: str, device: str, as_json: bool) -> None:
    """Print op ``op``'s overview on ``device`` (``flyreg show OP``)."""
    from flyreg._core.keys import identity_of
    from flyreg._plugins.registry import REGISTRY

    tuner = REGISTRY.tuner(op)  # unknown or broken op: one line
    plugin = REGISTRY.plugin(op)
    workloads: list[dict[str, Any]] | str
    try:
        raw = plugin.workloads(device)
        workloads = [plugin.check_spec(w, device) for w in raw] if raw else "none declared for this device"
    except Exception as e:  # the op's hook: shown, never fatal
        workloads = f"workloads() failed: {one_line(e)}"
    data = overview(op, plugin.record, tuple(tuner.settings.arg_names), identity_of(device), device, workloads)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        print_overview(data, plugin.record, device)
