"""Closing the loop from a serving record: ``flyreg tune --from-record`` and ``flyreg check --against-record``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from flyreg._artifacts.lookup import EXACT, FALLBACKS, NEAREST
from flyreg._core.keys import identity_of
from flyreg._core.spec import spec_arg
from flyreg._core.text import one_line
from flyreg._runtime.pending import CAPTURE
from flyreg._runtime.serving_record_file import Served, read
from flyreg._tuning.plan import Job, plan_jobs


def untuned(r: Served) -> bool:
    """Whether tuning would change what served a row: the op's default, a fallback artifact (nearest spec,
    another product, another toolchain), or anything a key met first during CUDA-graph capture got."""
    return (r.origin == "default" or r.source.startswith(CAPTURE) or r.source in FALLBACKS
            or (r.origin == "offline" and r.nearest))


def plan_from_record(path: Path, op_names: Sequence[str], device: str, out_dir: Path, force: bool) -> list[Job]:
    """The jobs of the specs the record at ``path`` saw served untuned (:func:`untuned`) on this device
    product (of ``op_names``, when given), planned as ``flyreg tune OP --spec ...`` plans them."""
    from flyreg._plugins.registry import REGISTRY

    rows = read(path)
    ident = identity_of(device)
    here = [r for r in rows if r.device == ident]
    if rows and not here:
        seen = ", ".join(sorted({f"{r.device.name} ({r.device.arch})" for r in rows}))
        raise click.ClickException(f"the record {path} holds calls on {seen}, none on this device {ident.name} "
                                   f"({ident.arch}): tune on the device it recorded")
    wanted: dict[str, list[dict[str, Any]]] = {}
    for r in here:
        if untuned(r) and (not op_names or r.op in op_names) and r.spec not in wanted.get(r.op, []):
            wanted.setdefault(r.op, []).append(r.spec)
    click.echo(f"from the record {path}: {sum(map(len, wanted.values()))} spec(s) served by a default, a "
               f"fallback artifact or a capture miss on {ident.name} ({ident.arch})")
    jobs: list[Job] = []
    known = set(REGISTRY.names())
    for op, specs in wanted.items():
        if op not in known:
            jobs.append(Job(op, {}, error="not registered here"))
            continue
        for spec in specs:  # one by one: a spec the op's axes no longer take fails alone
            try:
                jobs.extend(plan_jobs([op], [spec], device, out_dir, force))
            except Exception as e:  # a broken or disabled op, a recorded spec its axes no longer take
                jobs.append(Job(op, spec, error=one_line(e)))
    return jobs


def _distinct(rows: list[Served]) -> dict[tuple[str, str, Any], list[Served]]:
    """The record's rows grouped by (op, spec, device)."""
    out: dict[tuple[str, str, Any], list[Served]] = {}
    for r in rows:
        out.setdefault((r.op, spec_arg(r.spec), r.device), []).append(r)
    return out


def check_against_record(path: Path, dirs: Sequence[Path]) -> int:
    """Print each spec the record at ``path`` saw served that has no current artifact (in ``dirs``, else
    the lookup directories) for its device product; returns 1 when there is one, else 0."""
    from flyreg._plugins.registry import REGISTRY
    from flyreg._runtime.resolution import own_artifact

    groups = _distinct(read(path))
    lacking = 0
    for (op, spec_text, device), served in groups.items():
        calls = sum(r.calls for r in served)
        sources = ", ".join(sorted({_source(r) for r in served}))
        where = f"{op} {spec_text} on {device.name} ({device.arch})"
        try:
            hit = own_artifact(REGISTRY.tuner(op), served[0].spec, device, list(dirs) or None)
        except Exception as e:  # an op not usable here, a spec its axes no longer take
            state = f"cannot be checked here: {one_line(e, typed=False)}"
        else:
            if hit is not None and not hit.stale:
                continue
            state = "stale artifact" if hit is not None else "missing"
        lacking += 1
        click.echo(f"{state}: {where}: {calls} call(s) served by {sources}")
    click.echo(f"checked {len(groups)} recorded spec(s) from {path}: {lacking} without a current artifact")
    return 1 if lacking else 0


def _source(r: Served) -> str:
    """The source that served a row's calls, by its chain name (``default``, ``offline-nearest``,
    ``capture:default``, ...); a row first served from memory is named by where its config came from."""
    if r.source != "memory":
        return r.source
    return NEAREST if r.origin == "offline" and r.nearest else EXACT if r.origin == "offline" else r.origin
