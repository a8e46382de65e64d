"""Checking a directory of committed artifacts, for users' own CI."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from .keys import fingerprint, sanitize
from .offline import ArtifactError, artifact_filename, load_artifact


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

    ``known_ops`` maps op name -> op version; when given, unknown ops are errors and artifacts
    from another toolchain are reported ``stale``.
    """
    problems: list[Problem] = []
    for d in dirs:
        directory = Path(d)
        if not directory.is_dir():
            problems.append(Problem(directory, "error", "not a directory"))
            continue
        for path in sorted(directory.glob("*.json")):
            problems.extend(_check_one(path, known_ops))
    return problems


def _check_one(path: Path, known_ops: Mapping[str, str] | None) -> list[Problem]:
    try:
        art = load_artifact(path)
    except ArtifactError as e:
        return [Problem(path, "error", str(e))]
    found = []
    if sanitize(art.device.name) != art.device.name:
        found.append(Problem(path, "error", f"device name {art.device.name!r} is not sanitized"))
    expected = artifact_filename(art.op, art.spec, art.device.name)
    if path.name != expected:
        found.append(Problem(path, "error", f"filename does not match its content (expected {expected})"))
    if known_ops is not None:
        if art.op not in known_ops:
            found.append(Problem(path, "error", f"unknown op {art.op!r}"))
        elif art.provenance.get("toolchain") != fingerprint(known_ops[art.op]):
            found.append(Problem(path, "stale", f"tuned with {art.provenance.get('toolchain')}, "
                                                 f"current is {fingerprint(known_ops[art.op])}"))
    return found
