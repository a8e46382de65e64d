"""What ``flyreg report`` shows, read from the tuning journal, the ops' hooks and the artifacts.

Per op and device: each spec's measured configs (the latest toolchain and timing method it was
tuned with), the config its artifact serves (never another: lookup's own rule,
:func:`flyreg._runtime.resolution.own_artifact`) with the decision that chose it, the served
config against the default, and against the op's bound where the op states its work
(:class:`flyreg.plugin.Work`) and a peak is known: the one stored at tuning time, else the
datasheet's (the report never measures one, so it reads the same each time it runs). Then what
tuning cost, and which workloads have no current artifact.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from flyreg._core.config import Config, JSONScalar
from flyreg._core.decision import Band, Decision
from flyreg._core.keys import DeviceIdentity
from flyreg._core.peaks import Peak, known_peak
from flyreg._core.spec import spec_text
from flyreg._plugins.work import Work
from flyreg._search import journal
from flyreg._search.journal import Measurement

#: A pause longer than this between two journaled measurements is not counted as tuning time (seconds).
PAUSE_S = 300.0
#: The journal's timing of a final round's re-times contains this.
FINAL = " final x"


@attrs.frozen
class Served:
    """What lookup serves for exactly a spec: its artifact's config, the file, whether it is stale, and the
    decision stored with it (None in an artifact written before flyreg recorded one)."""

    config: Config
    path: str
    stale: bool
    decision: Decision | None


@attrs.frozen
class SpecResult:
    """One spec's search as journaled: each config's band (ms: median, p20 to p80; its final-round time
    where it had one), the failures, the default, the config its artifact serves (None: no artifact)
    and the fastest measured (fastest of the final round, else of all), which need not be the served one."""

    spec: dict[str, JSONScalar]
    bands: dict[Config, Band]
    failed: dict[Config, str]
    fastest: Config | None
    default: Config | None
    timing: str
    stamps: tuple[float, ...]  # when each measurement shown was taken
    retimed: int  # final-round re-times among them
    superseded: int  # measurements of older toolchains or timing methods, not shown
    work: Work | None = None
    served: Served | None = None

    @property
    def times(self) -> dict[Config, float]:
        """Each measured config's median (ms)."""
        return {c: b.median for c, b in self.bands.items()}

    @property
    def span_s(self) -> float:
        return span(self.stamps)

    @property
    def decision(self) -> Decision | None:
        return self.served.decision if self.served is not None else None

    def band(self, config: Config | None) -> Band | None:
        """``config``'s band: as the served artifact's decision compared it (the served config's and the
        default's), else as journaled (its spread split evenly around its median)."""
        d = self.decision
        if d is not None and self.served is not None and config == self.served.config:
            return d.winner
        if d is not None and d.default is not None and config == self.default:
            return d.default
        return self.bands.get(config) if config is not None else None

    @property
    def served_ms(self) -> float | None:
        band = self.band(self.served.config) if self.served is not None else None
        return band.median if band is not None else None

    @property
    def default_ms(self) -> float | None:
        band = self.band(self.default)
        return band.median if band is not None else None

    @property
    def speedup(self) -> float | None:
        """Default time over the served config's time, where both were timed."""
        w, d = self.served_ms, self.default_ms
        return d / w if w and d else None

    def peak(self, fallback: Peak | None) -> Peak | None:
        """The peak this spec is judged against: the one stored when it was tuned, else ``fallback``."""
        d = self.decision
        return d.peak if d is not None and d.peak is not None else fallback

    def bound_ms(self, peak: Peak | None) -> float | None:
        """The shortest time the device's peak allows for the spec's work (ms), where both are known."""
        if self.work is None or peak is None:
            return None
        parts = [self.work.bytes / peak.bandwidth if self.work.bytes is not None and peak.bandwidth else None,
                 self.work.flops / peak.flops if self.work.flops is not None and peak.flops else None]
        known = [p for p in parts if p is not None]
        return max(known) * 1e3 if known else None

    def of_bound(self, fallback: Peak | None) -> float | None:
        """The served config's throughput as a fraction of the bound (1.0: at the peak), judged against
        :meth:`peak`."""
        bound, w = self.bound_ms(self.peak(fallback)), self.served_ms
        return bound / w if bound is not None and w else None


