"""``flyreg list``: every registered op with its status and artifact count."""

from __future__ import annotations

import json

import click

from flyreg._cli.common import device_option, resolve_device, user_errors


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@device_option("Device to count artifacts for")
@user_errors
def list_ops(as_json: bool, device: str | None) -> None:
    """List every registered op: status, description, structural knobs, artifacts for this device."""
    from flyreg._core.keys import identity_of
    from flyreg._plugins.registry import REGISTRY, ops
    from flyreg._tuning.plan import count_artifacts

    ident = identity_of(resolve_device(device))
    rows = []
    for info in ops():
        plugin_dirs = []
        if info.status == "ok":
            config_dir = REGISTRY.plugin(info.name).record.config_dir
            plugin_dirs = [config_dir] if config_dir else []
        rows.append({
            "op": info.name, "distribution": info.distribution, "version": info.version, "status": info.status,
            "error": info.error, "description": info.description,
            "structural": list(info.structural) if info.structural is not None else None,
            "artifacts": count_artifacts(info.name, ident, plugin_dirs),
        })
    if as_json:
        click.echo(json.dumps({"device": ident.to_json(), "ops": rows}, indent=2))
        return
    from rich.markup import escape
    from rich.table import Table

    from flyreg._core.text import make_console

    table = Table(title=f"flyreg ops (device: {ident.name}, {ident.arch})")
    table.add_column("op", no_wrap=True)
    table.add_column("distribution", no_wrap=True)
    for col in ("status", "description", "structural"):
        table.add_column(col, overflow="fold")
    table.add_column("artifacts", justify="right")
    for r in rows:
        status = {"broken": f"[red]broken[/red]: {escape(str(r['error']))}",
                  "disabled": "[yellow]disabled[/yellow]"}.get(r["status"], "[green]ok[/green]")
        structural = "-" if r["status"] != "ok" else ", ".join(r["structural"]) if r["structural"] is not None \
            else "all knobs"
        table.add_row(escape(r["op"]), escape(f"{r['distribution']} {r['version']}"), status,
                      escape(r["description"]), structural, str(r["artifacts"]))
    make_console().print(table)


