"""Checking a directory of committed artifacts, for users' own CI (``flyreg check``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from flyreg._core.config import Config, JSONScalar
from flyreg._core.keys import SpecError, fingerprint, toolchain
from flyreg._artifacts.store import ArtifactError, load_artifact, name_part, parse_filename

#: ``accepts(op, spec, config)``: why ``op`` would not take ``config`` for ``spec``, or None.
Accepts = Callable[[str, dict[str, JSONScalar], Config], "str | None"]


@attrs.frozen
class Problem:
    """One finding.

    ``severity`` is ``error`` (lookup will not serve the file as intended), ``stale`` (tuned with
    another toolchain) or ``warning`` (its op is broken or disabled here, so it cannot be checked
    against the op); only ``error`` fails ``flyreg check`` without ``--strict``.
    """

    path: Path
    severity: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.severity}: {self.message}"


def check_artifacts(
    dirs: Iterable[str | os.PathLike[str]],
    known_ops: Mapping[str, str] | None = None,
    *,
    accepts: Accepts | None = None,
    unavailable: Mapping[str, str] | None = None,
) -> list[Problem]:
    """Check every ``*.json`` in ``dirs``: schema, filename against content, known op, config, device, staleness.

    ``known_ops`` maps op name -> op version; when given, unknown ops are errors and an artifact
    whose toolchain fingerprint differs from the op's current one is ``stale``. Without it, only
    the shared part of the toolchain (flyreg, torch, Triton, CUDA/HIP) is compared.
    ``accepts(op, spec, config)`` says why a known op would not take the artifact's config for
    its spec (None when it would); lookup ignores such a file, so it is an error. An exception
    it raises is an error too (a ``SpecError`` says the spec does not fit the op's axes). ``unavailable`` maps the ops that are registered but unusable
    here to their status (``broken``, ``disabled``): their artifacts get a ``warning``, not an
    unknown-op error. Never raises for a bad file or directory.
    """
    problems: list[Problem] = []
    for d in dirs:
        directory = Path(d)
        try:
            paths = sorted(p for p in directory.iterdir() if p.name.endswith(".json"))
        except OSError as e:
            problems.append(Problem(directory, "error", f"not a readable directory: {e}"))
            continue
        for path in paths:
            problems.extend(_check_one(path, known_ops, accepts, unavailable or {}))
    return problems


def _check_one(path: Path, known_ops: Mapping[str, str] | None, accepts: Accepts | None,
               unavailable: Mapping[str, str]) -> list[Problem]:
    if parse_filename(path.name) is None:
        hint = "hidden files are" if path.name.startswith(".") else "the name is"
        return [Problem(path, "error",
                        f"lookup never reads it: {hint} not op,<axis>=<value>,...,device_name=<name>.json")]
    try:
        art = load_artifact(path)
    except ArtifactError as e:
        return [Problem(path, "error", str(e))]
    found = []
    if name_part(art.device.name) != art.device.name:
        found.append(Problem(path, "error", f"device name {art.device.name!r} is not sanitized "
                                            f"(runtime names are ASCII letters, digits and ._-)"))
    if path.name != art.filename:
        found.append(Problem(path, "error", f"filename does not match its content (expected {art.filename})"))
    known = known_ops is not None and art.op in known_ops
    if art.op in unavailable and not known:
        found.append(Problem(path, "warning", f"op {art.op!r} is {unavailable[art.op]} here, so its config "
                                              f"and op version are not checked"))
    elif known_ops is not None and not known:
        found.append(Problem(path, "error", f"unknown op {art.op!r} (known: {', '.join(sorted(known_ops)) or 'none'})"))
    elif known and accepts is not None:
        try:
            why = accepts(art.op, dict(art.spec), art.config)
        except SpecError as e:  # not a spec the op computes, so lookup never serves the file
            found.append(Problem(path, "error", f"{e}; lookup never serves this file"))
            why = None
        except Exception as e:  # a plugin's hook failing on this spec: lookup would fail on it too
            why = f"its configs() or default() failed on the spec: {type(e).__name__}: {' '.join(str(e).split())}"
        if why:
            found.append(Problem(path, "error", f"config not accepted by op {art.op!r} for spec "
                                                f"{_spec_text(art.spec)}: {why}; lookup ignores this file"))
    have: dict[str, Any] = dict(art.provenance["toolchain"])  # load_artifact checked it is an object
    if known:
        current = fingerprint(known_ops[art.op])  # type: ignore[index]
    else:  # no op version to compare: the shared part of the toolchain only
        current = dict(toolchain())
        have.pop("op", None)
    if have != current:
        changed = sorted(k for k in set(have) | set(current) if have.get(k) != current.get(k))
        found.append(Problem(path, "stale", f"tuned with another toolchain ({', '.join(changed)} differ: "
                                             f"{ {k: have.get(k) for k in changed} } vs current "
                                             f"{ {k: current.get(k) for k in changed} }); re-tune it"))
    return found


def _spec_text(spec: Mapping[str, JSONScalar]) -> str:
    return ",".join(f"{k}={v}" for k, v in spec.items())