@attrs.frozen
class Coverage:
    """One workload (or journaled spec): ``state`` is ``current``, ``stale`` or ``missing`` (no artifact
    lookup would serve for exactly it on this product); ``workload`` says the op declares it."""

    spec: dict[str, JSONScalar]
    state: str
    workload: bool
    path: str | None = None


@attrs.frozen
class OpReport:
    """An op on one device: its specs, its coverage, the peak of a spec that stored none (the datasheet's,
    None where unknown), and why anything is missing."""

    op: str
    device: DeviceIdentity
    specs: list[SpecResult]
    coverage: list[Coverage]
    peak: Peak | None
    note: str | None = None

    @property
    def peaks(self) -> list[str]:
        """How each distinct peak the specs are judged against was found, stored ones first."""
        found = [p.how for s in self.specs if (p := s.peak(None)) is not None]
        if any(s.peak(None) is None and s.work is not None for s in self.specs) or not found:
            found.append(self.peak.how if self.peak is not None else
                         "unknown: none stored at tuning time and none known for this device")
        return list(dict.fromkeys(found))

    @property
    def timed(self) -> int:
        """Configs timed, over every spec."""
        return sum(len(s.times) for s in self.specs)

    @property
    def failures(self) -> int:
        """Configs that failed or computed a wrong result, over every spec."""
        return sum(len(s.failed) for s in self.specs)

    @property
    def span_s(self) -> float:
        """Tuning time as journaled: first to last measurement, less pauses (:func:`span`)."""
        return span(t for s in self.specs for t in s.stamps)


def span(times: Iterable[float]) -> float:
    """Seconds between the first and the last of ``times``, less every pause over :data:`PAUSE_S`."""
    ordered = sorted(times)
    return sum(b - a for a, b in zip(ordered, ordered[1:]) if b - a <= PAUSE_S)


def _key(m: Measurement) -> tuple[str, str, str]:
    return (m.op, json.dumps(m.device, sort_keys=True), spec_text(m.spec))


def _toolchain(m: Measurement) -> dict[str, str]:
    return {k: v for k, v in m.toolchain.items() if k != "inputs"}


def _band(m: Measurement) -> Band:
    median = float(m.median_ms or 0.0)
    half = median * float(m.spread or 0.0) / 2
    return Band(median, median - half, median + half)


def _spec_result(rows: list[Measurement], default: Config | None, work: Work | None,
                 served: Served | None) -> SpecResult:
    """One spec's rows (oldest first) as a result: only those of its latest toolchain and timing method (whether
    a search's times ran over draws or copies, its ``inputs``, splits no search)."""
    last = rows[-1]
    mode, toolchain = last.timing.split(FINAL)[0], _toolchain(last)
    current = [m for m in rows if _toolchain(m) == toolchain and m.timing.split(FINAL)[0] == mode]
    first = {m.config: m for m in current if FINAL not in m.timing}
    final = {m.config: m for m in current if FINAL in m.timing}
    bands = {c: _band(m) for c, m in {**first, **final}.items() if m.median_ms is not None}
    failed = {c: m.error or "" for c, m in {**first, **final}.items() if m.failed}
    for c in failed:
        bands.pop(c, None)
    ranked = [c for c in final if c in bands] or list(bands)
    fastest = min(ranked, key=lambda c: bands[c].median) if ranked else None
    return SpecResult(last.spec, bands, failed, fastest, default, mode, tuple(m.created for m in current),
                      sum(1 for m in current if FINAL in m.timing), len(rows) - len(current), work, served)


def collect(op_names: list[str] | None) -> list[OpReport]:
    """The report of each op in the journal (of ``op_names`` when given), per device it was tuned on."""
    rows = journal.measurements()
    groups: dict[tuple[str, str, str], list[Measurement]] = {}
    for m in rows:
        if op_names is None or m.op in op_names:
            groups.setdefault(_key(m), []).append(m)
    by_op: dict[tuple[str, str], list[list[Measurement]]] = {}
    for (op, device, _), found in groups.items():
        by_op.setdefault((op, device), []).append(found)
    out = []
    for (op, device_text), spec_rows in sorted(by_op.items()):
        device = json.loads(device_text)
        ident = DeviceIdentity(str(device.get("name")), str(device.get("arch")))
        out.append(_op_report(op, ident, spec_rows, known_peak(ident.name)))
    return out


