"""``flyreg check``: validate offline artifacts by the rule lookup uses."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from flyreg._cli.common import user_errors


@click.command()
@click.argument("dirs", nargs=-1, type=click.Path(path_type=Path), metavar="[DIR]...")
@click.option("--strict", is_flag=True, help="Fail on stale artifacts and warnings too.")
@click.option("--verbose", "-v", is_flag=True, help="List every file of each finding, not the first few.")
@click.option("--against-record", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Instead, list the specs a serving record (FLYREG_RECORD) saw that have no current artifact.")
@user_errors
def check(dirs: tuple[Path, ...], strict: bool, verbose: bool, against_record: Path | None) -> None:
    """Validate offline artifacts in DIRs (default: every lookup directory that exists).

    Judges each *.json by the rule lookup uses: well-formed, named by its content, a known op, a
    config that op accepts for its spec, a sanitized device name; reports stale ones (something
    their backend depends on changed), and warns about artifacts of ops that are broken or
    disabled here. Prints each kind of finding with its count and first files. Exits 1 if any
    error (with --strict, any stale artifact or warning too). With --against-record, exits 1 if a
    recorded spec has no current artifact for its device in DIRs (default: the lookup directories).
    """
    if against_record is not None:
        from flyreg._cli.record_cmds import check_against_record

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


