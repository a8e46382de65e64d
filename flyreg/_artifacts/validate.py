"""Checking directories of committed artifacts, for users' own CI (``flyreg check``).

Each file is judged by the rule lookup uses (:mod:`flyreg._artifacts.usable`): what ``check``
calls an error, lookup ignores; what it passes, lookup serves.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import attrs

from flyreg._artifacts.names import parse_filename
from flyreg._artifacts.store import Artifact
from flyreg._artifacts.usable import read, rejection
from flyreg._core.config import Config, JSONScalar
from flyreg._core.toolchain import platform_of

#: ``accepts(op, spec, config)``: why ``op`` would not take ``config`` for ``spec``, or None.
Accepts = Callable[[str, dict[str, JSONScalar], Config], "str | None"]

#: Files listed under each kind of finding in the summary, unless ``verbose``.
SHOWN = 3

#: What each kind of unusable file is called in the summary.
_LABELS = {
    "unlisted": "lookup never reads it",
    "malformed": "malformed",
    "unsanitized": "device name not sanitized",
    "misnamed": "filename does not match its content",
    "misfit": "spec does not fit the op's axes",
    "rejected": "config not accepted by its op",
    "unknown-op": "unknown op",
    "unreadable-dir": "not a readable directory",
}


@attrs.frozen
class Problem:
    """One finding.

    ``severity`` is ``error`` (lookup will not serve the file as intended), ``stale`` (something
    its backend depends on changed since it was tuned) or ``warning`` (its op is broken or disabled
    here, so it cannot be checked against the op); only ``error`` fails ``flyreg check`` without
    ``--strict``. ``kind`` groups findings in the summary (a stale one's is what changed).
    """

    path: Path
    severity: str
    message: str
    kind: str = ""

    def __str__(self) -> str:
        return f"{self.path}: {self.severity}: {self.message}"


@attrs.frozen
class CheckReport:
    """What :func:`check_report` found: the problems, how many artifact files it read in how many
    directories, and the files whose staleness this machine cannot tell (path, why)."""

    problems: list[Problem]
    files: int
    dirs: int
    unchecked: list[tuple[Path, str]]


def check_artifacts(
    dirs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    known_ops: Mapping[str, str] | None = None,
    *,
    accepts: Accepts | None = None,
    unavailable: Mapping[str, str] | None = None,
) -> list[Problem]:
    """Check every ``*.json`` in ``dirs`` (a directory or a list of them) as lookup would judge it; the problems
    of :func:`check_report`.

    ``known_ops`` maps op name -> op version; when given, unknown ops are errors and an artifact
    tuned on another op version is ``stale``. Staleness compares what the artifact's backend
    depends on (:mod:`flyreg._core.toolchain`), never the flyreg version.
    ``accepts(op, spec, config)`` says why a known op would not take the artifact's config for
    its spec (None when it would); lookup ignores such a file, so it is an error. An exception
    it raises is an error too (a ``SpecError``: the spec does not fit the op's axes). ``unavailable``
    maps the ops that are registered but unusable here to their status (``broken``, ``disabled``): their artifacts get a ``warning``, not an
    unknown-op error. Never raises for a bad file or directory.
    """
    return check_report(dirs, known_ops, accepts=accepts, unavailable=unavailable).problems


def check_report(
    dirs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    known_ops: Mapping[str, str] | None = None,
    *,
    accepts: Accepts | None = None,
    unavailable: Mapping[str, str] | None = None,
) -> CheckReport:
    """:func:`check_artifacts` with the counts and the files whose staleness cannot be told here.

    ``dirs`` is a list of directories, or one. A directory that cannot be listed is one ``error``; the other
    directories are still checked.
    """
    if isinstance(dirs, (str, os.PathLike)):  # one directory, not the characters of its name
        dirs = [dirs]
    if isinstance(dirs, bytes) or not isinstance(dirs, Iterable):
        raise TypeError(f"dirs must be a directory or a list of directories, got {type(dirs).__name__}")
    problems: list[Problem] = []
    unchecked: list[tuple[Path, str]] = []
    files = n_dirs = 0
    for d in dirs:
        directory = Path(d)
        n_dirs += 1
        try:
            paths = sorted(p for p in directory.iterdir() if p.name.endswith(".json"))
        except OSError as e:
            problems.append(Problem(directory, "error", f"not a readable directory: {e}", "unreadable-dir"))
            continue
        files += len(paths)
        for path in paths:
            found, unknown = _check_one(path, known_ops, accepts, unavailable or {})
            problems.extend(found)
            if unknown:
                unchecked.append((path, unknown))
    return CheckReport(problems, files, n_dirs, unchecked)


def _check_one(path: Path, known_ops: Mapping[str, str] | None, accepts: Accepts | None,
               unavailable: Mapping[str, str]) -> tuple[list[Problem], str | None]:
    """The problems of one file, and why its staleness cannot be told here (None when it can)."""
    judged = read(path)
    if judged.problem is not None:
        return [Problem(path, "error", judged.problem.message, judged.problem.kind)], None
    art = judged.artifact
    assert art is not None  # read() gives the artifact whenever it finds no problem
    known = known_ops is not None and art.op in known_ops
    if art.op in unavailable and not known:
        found = [Problem(path, "warning", f"op {art.op!r} is {unavailable[art.op]} here, so its config and op "
                                          f"version are not checked", f"op {unavailable[art.op]} here")]
    elif known_ops is not None and not known:
        return [Problem(path, "error", f"unknown op {art.op!r} (known: {', '.join(sorted(known_ops)) or 'none'})",
                        "unknown-op")], None
    else:
        found = []
        if known and accepts is not None:
            op = art.op
            rejected = rejection(art, lambda config, spec: accepts(op, spec, config))
            if rejected is not None:
                return [Problem(path, "error", rejected.message, rejected.kind)], None
    return _staleness(art, known_ops.get(art.op) if known_ops is not None else None, found)


def _staleness(art: Artifact, op_version: str | None, found: list[Problem]) -> tuple[list[Problem], str | None]:
    staleness = art.staleness(op_version)
    if staleness.stale:
        reason = staleness.reason()
        found.append(Problem(art.path, "stale", f"tuned with another toolchain ({reason}); re-tune it", reason))
        return found, None
    if not staleness.unknown:
        return found, None
    platform = platform_of(art.device.arch)
    if platform in staleness.unknown:
        return found, f"{art.device.arch} artifacts: no {platform.upper()} here to compare with"
    return found, f"{', '.join(staleness.unknown)} not installed here"


def _not_compared(unchecked: list[tuple[Path, str]], verbose: bool) -> list[str]:
    """One line per reason for the files whose staleness this machine cannot tell, counted per op and device
    (``fused_moe on NVIDIA_H200: 56``); every file below it only with ``verbose``. Not a problem: an
    artifact of a device absent here."""
    lines: list[str] = []
    for reason in dict.fromkeys(r for _, r in unchecked):
        paths = [p for p, r in unchecked if r == reason]
        counts: dict[str, int] = {}
        for p in paths:
            parsed = parse_filename(p.name)
            where = f"{parsed[0]} on {parsed[2]}" if parsed is not None else p.name
            counts[where] = counts.get(where, 0) + 1
        per = ", ".join(f"{where}: {n}" for where, n in sorted(counts.items()))
        lines.append(f"staleness not compared ({reason}): {len(paths)} file(s) ({per})"
                     + ("" if verbose else "; --verbose lists them"))
        if verbose:
            lines.extend(f"  {p}" for p in paths)
    return lines


def summary(report: CheckReport, *, strict: bool = False, verbose: bool = False) -> list[str]:
    """The lines ``flyreg check`` prints: each kind of finding with its count and its first
    :data:`SHOWN` files (every file with ``verbose``), one line per reason for the files whose
    staleness this machine cannot tell (each file with ``verbose``), then one line of totals."""
    lines: list[str] = []
    groups: dict[tuple[str, str], list[str]] = {}
    for p in report.problems:
        groups.setdefault((p.severity, p.kind), []).append(str(p))
    order = ("error", "stale", "warning")
    for (severity, kind), items in sorted(groups.items(), key=lambda g: order.index(g[0][0])):
        lines.append(f"{severity}: {_LABELS.get(kind, kind)}: {len(items)} file(s)")
        shown = items if verbose else items[:SHOWN]
        lines.extend(f"  {item}" for item in shown)
        if len(items) > len(shown):
            lines.append(f"  ... and {len(items) - len(shown)} more (--verbose lists every file)")
    lines.extend(_not_compared(report.unchecked, verbose))
    failing = [p for p in report.problems if p.severity == "error" or strict]
    passing = {} if strict else {s: sum(1 for p in report.problems if p.severity == s) for s in ("stale", "warning")}
    notes = [f"{n} {'stale' if s == 'stale' else 'warning(s)'}" for s, n in passing.items() if n]
    lines.append(f"checked {report.files} artifact(s) in {report.dirs} dir(s): {len(failing)} problem(s)"
                 + (f", {' and '.join(notes)} (not an error without --strict)" if notes else ""))
    return lines
