"""The ``flyreg`` command: list, tune, show, check and cache.

Never imported by ``import flyreg``: click and rich load only when the command runs.

Exit codes: 0 success; 1 a failure (a job that failed, a broken op named on its own, an
artifact problem found by ``check``); 2 a usage error (bad option or value, unknown op);
130 interrupted by Ctrl-C (143 by SIGTERM during ``tune``). Every user error is one line on
stderr, ``flyreg: error: ...``, with no traceback.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from flyreg._version import __version__

F = TypeVar("F", bound=Callable[..., Any])

_DEVICE = re.compile(r"(cpu|cuda)(?::(\d+))?")


def _user_errors(fn: F) -> F:
    """Turn flyreg's user-facing errors into one line and a non-zero exit (2 for an unknown op or a bad spec)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from flyreg._core.keys import SpecError
        from flyreg._plugins.manager import PluginError
        from flyreg._plugins.registry import OpUnavailableError, UnknownOpError
        from flyreg._cli.tune_jobs import one_line

        try:
            return fn(*args, **kwargs)
        except (UnknownOpError, SpecError) as e:
            raise click.UsageError(one_line(e, typed=False)) from None
        except (OpUnavailableError, PluginError, LookupError, ValueError, TypeError) as e:
            raise click.ClickException(one_line(e, typed=False)) from None
        except OSError as e:
            where = f": {e.filename}" if e.filename else ""
            raise click.ClickException(f"{e.strerror or e}{where}") from None

    return wrapper  # type: ignore[return-value]


# -- option parsing ---------------------------------------------------------------------------------
def parse_spec(text: str, option: str = "--spec") -> dict[str, Any]:
    """``"N=4096,dtype=bfloat16"`` -> ``{"N": 4096, "dtype": "bfloat16"}`` (values read as JSON when they parse);
    errors name ``option``."""
    spec: dict[str, Any] = {}
    for part in text.split(","):
        name, sep, raw = part.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name or not raw:
            raise click.BadParameter(f"expected AXIS=VALUE[,AXIS=VALUE...], got {text!r}", param_hint=option)
        if name in spec:
            raise click.BadParameter(f"axis {name!r} given twice in {text!r}", param_hint=option)
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if isinstance(value, (dict, list)):
            raise click.BadParameter(f"axis {name!r} must be a scalar, got {raw!r}", param_hint=option)
        if isinstance(value, float) and not math.isfinite(value):  # json reads NaN and Infinity
            raise click.BadParameter(f"axis {name!r} must be finite, got {raw!r}", param_hint=option)
        spec[name] = value
    return spec