def _op_report(op: str, ident: DeviceIdentity, spec_rows: list[list[Measurement]], peak: Peak | None) -> OpReport:
    from flyreg._plugins.registry import REGISTRY

    plugin = tuner = None
    note = None
    try:
        plugin, tuner = REGISTRY.plugin(op), REGISTRY.tuner(op)
    except Exception as e:  # an op tuned once, now not installed or broken: its journal still shows
        note = f"{type(e).__name__}: {e}"
    specs = []
    for found in spec_rows:
        spec = found[-1].spec
        default, work = _hooks(plugin, tuner, spec, ident)
        specs.append(_spec_result(found, default, work, _served(tuner, spec, ident)))
    specs.sort(key=lambda s: spec_order(s.spec))
    coverage = _coverage(plugin, tuner, ident, [s.spec for s in specs]) if tuner is not None else []
    return OpReport(op, ident, specs, coverage, peak, note)


def _served(tuner: Any, spec: dict[str, JSONScalar], ident: DeviceIdentity) -> Served | None:
    """What lookup serves for exactly ``spec`` on ``ident`` (its own artifact, current or stale), or None."""
    from flyreg._artifacts.store import ArtifactError, load_artifact
    from flyreg._runtime.resolution import own_artifact

    if tuner is None:
        return None
    try:
        hit = own_artifact(tuner, spec, ident)
    except Exception:
        return None
    if hit is None or hit.path is None:
        return None
    try:
        decision = load_artifact(Path(hit.path)).decision
    except (ArtifactError, OSError):
        decision = None
    return Served(hit.config, hit.path, hit.stale, decision)


def _hooks(plugin: Any, tuner: Any, spec: dict[str, JSONScalar],
           ident: DeviceIdentity) -> tuple[Config | None, Work | None]:
    """The op's default for ``spec`` on ``ident`` and the work it states; None where its hooks cannot say."""
    if plugin is None:
        return None, None
    try:
        default = tuner.space.default(spec, ident)
    except Exception:
        default = None
    try:
        work = plugin.work(spec) if plugin.implements("work") else None
    except Exception:
        work = None
    return default, work


def spec_order(spec: dict[str, JSONScalar]) -> tuple[tuple[str, int, float, str], ...]:
    """A sort key of specs: axis by axis (in name order), numbers by value before strings."""
    return tuple((k, 0, float(v), "") if isinstance(v, (int, float)) and not isinstance(v, bool)
                 else (k, 1, 0.0, str(v)) for k, v in sorted(spec.items()))


def device_type(ident: DeviceIdentity) -> str:
    """``cpu`` or ``cuda``: what a device of this identity is called by the hooks."""
    return "cpu" if ident.arch.startswith("cpu-") else "cuda"


def _coverage(plugin: Any, tuner: Any, ident: DeviceIdentity, journaled: list[dict[str, JSONScalar]]) -> list[Coverage]:
    """Each workload of the op on this device type, then each journaled spec that is none, with its artifact state."""
    from flyreg._runtime.resolution import own_artifact

    kind = device_type(ident)
    specs: list[tuple[dict[str, JSONScalar], bool]] = []
    try:
        workloads = [plugin.check_spec(w, kind) for w in plugin.workloads(kind)]
    except Exception:
        workloads = []
    seen: list[dict[str, JSONScalar]] = []
    for spec, declared in [*((w, True) for w in workloads), *((s, False) for s in journaled)]:
        if spec not in seen:
            seen.append(spec)
            specs.append((spec, declared))
    out = []
    for spec, declared in specs:
        try:
            hit = own_artifact(tuner, spec, ident)
        except Exception:
            hit = None
        state = "missing" if hit is None else "stale" if hit.stale else "current"
        out.append(Coverage(spec, state, declared, hit.path if hit is not None else None))
    return out
