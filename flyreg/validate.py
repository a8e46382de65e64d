"""Checking a directory of committed artifacts, for users' own CI (``flyreg check``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from .keys import fingerprint, toolchain
from .offline import ArtifactError, load_artifact, name_part, parse_filename

#: ``error``: lookup will not serve the file as intended; ``stale``: tuned with another toolchain.
SEVERITIES = ("error", "stale")


@attrs.frozen
class Problem:
    """One finding; ``severity`` is ``error`` (the file will not be served) or ``stale`` (another toolchain)."""

    path: Path
    severity: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.severity}: {self.message}"


def check_artifacts(
    dirs: Iterable[str | os.PathLike[str]],
    known_ops: Mapping[str, str] | None = None,
) -> list[Problem]:
    """Check every ``*.json`` in ``dirs``: schema, filename against content, known op, device, staleness.

    ``known_ops`` maps op name -> op version; when given, unknown ops are errors and an artifact
    whose toolchain fingerprint differs from the op's current one is ``stale``. Without it, only
    the shared part of the toolchain (flyreg, torch, Triton, CUDA/HIP) is compared. Never raises
    for a bad file or directory.
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
            problems.extend(_check_one(path, known_ops))
    return problems


def _check_one(path: Path, known_ops: Mapping[str, str] | None) -> list[Problem]:
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
    current = fingerprint(known_ops[art.op]) if known_ops is not None and art.op in known_ops else None
    if known_ops is not None and current is None:
        found.append(Problem(path, "error", f"unknown op {art.op!r} (known: {', '.join(sorted(known_ops)) or 'none'})"))
    have: dict[str, Any] = dict(art.provenance["toolchain"])  # load_artifact checked it is an object
    if current is None:  # no op version to compare: the shared part of the toolchain only
        current = dict(toolchain())
        have.pop("op", None)
    if have != current:
        changed = sorted(k for k in set(have) | set(current) if have.get(k) != current.get(k))
        found.append(Problem(path, "stale", f"tuned with another toolchain ({', '.join(changed)} differ: "
                                             f"{ {k: have.get(k) for k in changed} } vs current "
                                             f"{ {k: current.get(k) for k in changed} }); re-tune it"))
    return found