def _specs(_ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in values:
        spec = parse_spec(v, param.opts[0] if param.opts else "--spec")
        if spec not in out:
            out.append(spec)
    return out


def _device_syntax(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Reject a malformed ``--device`` at once, before torch is imported."""
    if value is None:
        return None
    m = _DEVICE.fullmatch(value.strip().lower())
    if m is None or (m[1] == "cpu" and m[2] not in (None, "0")):
        raise click.BadParameter(f"expected cpu, cuda or cuda:N, got {value!r}", param_hint="--device")
    return "cpu" if m[1] == "cpu" else m[0]


def _ray_address(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--ray``'s address ("local" when given alone); Ray must be installed."""
    if value is None:
        return None
    from flyreg._cli.ray_pool import ray_missing

    missing = ray_missing()
    if missing is not None:
        raise click.ClickException(missing)
    if value not in ("local", "auto") and ":" not in value:
        raise click.BadParameter(f"expected a Ray address (HOST:PORT, ray://HOST:PORT or auto), got {value!r}; "
                                 f"for a local instance put --ray after the OPs, or write --ray=local",
                                 param_hint="--ray")
    return value


def resolve_device(device: str | None) -> str:
    """``device`` (already syntax-checked) checked against this machine; None picks a GPU if present."""
    if device == "cpu":
        return device
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA support"
        raise click.BadParameter(f"{device!r}: no CUDA device is available here (torch {torch.__version__}, {build})",
                                 param_hint="--device")
    count = torch.cuda.device_count()
    _, _, index = device.partition(":")
    if index and int(index) >= count:
        raise click.BadParameter(f"{device!r}: no such device; this machine has {count} CUDA device(s), "
                                 f"cuda:0 to cuda:{count - 1}", param_hint="--device")
    return device


def _check_op_names(names: list[str]) -> None:
    """Raise UnknownOpError (with the closest name) for the first name no distribution registers."""
    from flyreg._plugins.registry import REGISTRY

    known = set(REGISTRY.names())
    for name in names:
        if name not in known:
            REGISTRY.plugin(name)  # raises the registry's own "unknown op ...; did you mean ...?"


def _out_dir(out: Path | None, create: bool) -> Path:
    """The artifact directory, checked writable (and created unless ``create`` is false)."""
    from flyreg._artifacts.store import emit_dir
    from flyreg._core.settings import current, expand_path

    given = out is not None
    directory = (expand_path(str(out)) if out is not None else emit_dir()).absolute()
    what = "--out" if given else ("FLYREG_CONFIG_DIR" if current().config_dirs else "config dir")
    if directory.exists() and not directory.is_dir():
        raise click.BadParameter(f"{str(directory)!r} is not a directory", param_hint=what)
    if not create:
        return directory
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise click.BadParameter(f"cannot create {str(directory)!r}: {e.strerror or e}", param_hint=what) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{str(directory)!r} is not writable", param_hint=what)
    return directory


def _device_option(what: str) -> Callable[[F], F]:
    """The ``--device`` option; ``what`` starts its help (``Device to tune on``)."""
    return click.option("--device", default=None, callback=_device_syntax, metavar="cpu|cuda[:N]",
                        help=f"{what} (default: a GPU if present, else the CPU).")


# -- the commands -------------------------------------------------------------------------------------
class _Group(click.Group):
    """The ``flyreg`` group: its help ends with every environment variable flyreg reads."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from flyreg._core.settings import help_rows

        with formatter.section("Environment (a bad value warns and the default is used)"):
            formatter.write_dl(help_rows())


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="flyreg")
def cli() -> None:
    """flyreg: list, tune and serve the configs of registered GPU kernels."""


@cli.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@_device_option("Device to count artifacts for")
@_user_errors
def list_ops(as_json: bool, device: str | None) -> None:
    """List every registered op: status, description, structural knobs, artifacts for this device."""
    from flyreg._core.keys import identity_of
    from flyreg._plugins.registry import REGISTRY, ops
    from flyreg._cli.tune_jobs import count_artifacts

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

    from flyreg._cli.tune_jobs import make_console

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


@cli.command()
@click.argument("op_names", nargs=-1, metavar="[OP]...")
@click.option("--spec", "specs", multiple=True, callback=_specs, metavar="AXIS=V,...",
              help="Tune this spec instead of the op's workloads (repeatable; needs OP).")
@click.option("--where", "where", multiple=True, callback=_specs, metavar="AXIS=V,...",
              help="Tune only the workloads with these axis values (repeatable: any of them).")
@_device_option("Device to tune on")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Artifact dir (default: the first FLYREG_CONFIG_DIR entry, else the user config dir).")
@click.option("--force", is_flag=True, help="Re-tune specs that already have a current artifact in the artifact dir.")
@click.option("--dry-run", is_flag=True, help="List the jobs and what would happen to each; tune nothing.")
@click.option("--effort", type=click.Choice(["auto", "quick", "full"]), default="auto", show_default=True,
              help="How much of each spec's config space to time: full (all), quick (a seeded local search), "
                   "auto (full for a small space, quick for a large one).")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Seconds each spec's search may take before its final round (default: no limit).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the local search's random choices.")
@click.option("--fresh", is_flag=True, help="Time every config again instead of reading the tuning journal.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, callback=_ray_address,
              metavar="[ADDRESS]", help="Tune on Ray actors, one per GPU: a local instance, or the cluster at ADDRESS "
                                        "(HOST:PORT, ray://HOST:PORT or auto). Needs flyreg[ray].")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --ray: how many actors (default: one per GPU, or one per CPU when tuning on the CPU).")
@click.option("--device-name", default=None, metavar="NAME",
              help="With --ray: tune only on the actors whose device is this model (as `flyreg list` names it).")
@_user_errors
def tune(op_names: tuple[str, ...], specs: list[dict[str, Any]], where: list[dict[str, Any]], device: str | None,
         out: Path | None, force: bool, dry_run: bool, effort: str, budget: float | None, seed: int,
         fresh: bool, ray_address: str | None, workers: int | None, device_name: str | None) -> None:
    """Tune every registered op (or the OPs given) and write their offline artifacts.

    Each op is tuned over the workloads it declares for the device, or over the --spec values.
    A spec whose artifact in the artifact dir is current (lookup would serve it: named by its
    content, for this device, a config the op offers, the same toolchain) is skipped unless
    --force; a malformed one is moved aside before it is re-tuned. A failing op or spec is reported and the others still run; the exit code is then 1.
    Ctrl-C stops after keeping the artifacts written so far (exit 130). Every measurement is
    journaled as it is taken: the same command run again times nothing already measured.
    """
    from flyreg._cli.tune_jobs import plan_jobs, print_plan, run_jobs

    names = list(dict.fromkeys(op_names))
    if specs and not names:
        raise click.UsageError("--spec needs the OP(s) to tune: each op has its own spec axes")
    if specs and where:
        raise click.UsageError("--where filters the ops' workloads; with --spec there are none to filter")
    _check_op_names(names)
    options = {"effort": effort, "budget_s": budget, "seed": seed, "resume": not fresh}
    if ray_address is not None:
        from flyreg._cli.ray_tune import Request, tune_on_ray

        if device is not None and device not in ("cpu", "cuda"):
            raise click.BadParameter("with --ray, cpu or cuda: Ray gives each actor its GPU", param_hint="--device")
        request = Request(names, specs, where, _out_dir(out, create=not dry_run), force, options)
        sys.exit(tune_on_ray(request, ray_address, device, workers, device_name, dry_run))
    if workers is not None or device_name is not None:
        raise click.UsageError(f"{'--workers' if workers is not None else '--device-name'} needs --ray")
    dev = resolve_device(device)
    out_dir = _out_dir(out, create=not dry_run)
    jobs = plan_jobs(names, specs, dev, out_dir, force, where)
    if dry_run:
        print_plan(jobs, dev, out_dir)
        sys.exit(0)
    sys.exit(run_jobs(jobs, dev, out_dir, force, options))


@cli.command()
@click.argument("op_name", metavar="OP")
@click.option("--spec", "specs", multiple=True, required=True, callback=_specs, metavar="AXIS=V,...",
              help="The spec to resolve (repeatable).")
@_device_option("Device to resolve for")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@_user_errors
def show(op_name: str, specs: list[dict[str, Any]], device: str | None, as_json: bool) -> None:
    """Show the config a runtime call of OP with this spec gets, and where it comes from.

    The lookup is the runtime's: the scratch cache, then the offline artifacts, then the op's
    default. No search is run. For an op that declares its axes, the spec is checked against
    them; an ordered or bucketed axis left out stands for each of its buckets (one row each),
    and an axis with a device default left out gets the device's value.
    """
    from flyreg._core.keys import identity_of, parse_device
    from flyreg._plugins.record import spec_rows
    from flyreg._plugins.registry import REGISTRY
    from flyreg._runtime.resolution import what_serves

    tuner = REGISTRY.tuner(op_name)  # unknown or broken op: one line
    record = REGISTRY.plugin(op_name).record
    dev = resolve_device(device)
    ident = identity_of(dev)
    wanted: list[dict[str, Any]] = []
    for given in specs:
        wanted.extend(s for s in spec_rows(op_name, record, given, parse_device(dev)[0]) if s not in wanted)
    out = []
    for spec in wanted:
        try:
            res, offline = what_serves(tuner, spec, dev)
        except Exception as e:
            raise click.ClickException(_unresolved(op_name, spec, dev, e)) from None
        row = {"op": op_name, "spec": res.spec, "device": ident.to_json(), "config": res.config.to_json(),
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
    from flyreg._cli.tune_jobs import config_str, spec_str

    click.echo(f"op:      {op}")
    click.echo(f"spec:    {spec_str(r['spec'])}")
    click.echo(f"device:  {ident.name} ({ident.arch})")
    click.echo(f"config:  {config_str(config)}")
    click.echo(f"source:  {r['source']}")
    if r["path"]:
        click.echo(f"path:    {r['path']}")
    if r["nearest"]:
        click.echo("note:    tuned for the nearest spec, not this one")
    if r["stale"]:
        click.echo("note:    stale: tuned with another toolchain; re-tune to refresh it")
    if r["offline"]:
        click.echo(f"offline: {r['offline']} (served once the cache entry is gone)")


def _show_table(op: str, ident: Any, out: list[tuple[dict[str, Any], Any]]) -> None:
    """The resolutions of several specs, a table row each."""
    from rich.markup import escape
    from rich.table import Table

    from flyreg._cli.tune_jobs import config_str, make_console, spec_str

    table = Table(title=f"{op} on {ident.name} ({ident.arch})")
    for col in ("spec", "config", "source", "path"):
        table.add_column(col, overflow="fold")
    for r, config in out:
        notes = [n for n, on in (("nearest", r["nearest"]), ("stale", r["stale"])) if on]
        source = r["source"] + (f" ({', '.join(notes)})" if notes else "")
        table.add_row(escape(spec_str(r["spec"])), escape(config_str(config)), source, escape(r["path"] or "-"))
    make_console().print(table)


def _unresolved(op: str, spec: dict[str, Any], device: str, e: Exception) -> str:
    """One line for a spec that resolves to nothing (or whose hooks fail on it)."""
    from flyreg._cli.tune_jobs import one_line, spec_str

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
    return f"{op}: no config for spec {spec_str(spec)}: {one_line(e)}{hint}"


@cli.command()
@click.argument("dirs", nargs=-1, type=click.Path(path_type=Path), metavar="[DIR]...")
@click.option("--strict", is_flag=True, help="Fail on stale artifacts and warnings too.")
@click.option("--verbose", "-v", is_flag=True, help="List every file of each finding, not the first few.")
@_user_errors
def check(dirs: tuple[Path, ...], strict: bool, verbose: bool) -> None:
    """Validate offline artifacts in DIRs (default: every lookup directory that exists).

    Judges each *.json by the rule lookup uses: well-formed, named by its content, a known op, a
    config that op accepts for its spec, a sanitized device name; reports stale ones (something
    their backend depends on changed), and warns about artifacts of ops that are broken or
    disabled here. Prints each kind of finding with its count and first files. Exits 1 if any
    error (with --strict, any stale artifact or warning too).
    """
    from flyreg._artifacts.store import lookup_dirs
    from flyreg._artifacts.validate import check_report, summary
    from flyreg._plugins.registry import REGISTRY, accepts, ops

    known, unavailable, plugin_dirs = {}, {}, []
    for info in ops():
        if info.status != "ok":
            unavailable[info.name] = info.status
            continue
        rec = REGISTRY.plugin(info.name).record
        known[info.name] = rec.version
        if rec.config_dir:
            plugin_dirs.append(rec.config_dir)
    targets = list(dirs) or [d for d in lookup_dirs(plugin_dirs) if _present(d)]
    report = check_report(targets, known, accepts=accepts, unavailable=unavailable)
    for line in summary(report, strict=strict, verbose=verbose):
        click.echo(line)
    if any(p.severity == "error" or strict for p in report.problems):
        sys.exit(1)


def _present(directory: Path) -> bool:
    """False only when ``directory`` surely does not exist; one that cannot be looked at is checked (and reported)."""
    try:
        os.stat(directory)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
    return True


@cli.group()
def cache() -> None:
    """The scratch disk cache: one SQLite database in FLYREG_CACHE_DIR, else the user cache dir."""


def _cache_op(op_name: str | None) -> None:
    """Reject an op name that is neither registered nor has cache entries (a typo)."""
    from flyreg._artifacts import cache as scratch
    from flyreg._plugins.registry import REGISTRY

    if op_name is not None and op_name not in REGISTRY.names() and op_name not in scratch.counts():
        _check_op_names([op_name])


@cache.command("path")
@_user_errors
def cache_path() -> None:
    """Print the cache database (every op's entries live in it)."""
    from flyreg._artifacts import cache as scratch

    click.echo(str(scratch.database()))


@cache.command("clear")
@click.argument("op_name", required=False, metavar="[OP]")
@_user_errors
def cache_clear(op_name: str | None) -> None:
    """Delete OP's cache entries, or every op's, and temp files left by killed writers."""
    from flyreg._artifacts import cache as scratch

    _cache_op(op_name)
    removed = scratch.clear(op_name)
    click.echo(f"removed {removed} cache entr{'y' if removed == 1 else 'ies'} from {scratch.database()}")


# -- entry point ----------------------------------------------------------------------------------------
def _one_line_warnings() -> None:
    """flyreg's own warnings as the one line they are, not ``file:line: Category: message``."""
    from flyreg._core.fileio import FlyregWarning

    original = warnings.showwarning

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        if issubclass(category, FlyregWarning):
            text = str(message)
            click.echo(text if text.startswith("flyreg") else f"flyreg: warning: {text}", err=True)
        else:
            original(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def main(argv: list[str] | None = None) -> None:
    """Console entry point (also ``python -m flyreg``)."""
    from flyreg._cli import supervise

    args = sys.argv[1:] if argv is None else list(argv)
    if supervise.wanted(args):
        sys.exit(supervise.run(args))
    _one_line_warnings()
    try:
        code = cli.main(args=args, prog_name="flyreg", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("flyreg: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        if isinstance(e, getattr(click.exceptions, "NoArgsIsHelpError", ())):  # bare `flyreg`: the help (click >= 8.2)
            e.show()
        else:
            click.echo(f"flyreg: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except BrokenPipeError:  # flyreg list | head
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    status = code if isinstance(code, int) else 0
    if status == 0:
        supervise.mark_done()
    sys.exit(status)
