"""``flyreg check --remeasure``: re-time the shipped artifacts on this device and toolchain, say which to keep.

For each (op, spec) with an artifact of this device's architecture in the checked directories
(and, with ``--workloads``, each workload of the op that has none), the config lookup serves it
here (the exact artifact, or a fallback: nearest spec, another product, another toolchain, the
default) is re-timed against the op's default and the configs of the nearest artifacts
(:mod:`flyreg._runtime.remeasure`), and gets a verdict: keep, stale-but-fine or retune. The
command prints a table, the cost of each fallback source, and writes the JSON report; with
``--retune`` it then tunes the retune set, as ``flyreg tune OP --spec ... --force`` would.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import click

from flyreg._artifacts.usable import read
from flyreg._core.keys import DeviceIdentity, identity_of
from flyreg._core.spec import spec_arg, spec_text
from flyreg._core.text import config_str, escape, make_console, one_line

#: How many configs of the nearest artifacts each spec is timed against, besides the default.
NEIGHBOURS = 3
#: How many ``flyreg tune`` commands of the retune set are printed (the report has every one).
SHOWN = 10
_NONE = object()  # stands for an axis a spec does not have: equal to no --where value


@attrs.define
class Target:
    """One (op, spec) to re-time, the artifact files of that spec found (``paths``), and what came of it."""

    op: str
    spec: dict[str, Any]
    paths: list[Path]
    row: dict[str, Any] | None = None
    error: str | None = None


def targets_of(dirs: Sequence[Path], ident: DeviceIdentity, op_names: Sequence[str],
               known: dict[str, str]) -> tuple[list[Target], dict[str, int]]:
    """The (op, spec)s of the usable artifacts of ``ident``'s architecture in ``dirs`` (of ``op_names``, when
    given, among the ``known`` ops), in order; and how many files were passed over, by why."""
    found: dict[tuple[str, str], Target] = {}
    passed: dict[str, int] = {}
    for d in dirs:
        try:
            paths = sorted(p for p in d.iterdir() if p.name.endswith(".json"))
        except OSError:
            continue
        for path in paths:
            judged = read(path)
            art = judged.artifact if judged.problem is None else None
            if art is not None and op_names and art.op not in op_names:
                continue
            why = ("not usable (flyreg check says why)" if art is None
                   else f"op {art.op!r} not usable here" if art.op not in known
                   else f"{art.device.arch} artifacts, not this device's arch" if art.device.arch != ident.arch
                   else None)
            if why is not None or art is None:
                passed[str(why)] = passed.get(str(why), 0) + 1
                continue
            target = found.setdefault((art.op, spec_text(art.spec)), Target(art.op, dict(art.spec), []))
            target.paths.append(path)
    return list(found.values()), passed


def workload_targets(op_names: Sequence[str], device: str, have: list[Target]) -> list[Target]:
    """The workloads of each op (checked) that ``have`` does not hold already."""
    from flyreg._core.spec import canonical_spec
    from flyreg._plugins.registry import REGISTRY

    seen = {(t.op, spec_text(t.spec)) for t in have}
    out = []
    for op in op_names:
        plugin = REGISTRY.plugin(op)
        for raw in plugin.workloads(device):
            spec = canonical_spec(plugin.check_spec(canonical_spec(raw, "workload spec"), device))
            if (op, spec_text(spec)) not in seen:
                seen.add((op, spec_text(spec)))
                out.append(Target(op, spec, []))
    return out


def measure(target: Target, dirs: Sequence[Path], device: str, margin: float) -> None:
    """Re-time what lookup serves ``target``'s spec here from ``dirs`` (the default where nothing does) against
    the default and the neighbours' configs; fills ``target.row`` (the report's row) or ``target.error``."""
    from flyreg._artifacts.lookup import EXACT, OfflineStore
    from flyreg._plugins.registry import REGISTRY
    from flyreg._runtime.remeasure import remeasure
    from flyreg._runtime.tuner import call_of
    from flyreg._tuning.jobs import job_inputs

    tuner = REGISTRY.tuner(target.op)
    if tuner.make_inputs is None:
        target.error = "the op has no make_inputs hook, so it cannot be timed without a real call"
        return
    args, kwargs, _ = job_inputs(target.op, target.spec, device)
    ck, call = call_of(tuner, args, kwargs)
    store = OfflineStore(tuner.name, (), tuner.offline.ordered_axes, tuner.version, only=dirs)
    hit = store.lookup(ck.spec, ck.ident, tuner.space.accepts, quiet=True)
    default = tuner.space.default(ck.spec, ck.ident)
    if hit is None and default is None:
        target.error = "nothing serves it here: no artifact and no default"
        return
    served = hit.config if hit is not None else default
    assert served is not None
    near = [c for c in store.nearest_configs(ck.spec, ck.ident, tuner.space.accepts, NEIGHBOURS + 1) if c != served]
    found = remeasure(tuner, ck.spec, call, served, hit is not None and hit.source == EXACT, near[:NEIGHBOURS],
                      margin)
    s, d, f = found.served, found.role("default"), found.fastest
    target.row = {
        "op": target.op, "spec": ck.spec, "source": hit.source if hit is not None else "default",
        "artifact": str(hit.path) if hit is not None else None, "files": [str(p) for p in target.paths],
        "tuned_on": hit.device.name if hit is not None and hit.device is not None else None,
        "stale": bool(hit and hit.stale), "verdict": found.verdict, "reason": found.reason,
        "served": s.to_json(), "default": d.to_json() if d is not None else None,
        "fastest": f.to_json() if f is not None else None, "vs_default": found.vs_default,
        "slower_than_fastest": found.slower, "whole_space_timed": found.fresh,
        "measured": [t.to_json() for t in found.timings],
    }


def run_remeasure(dirs: Sequence[Path], op_names: Sequence[str], device: str, known: dict[str, str],
                  margin: float, report: Path, workloads: bool, where: Sequence[dict[str, Any]] = ()) -> list[Target]:
    """Re-time every target (those with the axis values of one of ``where``, when given), print a line per
    spec as it is measured (on stderr), then the table and the fallback costs, and write the JSON report;
    returns the targets."""
    from flyreg._core.fileio import write_json_atomic

    ident = identity_of(device)
    targets, passed = targets_of(dirs, ident, op_names, known)
    if workloads:
        targets += workload_targets(list(op_names) or sorted({t.op for t in targets} or known), device, targets)
    targets = sorted((t for t in targets if not where or any(all(t.spec.get(k, _NONE) == v for k, v in w.items())
                                                              for w in where)), key=_order)
    click.echo(f"remeasuring {len(targets)} spec(s) on {ident.name} ({ident.arch}) ...", err=True)
    for i, target in enumerate(targets, 1):
        try:
            measure(target, dirs, device, margin)
        except Exception as e:  # one spec's failure never stops the others
            target.error = one_line(e)
        verdict = target.row["verdict"] if target.row is not None else f"not measured: {target.error}"
        click.echo(f"[{i}/{len(targets)}] {target.op} {spec_arg(target.spec)}: {verdict}", err=True)
    rows = [t.row for t in targets if t.row is not None]
    _table(ident, targets)
    lines = fallback_costs(rows)
    for why, n in sorted(passed.items()):
        lines.append(f"not measured: {n} artifact file(s): {why}")
    counts = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("keep", "stale-but-fine", "retune")}
    failed = [t for t in targets if t.error is not None]
    lines.append(f"remeasured {len(rows)} spec(s) on {ident.name} ({ident.arch}): "
                 + ", ".join(f"{n} {v}" for v, n in counts.items())
                 + (f", {len(failed)} not measured" if failed else "") + f"; report in {report}")
    again = [{"op": r["op"], "spec": r["spec"], "command": f"flyreg tune {r['op']} --spec {spec_arg(r['spec'])}"}
             for r in rows if r["verdict"] == "retune"]
    lines.extend(f"to re-tune: {a['command']}" for a in again[:SHOWN])
    if len(again) > SHOWN:
        lines.append(f"to re-tune: ... and {len(again) - SHOWN} more (the report lists them; --retune tunes them)")
    write_json_atomic(report, {  # before the lines that say where it is
        "device": ident.to_json(), "margin": margin, "counts": counts, "rows": rows,
        "errors": [{"op": t.op, "spec": t.spec, "error": t.error} for t in failed], "retune": again,
    })
    for line in lines:
        click.echo(line)
    return targets


def _order(t: Target) -> tuple[Any, ...]:
    """By op, then by spec, numbers in numeric order."""
    return (t.op, *((k, 0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (k, 1, 0, str(v))
                    for k, v in sorted(t.spec.items())))


def fallback_costs(rows: list[dict[str, Any]]) -> list[str]:
    """One line per source that served specs here: how much slower than the fastest config measured its
    configs are (median and worst), and how they compare with the default."""
    lines = []
    for source in sorted({r["source"] for r in rows}):
        mine = [r for r in rows if r["source"] == source]
        slower = [r["slower_than_fastest"] for r in mine if r["slower_than_fastest"] is not None]
        vs = [r["vs_default"] for r in mine if r["vs_default"] is not None]
        cost = (f"{statistics.median(slower):.1%} slower than the fastest measured (worst {max(slower):.1%})"
                if slower else "not timed")
        lines.append(f"cost of source {source}: {len(mine)} spec(s), {cost}"
                     + (f", {statistics.median(vs):.2f}x the default's speed" if vs else ""))
    return lines


def _table(ident: DeviceIdentity, targets: list[Target]) -> None:
    from rich.table import Table

    table = Table(title=f"remeasured on {ident.name} ({ident.arch})")
    for col, justify in (("op", "left"), ("spec", "left"), ("source", "left"), ("config", "left"), ("time", "right"),
                         ("vs default", "right"), ("fastest measured", "left"), ("slower", "right"),
                         ("verdict", "left")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for t in targets:
        r = t.row
        if r is None:
            table.add_row(escape(t.op), escape(spec_arg(t.spec)), "-", "-", "-", "-", escape(str(t.error)), "-",
                          "not measured")
            continue
        s, f = r["served"], r["fastest"]
        fastest = "(served)" if f is None or f["config"] == s["config"] else \
            f"{config_str(_config(f['config']))} ({'/'.join(f['roles'])})"
        table.add_row(escape(r["op"]), escape(spec_arg(r["spec"])), r["source"],
                      escape(config_str(_config(s["config"]))), _ms(s["median_ms"]) if s["error"] is None else "failed",
                      f"{r['vs_default']:.2f}x" if r["vs_default"] is not None else "-", escape(fastest),
                      f"{r['slower_than_fastest']:+.1%}" if r["slower_than_fastest"] is not None else "-",
                      r["verdict"])
    make_console().print(table)


def _config(data: dict[str, Any]) -> Any:
    from flyreg._core.config import Config

    return Config.from_json(data)


def _ms(ms: float) -> str:
    from flyreg._core.text import ms_text

    return ms_text(ms)


def retune(targets: list[Target], device: str, out_dir: Path) -> int:
    """Tune the retune set (``flyreg tune OP --spec ... --force``) into ``out_dir`` (checked writable);
    returns ``flyreg tune``'s exit code."""
    from flyreg._tuning.jobs import run_jobs
    from flyreg._tuning.plan import plan_jobs

    wanted: dict[str, list[dict[str, Any]]] = {}
    for t in targets:
        if t.row is not None and t.row["verdict"] == "retune":
            wanted.setdefault(t.op, []).append(t.row["spec"])
    if not wanted:
        click.echo("nothing to re-tune")
        return 0
    jobs = [job for op, specs in wanted.items() for job in plan_jobs([op], specs, device, out_dir, True)]
    return run_jobs(jobs, device, out_dir, force=True)
