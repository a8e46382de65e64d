"""The ``flyreg`` command: list, tune, show, check and cache."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ._version import __version__

F = TypeVar("F", bound=Callable[..., Any])


def _user_errors(fn: F) -> F:
    """Turn flyreg's user-facing errors into one line and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from .plugin import PluginError
        from .registry import OpUnavailableError, UnknownOpError

        try:
            return fn(*args, **kwargs)
        except (UnknownOpError, OpUnavailableError, PluginError, LookupError, ValueError, TypeError) as e:
            msg = e.args[0] if isinstance(e, LookupError) and e.args else str(e)
            raise click.ClickException(str(msg).splitlines()[0]) from None

    return wrapper  # type: ignore[return-value]


def parse_spec(text: str) -> dict[str, Any]:
    """``"N=4096,dtype=bfloat16"`` -> ``{"N": 4096, "dtype": "bfloat16"}`` (values read as JSON when they parse)."""
    spec: dict[str, Any] = {}
    for part in text.split(","):
        name, sep, raw = part.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name or not raw:
            raise click.BadParameter(f"expected AXIS=VALUE[,AXIS=VALUE...], got {text!r}", param_hint="--spec")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if isinstance(value, (dict, list)):
            raise click.BadParameter(f"axis {name!r} must be a scalar, got {raw!r}", param_hint="--spec")
        spec[name] = value
    return spec


def _specs(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> list[dict[str, Any]]:
    return [parse_spec(v) for v in values]


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="flyreg")
def cli() -> None:
    """flyreg: list, tune and serve the configs of registered GPU kernels."""


@cli.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@_user_errors
def list_ops(as_json: bool) -> None:
    """List every registered op with its status and offline artifacts for this device."""
    from .keys import identity_of
    from .tune_jobs import count_artifacts
    from .registry import REGISTRY, ops

    ident = identity_of(default_device())
    rows = []
    for info in ops():
        plugin_dir = None
        if info.status == "ok":
            plugin_dir = REGISTRY.plugin(info.name).description.config_dir
        rows.append({
            "op": info.name, "distribution": info.distribution, "version": info.version, "status": info.status,
            "error": info.error, "description": info.description,
            "structural": list(info.structural) if info.structural is not None else None,
            "artifacts": count_artifacts(info.name, ident, [plugin_dir] if plugin_dir else []),
        })
    if as_json:
        click.echo(json.dumps({"device": ident.to_json(), "ops": rows}, indent=2))
        return
    from rich.table import Table

    from .tune_jobs import make_console

    table = Table(title=f"flyreg ops (device: {ident.name}, {ident.arch})")
    for col in ("op", "distribution", "status", "description", "structural", "artifacts"):
        table.add_column(col)
    for r in rows:
        status = r["status"] if r["status"] != "broken" else f"broken: {r['error']}"
        table.add_row(r["op"], f"{r['distribution']} {r['version']}", status, r["description"],
                      ", ".join(r["structural"] or []) or "all knobs", str(r["artifacts"]))
    make_console().print(table)


@cli.command()
@click.argument("op_names", nargs=-1, metavar="[OP]...")
@click.option("--spec", "specs", multiple=True, callback=_specs, metavar="AXIS=V,...",
              help="Tune this spec instead of the op's workloads (repeatable).")
@click.option("--device", default=None, help="cuda, cuda:N or cpu (default: a GPU if present).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Artifact dir (default: FLYREG_CONFIG_DIR, else the user config dir).")
@click.option("--force", is_flag=True, help="Re-tune specs that already have a current artifact.")
@click.option("--dry-run", is_flag=True, help="Show the jobs without tuning.")
@_user_errors
def tune(op_names: tuple[str, ...], specs: list[dict[str, Any]], device: str | None, out: Path | None,
         force: bool, dry_run: bool) -> None:
    """Tune every registered op (or the OPs given) and write their offline artifacts."""
    from .tune_jobs import plan_jobs, run_jobs

    device = device or default_device()
    jobs = plan_jobs(list(op_names), specs, device, out, force)
    code = run_jobs(jobs, device, out, dry_run)
    sys.exit(code)


@cli.command()
@click.argument("op_name", metavar="OP")
@click.option("--spec", "specs", multiple=True, required=True, callback=_specs, metavar="AXIS=V,...")
@click.option("--device", default=None, help="cuda, cuda:N or cpu (default: a GPU if present).")
@_user_errors
def show(op_name: str, specs: list[dict[str, Any]], device: str | None) -> None:
    """Show the config a runtime call of OP with this spec gets, and where it comes from."""
    from .registry import resolve_spec

    for spec in specs:
        res = resolve_spec(op_name, spec, device or default_device())
        where = f" ({res.path})" if res.path else ""
        flags = "".join(f" [{f}]" for f in ("stale", "nearest") if getattr(res, f))
        click.echo(f"{op_name} {json.dumps(res.spec, sort_keys=True)}: {res.config} from {res.origin}{where}{flags}")


@cli.command()
@click.argument("dirs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--strict", is_flag=True, help="Fail on stale artifacts too.")
@_user_errors
def check(dirs: tuple[Path, ...], strict: bool) -> None:
    """Validate offline artifacts (default: every lookup directory)."""
    from .offline import OfflineStore
    from .registry import REGISTRY, ops
    from .validate import check_artifacts

    known = {i.name: REGISTRY.plugin(i.name).description.version for i in ops() if i.status == "ok"}
    targets = list(dirs) or [d for d in OfflineStore("", [], (), "0").dirs() if d.is_dir()]
    problems = check_artifacts(targets, known)
    n_files = sum(len(list(Path(d).glob("*.json"))) for d in targets if Path(d).is_dir())
    for p in problems:
        click.echo(str(p))
    failing = [p for p in problems if p.severity == "error" or strict]
    click.echo(f"checked {n_files} artifact(s) in {len(targets)} dir(s): {len(failing)} problem(s)"
               + (f", {len(problems) - len(failing)} stale" if len(problems) > len(failing) else ""))
    if failing:
        sys.exit(1)


@cli.group()
def cache() -> None:
    """The scratch disk cache."""


@cache.command("path")
@click.argument("op_name", required=False, metavar="[OP]")
def cache_path(op_name: str | None) -> None:
    """Print the cache directory, or OP's cache file."""
    from . import cache as scratch

    click.echo(str(scratch.cache_file(op_name) if op_name else scratch.cache_dir()))


@cache.command("clear")
@click.argument("op_name", required=False, metavar="[OP]")
def cache_clear(op_name: str | None) -> None:
    """Delete OP's cache file, or all of them."""
    from . import cache as scratch

    removed = scratch.clear(op_name)
    click.echo(f"removed {len(removed)} cache file(s) from {scratch.cache_dir()}")


def main() -> None:
    """Console entry point."""
    try:
        code = cli.main(prog_name="flyreg", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("flyreg: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        click.echo(f"flyreg: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
