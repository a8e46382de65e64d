"""``flyreg check``: validate offline artifacts by the rule lookup uses."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from flyreg._cli.common import PositiveNumber, device_option, given_path, spec_values, user_errors


@click.command()
@click.argument("dirs", nargs=-1, type=click.Path(path_type=Path), metavar="[DIR]...")
@click.option("--strict", is_flag=True, help="Fail on stale artifacts and warnings too.")
@click.option("--verbose", "-v", is_flag=True, help="List every file of each finding, not the first few.")
@click.option("--against-record", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Instead, list the specs a serving record (FLYREG_RECORD) saw that have no current artifact.")
@click.option("--remeasure", is_flag=True,
              help="Instead, re-time each artifact's config of this device's arch against the default and the "
                   "nearest artifacts' configs, here, and say which to keep, which are stale but fine and which "
                   "to re-tune.")
@click.option("--op", "op_names", multiple=True, metavar="OP", help="With --remeasure: only this op (repeatable).")
@click.option("--where", "where", multiple=True, callback=spec_values, metavar="AXIS=V,...",
              help="With --remeasure: only the specs with these axis values (repeatable: any of them).")
@click.option("--margin", type=PositiveNumber(), default=5.0, show_default=True,
              metavar="PERCENT", help="With --remeasure: how much slower than the fastest config measured "
                                      "(separably) an artifact may be before it is re-tuned.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), callback=given_path,
              default="flyreg-remeasure.json", show_default=True, metavar="FILE",
              help="With --remeasure: where the JSON report goes.")
@click.option("--workloads", is_flag=True,
              help="With --remeasure: also time the ops' workloads that have no artifact (served by a fallback).")
@click.option("--retune", is_flag=True, help="With --remeasure: then tune the retune set (as tune --force).")
@click.option("--out", type=click.Path(file_okay=False), default=None, callback=given_path, metavar="DIR",
              help="With --retune: artifact dir (default: as flyreg tune's).")
@device_option("With --remeasure: device to time on")
@user_errors
def check(dirs: tuple[Path, ...], strict: bool, verbose: bool, against_record: Path | None, remeasure: bool,
          op_names: tuple[str, ...], where: list[dict[str, Any]], margin: float, report_path: Path, workloads: bool,
          retune: bool, out: Path | None, device: str | None) -> None:
    """Validate offline artifacts in DIRs (default: every lookup directory that exists).

    Judges each *.json by the rule lookup uses: well-formed, named by its content, a known op, a
    config that op accepts for its spec, a sanitized device name; reports stale ones (something
    their backend depends on changed), and warns about artifacts of ops that are broken or
    disabled here. Prints each kind of finding with its count and first files. Exits 1 if any
    error (with --strict, any stale artifact or warning too). With --against-record, exits 1 if a
    recorded spec has no current artifact for its device in DIRs (default: the lookup directories).
    With --remeasure, exits 1 if an artifact should be re-tuned (with --retune: if that tune fails).
    """
    extra = [name for name, on in (("--op", op_names), ("--where", where), ("--workloads", workloads),
                                   ("--retune", retune),
                                   ("--out", out is not None), ("--device", device is not None)) if on]
    if extra and not remeasure:
        raise click.UsageError(f"{extra[0]} needs --remeasure")
    if out is not None and not retune:
        raise click.UsageError("--out needs --retune")
    if remeasure and against_record is not None:
        raise click.UsageError("--remeasure and --against-record are two checks: run them one at a time")
    if against_record is not None:
        from flyreg._tuning.from_record import check_against_record

        if check_against_record(against_record, dirs):
            sys.exit(1)
        return
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
    if remeasure:
        _remeasure(targets, list(dict.fromkeys(op_names)), where, device, known, margin / 100, report_path,
                   workloads, retune, out)
        return
    report = check_report(targets, known, accepts=accepts, unavailable=unavailable)
    for line in summary(report, strict=strict, verbose=verbose):
        click.echo(line)
    if any(p.severity == "error" or strict for p in report.problems):
        sys.exit(1)


def _remeasure(targets: list[Path], op_names: list[str], where: list[dict[str, Any]], device: str | None,
               known: dict[str, str], margin: float, report: Path, workloads: bool, retune: bool,
               out: Path | None) -> None:
    from flyreg._cli.common import artifact_dir, check_op_names, resolve_device, writable_file
    from flyreg._tuning.remeasure_artifacts import retune as retune_set
    from flyreg._tuning.remeasure_artifacts import run_remeasure

    check_op_names(op_names)
    if where:
        from flyreg._plugins.registry import REGISTRY
        from flyreg._tuning.plan import check_where_axes

        check_where_axes(where, [{a.name for a in REGISTRY.plugin(op).record.axes} if op in known else None
                                 for op in (op_names or known)])
    writable_file(report, "--report")
    dev = resolve_device(device)
    measured = run_remeasure(targets, op_names, dev, known, margin, report, workloads, where)
    if retune:
        sys.exit(retune_set(measured, dev, artifact_dir(out, create=True)))
    if any(t.row is not None and t.row["verdict"] == "retune" for t in measured):
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


