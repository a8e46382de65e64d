"""Finding the artifact that serves an op's spec on a device, across the lookup directories."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from flyreg._artifacts.names import artifact_filename, lookup_key
from flyreg._artifacts.store import Artifact, forget_listings, listing, lookup_dirs
from flyreg._artifacts.usable import Accepts, config_problem, read, rejection
from flyreg._core.config import Config, JSONScalar
from flyreg._core.fileio import warn_once
from flyreg._core.keys import DeviceIdentity, known_arch
from flyreg._core.spec import canonical_spec, name_part, spec_text

#: The artifact sources of the fallback chain, each its own :attr:`Resolution.source <flyreg.Resolution>`:
#: the exact artifact (this spec, this product, this toolchain), then what lookup serves without one.
EXACT = "offline"
NEAREST = "offline-nearest"  # tuned for the nearest spec (bucket) along the ordered axes
OTHER_DEVICE = "offline-other-device"  # tuned for this spec on another product of the same arch
OTHER_TOOLCHAIN = "offline-other-toolchain"  # tuned for this spec on this product, with another toolchain
#: The fallbacks, in the order the chain names a hit that is several at once (nearest first).
FALLBACKS = (NEAREST, OTHER_DEVICE, OTHER_TOOLCHAIN)
ARTIFACT_SOURCES = (EXACT, *FALLBACKS)


def is_artifact(source: str) -> bool:
    """True when ``source`` (a resolution's) is an artifact: the exact one or a fallback."""
    return source in ARTIFACT_SOURCES


@attrs.frozen
class OfflineHit:
    """An artifact serving a call; ``nearest`` when tuned for a neighbouring spec, ``other_device`` when
    tuned on another product of the same arch, ``stale`` when with another toolchain."""

    config: Config
    path: Path
    stale: bool
    nearest: bool
    device: DeviceIdentity | None = None
    other_device: bool = False

    @property
    def source(self) -> str:
        """Which source of the fallback chain this hit is: :data:`EXACT` or the first of :data:`FALLBACKS` it is."""
        if self.nearest:
            return NEAREST
        if self.other_device:
            return OTHER_DEVICE
        return OTHER_TOOLCHAIN if self.stale else EXACT


def _may_share_arch(device_part: str, own_part: str, device: DeviceIdentity) -> bool:
    """False for the device part of an artifact filename naming a known product of another architecture than
    ``device`` (whose own part is ``own_part``): its files are never parsed nor read for this device."""
    arch = known_arch(device_part)
    return device_part == own_part or arch is None or arch == device.arch


class OfflineStore:
    """Finds the artifact serving an op's spec on a device, across the lookup directories.

    ``only`` replaces the lookup directories (``flyreg tune`` asks about its output dir alone).
    """

    def __init__(self, op: str, plugin_dirs: Iterable[str | os.PathLike[str]], ordered_axes: Iterable[str],
                 op_version: str, only: Iterable[str | os.PathLike[str]] | None = None) -> None:
        self.op = op
        self.plugin_dirs = [Path(d) for d in plugin_dirs]
        self.ordered_axes = tuple(ordered_axes)
        self.op_version = op_version
        self.only = [Path(d) for d in only] if only is not None else None

    def dirs(self) -> list[Path]:
        """Lookup order: FLYREG_CONFIG_DIR entries, the user's dir, then the plugin dirs."""
        return list(self.only) if self.only is not None else lookup_dirs(self.plugin_dirs)

    def forget_index(self) -> None:
        """Drop every directory listing, so the next lookup lists the directories again."""
        forget_listings()

    def lookup(self, spec: Mapping[str, JSONScalar], device: DeviceIdentity, accepts: Accepts, *,
               exact_only: bool = False, quiet: bool = False) -> OfflineHit | None:
        """The artifact for ``spec`` on ``device``, or None; never raises for a bad file (it warns once).

        Order: exact spec on this product; exact spec on another product of the same arch (warns);
        then the nearest spec along ``ordered_axes``. Never across architectures. Every file must
        pass :func:`flyreg._artifacts.usable.judge` (``accepts(config, spec)`` is the op's).
        ``exact_only`` stops after the first pass; ``quiet`` warns about nothing.
        """
        spec = canonical_spec(spec)
        dirs = self.dirs()
        exact = artifact_filename(self.op, spec, device.name)
        for d in dirs:
            if exact in listing(d):
                art = self._serves(d / exact, spec, device, accepts, quiet, same_product=True)
                if art is not None:
                    return self._hit(art, device, False, quiet)
        if exact_only:
            return None
        same, near = self._others(spec, device, dirs)
        for path in same:
            art = self._serves(path, spec, device, accepts, quiet, same_product=False)
            if art is not None:
                return self._hit(art, device, False, quiet)
        for path in near:
            art = self._serves(path, spec, device, accepts, quiet, same_product=False, nearest=True)
            if art is not None and spec_text(self._fixed(art.spec)) == spec_text(self._fixed(spec)):
                return self._hit(art, device, True, quiet)
        return None

    def nearest_configs(self, spec: Mapping[str, JSONScalar], device: DeviceIdentity, accepts: Accepts,
                        limit: int = 4) -> list[Config]:
        """The configs of up to ``limit`` usable artifacts tuned for ``spec`` or the specs nearest it on this
        device's architecture, nearest first: where a budgeted search starts. Quiet; best effort."""
        spec = canonical_spec(spec)
        dirs = self.dirs()
        exact = artifact_filename(self.op, spec, device.name)
        same, near = self._others(spec, device, dirs)
        paths = [*(d / exact for d in dirs if exact in listing(d)), *same, *near]
        out: list[Config] = []
        for path in paths:
            art = self._serves(path, spec, device, accepts, True, same_product=False, nearest=True)
            if art is not None and art.config not in out:
                out.append(art.config)
            if len(out) >= limit:
                break
        return out

    def _others(self, spec: dict[str, JSONScalar], device: DeviceIdentity,
                dirs: list[Path]) -> tuple[list[Path], list[Path]]:
        """Artifacts of this op other than the exact one: for the same spec on other products, and for
        specs along the ordered axes, nearest first (this product before others at one distance)."""
        exact = artifact_filename(self.op, spec, device.name)
        want_op, want_axes, want_dev = lookup_key(self.op, spec, device.name)
        same: list[Path] = []
        near: list[tuple[tuple[bool, float, int, str], Path]] = []
        same_arch = functools.partial(_may_share_arch, own_part=want_dev, device=device)
        for rank, d in enumerate(dirs):
            for fname, (op, axes, dev) in sorted(listing(d).parsed(same_arch).items()):
                if op != want_op or fname == exact:
                    continue
                if axes == want_axes:
                    same.append(d / fname)
                elif self.ordered_axes:
                    dist = self._distance(axes, want_axes, spec)
                    if dist is not None:
                        near.append(((dev != want_dev, dist, rank, fname), d / fname))
        return same, [path for _, path in sorted(near, key=lambda t: t[0])]

    def _fixed(self, spec: Mapping[str, JSONScalar]) -> dict[str, JSONScalar]:
        return {k: v for k, v in spec.items() if k not in self.ordered_axes}

    def _distance(self, axes: dict[str, str], want_axes: dict[str, str], spec: dict[str, JSONScalar]) -> float | None:
        """Sum of |log a - log b| over the ordered axes; None unless every other axis is equal."""
        if set(axes) != set(want_axes):
            return None
        ordered = {name_part(k) for k in self.ordered_axes if k in spec}
        if not ordered or any(axes[k] != v for k, v in want_axes.items() if k not in ordered):
            return None
        total = 0.0
        for k in self.ordered_axes:
            want = spec.get(k)
            if k not in spec:
                continue
            if isinstance(want, bool) or not isinstance(want, (int, float)):
                return None
            try:
                have = float(axes[name_part(k)])
            except ValueError:
                return None
            if not math.isfinite(have):
                return None
            if have > 0 and want > 0:
                total += abs(math.log(have) - math.log(want))
            else:
                total += abs(have - want)
        return total

    def _serves(self, path: Path, spec: dict[str, JSONScalar], device: DeviceIdentity, accepts: Accepts,
                quiet: bool, same_product: bool, nearest: bool = False) -> Artifact | None:
        """The artifact at ``path`` if the rule lets it serve this call; warns once for each bad file.

        A ``nearest`` neighbour's config must also be one the op takes for this call's ``spec``. A
        sound artifact of another architecture, and a neighbour whose config the op would not take,
        are skipped silently: not for this call, whatever the file is worth.
        """
        judged = read(path)
        art = judged.artifact
        kind = judged.problem.kind if judged.problem is not None else ""
        problems = [judged.problem.message] if judged.problem is not None else []
        if art is not None and not problems:
            if art.op != self.op:
                problems.append(f"op {art.op!r} != {self.op!r}")
            if not nearest and spec_text(art.spec) != spec_text(spec):
                problems.append(f"spec {spec_text(art.spec)} != {spec_text(spec)}")
            if same_product and art.device.name != device.name:
                problems.append(f"device {art.device.name!r} != {device.name!r}")
            if art.device.arch != device.arch:
                if not problems and not same_product:
                    return None  # a sound artifact for another architecture: never served here
                problems.append(f"arch {art.device.arch!r} != {device.arch!r}")
        if art is not None and not problems:
            rejected = rejection(art, accepts)
            if nearest and (rejected is None or rejected.kind != "misfit"):  # a misfit is a bad file: it warns
                return None if rejected or config_problem(art.config, spec, accepts) else art
            if rejected is not None:
                kind = rejected.kind
                problems.append(rejected.message)
        if problems:
            if not quiet:
                what = f"malformed artifact {path}" if kind == "malformed" else \
                    f"artifact {path}" + (f" ({kind})" if kind else "")
                warn_once(f"flyreg: {self.op}: ignoring {what}: {'; '.join(problems)}")
            return None
        return art

    def _hit(self, art: Artifact, device: DeviceIdentity, nearest: bool, quiet: bool) -> OfflineHit:
        """The hit of ``art``; serving another product's or another toolchain's artifact warns once per op and
        device (not per spec: ``flyreg show`` and the serving record name each spec's source)."""
        staleness = art.staleness(self.op_version)
        other = art.device.name != device.name
        if not quiet and other:
            warn_once(f"flyreg: {self.op}: serving artifacts tuned on another product of the same arch "
                      f"{device.arch} where {device.name} has none (first: {art.path.name}, tuned on "
                      f"{art.device.name}); source {OTHER_DEVICE!r}",
                      key=f"fallback:{OTHER_DEVICE}:{self.op}:{device.name}")
        if not quiet and staleness.stale:
            warn_once(f"flyreg: {self.op}: serving artifacts tuned with another toolchain on {device.name} "
                      f"(first: {art.path}, {staleness.reason()}); re-tune them (`flyreg check --remeasure` "
                      f"says which need it); they are stale",
                      key=f"fallback:{OTHER_TOOLCHAIN}:{self.op}:{device.name}")
        return OfflineHit(art.config, art.path, staleness.stale, nearest, art.device, other)
