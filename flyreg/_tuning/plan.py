"""The jobs of ``flyreg tune``: the (op, spec) pairs to tune, and which of them need no tuning."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from flyreg._artifacts.store import index, lookup_dirs
from flyreg._core.keys import DeviceIdentity, SpecError, identity_of
from flyreg._core.spec import canonical_spec, name_part, spec_text
from flyreg._core.text import one_line


@attrs.define
class Job:
    """One (op, spec) to tune.

    ``skip`` says why it is not tuned (not a failure), ``error`` why it failed, ``result`` is the
    tuner's report, and ``tuned_spec`` the spec ``specialize()`` gave its inputs when that
    differs from ``spec`` (a row count bucketed, an axis the op adds).
    """

    op: str
    spec: dict[str, Any]
    skip: str | None = None
    error: str | None = None
    result: Any = None
    tuned_spec: dict[str, Any] | None = None
    seconds: float | None = None
    isolated: bool = False

    @property
    def state(self) -> str:
        if self.error is not None:
            return "failed"
        if self.skip is not None:
            return "skipped"
        return "tuned" if self.result is not None else "pending"


def count_artifacts(op: str, device: DeviceIdentity, plugin_dirs: Iterable[Path]) -> int:
    """How many artifacts of ``op`` for this device product exist across the lookup directories."""
    names: set[str] = set()
    for d in lookup_dirs(plugin_dirs):
        for fname, (fop, _axes, dev) in index(d).items():
            if fop == name_part(op) and dev == name_part(device.name):
                names.add(fname)
    return len(names)


def skip_reason(op: str, spec: dict[str, Any], ident: DeviceIdentity, out_dir: Path) -> str | None:
    """"current artifact" when lookup would serve the artifact in ``out_dir`` for ``spec`` as it is
    (the resolution chain's current-artifact source), so tuning it again is not needed. Any other
    file at that name is re-tuned (and, if malformed, moved aside first)."""
    from flyreg._plugins.registry import REGISTRY
    from flyreg._runtime.resolution import current_artifact

    try:
        current = current_artifact(REGISTRY.tuner(op), spec, ident, out_dir)
    except Exception:  # the op's hooks fail on its spec: the tune reports why
        return None
    return "current artifact" if current is not None else None


def _matches(spec: dict[str, Any], where: list[dict[str, Any]]) -> bool:
    """True when ``spec`` has every axis value of one of the ``where`` filters (or there are none)."""
    return not where or any(all(k in spec and spec[k] == v for k, v in w.items()) for w in where)


def plan_jobs(op_names: list[str], specs: list[dict[str, Any]], device: str, out_dir: Path,
              force: bool, where: list[dict[str, Any]] | None = None,
              ident: DeviceIdentity | None = None) -> list[Job]:
    """The jobs: each op's ``--spec`` values or declared workloads (those matching a ``where``
    filter, when given); current artifacts are skipped. ``device`` is the device type or string the
    hooks are asked about; ``ident`` the product whose artifacts count (default: ``device``'s).

    ``op_names`` empty means every registered op: a broken op becomes a failed job, a disabled
    one (or one that declares nothing to tune here) a skipped job. An op named explicitly that
    is unusable raises (one line) when it is the only one, and fails its job otherwise.
    """
    from flyreg._plugins.registry import REGISTRY, OpUnavailableError, ops

    explicit = bool(op_names)
    if explicit:
        names = op_names
        unavailable: dict[str, Job] = {}
    else:
        infos = ops()
        names = [i.name for i in infos if i.status == "ok"]
        unavailable = {i.name: (Job(i.name, {}, error=f"plugin is broken: {i.error}") if i.status == "broken"
                                else Job(i.name, {}, skip="disabled by FLYREG_DISABLE_OPS"))
                       for i in infos if i.status != "ok"}
        names = sorted([*names, *unavailable])
    ident = ident if ident is not None else identity_of(device)
    jobs: list[Job] = []
    op_axes: list[set[str] | None] = []  # each op's declared axes; None: not loaded
    for name in names:
        if name in unavailable:
            jobs.append(unavailable[name])
            op_axes.append(None)
            continue
        try:
            plugin = REGISTRY.plugin(name)
        except OpUnavailableError as e:
            if len(op_names) == 1:
                raise
            jobs.append(Job(name, {}, error=str(e)))
            op_axes.append(None)
            continue
        op_axes.append({a.name for a in plugin.record.axes})
        if not plugin.implements("make_inputs"):
            why = "no make_inputs hook, so it cannot be tuned offline"
            jobs.append(Job(name, {}, error=why) if explicit else Job(name, {}, skip=why))
            continue
        wanted = specs
        if not wanted:
            try:
                wanted = plugin.workloads(device)
            except Exception as e:  # a plugin's failing hook fails its op only
                jobs.append(Job(name, {}, error=f"workloads() failed: {one_line(e)}"))
                continue
            if not wanted:
                why = f"declares no workloads for {device}; pass --spec"
                jobs.append(Job(name, {}, error=why) if explicit else Job(name, {}, skip=why))
                continue
        seen: set[str] = set()
        axes: set[str] = set()
        matched = 0
        for raw in wanted:
            if specs:  # the user's: a spec that does not fit the op's axes is a usage error (SpecError)
                spec = canonical_spec(plugin.check_spec(raw, device))
                _check_device_axes(name, plugin.record.axes, spec, device)
            else:
                try:
                    spec = canonical_spec(plugin.check_spec(canonical_spec(raw, "workload spec"), device))
                except (TypeError, ValueError) as e:
                    jobs.append(Job(name, {}, error=f"bad workload {raw!r}: {one_line(e)}"))
                    continue
            axes.update(spec)
            if where and not _matches(spec, where):
                continue
            matched += 1
            if spec_text(spec) in seen:
                continue
            seen.add(spec_text(spec))
            job = Job(name, spec)
            if not force:
                job.skip = skip_reason(name, spec, ident, out_dir)
            jobs.append(job)
        if where and not matched and not specs:
            unknown = sorted({k for w in where for k in w} - axes)
            why = (f"--where names axes {unknown} that no workload has (its axes: {', '.join(sorted(axes))})"
                   if unknown else f"no workload for {device} matches --where")
            jobs.append(Job(name, {}, error=why) if explicit else Job(name, {}, skip=why))
    check_where_axes(where or [], op_axes)
    return jobs


def _check_device_axes(op: str, axes: Iterable[Any], spec: dict[str, Any], device: str) -> None:
    """A SpecError for a spec value a call on ``device`` cannot have (``backend=triton`` on the CPU): its inputs
    would specialize to the device's value, and the tune would write that spec's artifact instead."""
    from flyreg._plugins.declared import BACKEND, backend_on

    # A declared op's backend only: another axis' device default is a default, not a rule.
    declared = any(a.name == BACKEND.name and a.device_default is BACKEND.device_default for a in axes)
    want = backend_on(device)
    if declared and spec.get(BACKEND.name, want) != want:
        raise SpecError(f"{op}: backend={spec[BACKEND.name]} cannot be tuned on {device}: calls there take "
                        f"backend={want}; tune it on a device whose calls take it")


def check_where_axes(where: list[dict[str, Any]], op_axes: Iterable[set[str] | None]) -> None:
    """A SpecError (a usage error) for a ``--where`` axis that none of the ops has, given each op's declared axes
    (None: an op not loaded). An op not loaded, or one that declares no axes, may have any: nothing is refused."""
    given = list(op_axes)
    known = [axes for axes in given if axes]
    if not known or len(known) < len(given):
        return
    declared = {name for axes in known for name in axes}
    for axis in sorted({k for w in where for k in w} - declared):
        close = difflib.get_close_matches(axis, sorted(declared), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"their axes: {', '.join(sorted(declared))}"
        raise SpecError(f"--where names axis {axis!r}, which no op here has ({hint})")


def tuned_as(job: Job, spec: dict[str, Any], device: str, out_dir: Path, force: bool) -> bool:
    """Note the spec ``specialize()`` gave the job's inputs where it differs from the job's; True when the
    job is then skipped (that spec has a current artifact, and no ``force``)."""
    if spec_text(spec) == spec_text(job.spec):
        return False
    job.tuned_spec = spec
    if not force:
        job.skip = skip_reason(job.op, spec, identity_of(device), out_dir)
    return job.skip is not None
