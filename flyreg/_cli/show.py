"""``flyreg show``: the config a runtime call gets for a spec, and where it comes from; without a spec, the op."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from flyreg._cli.common import check_op_names, device_option, resolve_device, spec_values, user_errors


@click.command()
@click.argument("op_name", metavar="OP")
@click.option("--spec", "specs", multiple=True, callback=spec_values, metavar="AXIS=V,...",
              help="The spec to resolve (repeatable). Without one: the op's call, axes, buckets and workloads.")
@device_option("Device to resolve for")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@user_errors
def show(op_name: str, specs: list[dict[str, Any]], device: str | None, as_json: bool) -> None:
    """Show the config a runtime call of OP with this spec gets, and where it comes from.

    The lookup is the runtime's: the scratch cache, then the offline artifacts, then the op's
    default. No search is run. For an op that declares its axes, the spec is checked against
    them (a value outside an axis' range is an error; one rounded to its bucket is shown with
    it); an ordered or bucketed axis left out stands for each of its buckets (one row each),
    and an axis with a device default left out gets the device's value. Without --spec: the
    op's call signature, axes, buckets and workloads.
    """
    from flyreg._core.keys import identity_of, parse_device
    from flyreg._plugins.record import spec_rows
    from flyreg._plugins.registry import REGISTRY
    from flyreg._runtime.resolution import what_serves

    check_op_names([op_name])
    dev = resolve_device(device)
    if not specs:
        from flyreg._cli.show_op import show_op

        show_op(op_name, dev, as_json)
        return
    tuner = REGISTRY.tuner(op_name)  # unknown or broken op: one line
    record = REGISTRY.plugin(op_name).record
    ident = identity_of(dev)
    wanted: list[dict[str, Any]] = []
    asked: list[dict[str, Any]] = []  # what the user wrote for each spec of ``wanted``
    for given in specs:
        for s in spec_rows(op_name, record, given, parse_device(dev)[0]):
            if s not in wanted:
                wanted.append(s)
                asked.append(given)
    out = []
    for spec, given in zip(wanted, asked):
        try:
            res, offline = what_serves(tuner, spec, dev)
        except Exception as e:
            raise click.ClickException(_unresolved(op_name, spec, dev, e)) from None
        row = {"op": op_name, "spec": res.spec, "given": rounded(given, res.spec),
               "device": ident.to_json(), "config": res.config.to_json(),
               "source": res.source, "path": res.path, "stale": res.stale, "nearest": res.nearest,
               "offline": offline.path if offline is not None and res.source in ("cache", "memory") else None}
        out.append((row, res.config))
    if as_json:
        click.echo(json.dumps([r for r, _ in out], indent=2))
    elif len(out) > 1:
        _show_table(op_name, ident, out)
    else:
        _show_one(op_name, ident, *out[0])


def _show_one(op: str, ident: Any, r: dict[str, Any], config: Any) -> None:
    """The resolution of one spec, a line per fact."""
    from flyreg._core.spec import spec_arg
    from flyreg._core.text import config_str

    click.echo(f"op:      {op}")
    click.echo(f"spec:    {spec_text(r)}")
    click.echo(f"device:  {ident.name} ({ident.arch})")
    click.echo(f"config:  {config_str(config)}")
    click.echo(f"source:  {r['source']}")
    if r["path"]:
        click.echo(f"path:    {r['path']}")
    for note in _notes(r):
        click.echo(f"note:    {note}")
    if r["offline"]:
        click.echo(f"offline: {r['offline']} (served once the cache entry is gone)")


def _notes(r: dict[str, Any]) -> list[str]:
    """What a resolution's fallback means, a line each: the spec, product and toolchain it was tuned for."""
    from flyreg._artifacts.names import parse_filename

    notes = []
    if r["nearest"]:
        notes.append("tuned for the nearest spec, not this one")
    parsed = parse_filename(Path(r["path"]).name) if r["path"] and r["source"] != "cache" else None
    if parsed is not None and parsed[2] != r["device"]["name"]:
        notes.append(f"tuned on {parsed[2]}, another product of the same arch {r['device']['arch']}")
    if r["stale"]:
        notes.append("stale: tuned with another toolchain; re-tune to refresh it")
    return notes


def _show_table(op: str, ident: Any, out: list[tuple[dict[str, Any], Any]]) -> None:
    """The resolutions of several specs, a table row each."""
    from rich.markup import escape
    from rich.table import Table

    from flyreg._artifacts.lookup import NEAREST, OTHER_TOOLCHAIN
    from flyreg._core.spec import spec_arg
    from flyreg._core.text import config_str, make_console

    table = Table(title=f"{op} on {ident.name} ({ident.arch})")
    for col in ("spec", "config", "source", "path"):
        table.add_column(col, overflow="fold")
    for r, config in out:
        notes = [n for n, on in (("nearest", r["nearest"] and r["source"] != NEAREST),
                                 ("stale", r["stale"] and r["source"] != OTHER_TOOLCHAIN)) if on]
        source = r["source"] + (f" ({', '.join(notes)})" if notes else "")
        table.add_row(escape(spec_text(r)), escape(config_str(config)), source, escape(r["path"] or "-"))
    make_console().print(table)


def rounded(given: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The values of ``given`` (what the user wrote) that its checked ``spec`` holds otherwise (a bucket)."""
    from flyreg._core.spec import canonical_value

    return {k: v for k, v in given.items()
            if k in spec and json.dumps(canonical_value(v)) != json.dumps(canonical_value(spec[k]))}


def spec_text(r: dict[str, Any]) -> str:
    """A resolution's spec as ``--spec`` takes it, each value the check rounded shown as written first:
    ``M=300 (bucket 4096),N=4096``."""
    from flyreg._core.spec import spec_arg

    given = r["given"]
    return ",".join(f"{spec_arg({k: given[k]})} (bucket {spec_arg({k: v}).partition('=')[2]})" if k in given
                    else spec_arg({k: v}) for k, v in sorted(r["spec"].items()))


def _unresolved(op: str, spec: dict[str, Any], device: str, e: Exception) -> str:
    """One line for a spec that resolves to nothing (or whose hooks fail on it)."""
    from flyreg._core.spec import spec_arg
    from flyreg._core.text import one_line

    if type(e) is LookupError:  # the tuner's own "no cached, offline or default config"
        return one_line(e, typed=False)
    hint = ""
    try:
        from flyreg._plugins.registry import REGISTRY

        axes = sorted({k for w in REGISTRY.plugin(op).workloads(device) for k in w})
        if axes and sorted(spec) != axes:
            hint = f" (its workloads use the axes {', '.join(axes)})"
    except Exception:
        pass
    return f"{op}: no config for spec {spec_arg(spec)}: {one_line(e)}{hint}"


