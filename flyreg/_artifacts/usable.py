"""The one rule for a stored config: whether it may be served, and whether it is current.

Lookup, emission, ``flyreg tune``'s planning, ``flyreg show`` and ``flyreg check`` all ask it,
so a file ``check`` calls ignored is never served, and one it passes is.

* A stored config (an artifact's or a scratch-cache entry's) is *accepted* when the op offers it
  for its spec (:func:`config_problem`).
* An artifact file is *usable* when, besides, lookup lists it (its name parses), it is
  well-formed, tuned on a device whose name a runtime can have (sanitized), and named by its
  content (:func:`judge`).
* A usable artifact is *current* when nothing its spec's backend depends on changed since it was
  tuned (:meth:`flyreg._artifacts.store.Artifact.staleness`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from flyreg._artifacts.names import parse_filename
from flyreg._artifacts.store import Artifact, ArtifactError, load_artifact
from flyreg._core.config import Config, JSONScalar
from flyreg._core.keys import SpecError
from flyreg._core.spec import name_part, spec_line

#: ``accepts(config, spec)``: why the op would not take ``config`` for ``spec``, or None; may raise.
Accepts = Callable[[Config, dict[str, JSONScalar]], "str | None"]


@attrs.frozen
class Unusable:
    """Why lookup ignores a file: ``kind`` (``unlisted``, ``malformed``, ``unsanitized``, ``misnamed``,
    ``misfit``, ``rejected``) and a one-line ``message``."""

    kind: str
    message: str


@attrs.frozen
class Judged:
    """One artifact file as the rule sees it: its content (None when unreadable) and its problem (None: usable)."""

    path: Path
    artifact: Artifact | None
    problem: Unusable | None


def config_problem(config: Config, spec: Mapping[str, JSONScalar], accepts: Accepts) -> str | None:
    """Why the op would not take ``config`` for ``spec``, or None; a hook failing on the spec is a reason too."""
    try:
        return accepts(config, dict(spec))
    except Exception as e:  # a plugin's configs() or default() failing on this spec
        return _failed(e)


def _failed(e: Exception) -> str:
    return f"its configs() or default() failed on the spec: {type(e).__name__}: {' '.join(str(e).split())}"


def read(path: Path) -> Judged:
    """The artifact at ``path``, and why no lookup would serve it from the file alone (no op asked)."""
    if parse_filename(path.name) is None:
        hint = "hidden files are" if path.name.startswith(".") else "the name is"
        return Judged(path, None, Unusable(
            "unlisted", f"lookup never reads it: {hint} not op,<axis>=<value>,...,device_name=<name>.json"))
    try:
        art = load_artifact(path)
    except ArtifactError as e:
        return Judged(path, None, Unusable("malformed", str(e)))
    if name_part(art.device.name) != art.device.name:
        return Judged(path, art, Unusable("unsanitized", f"device name {art.device.name!r} is not sanitized "
                                                         f"(runtime names are ASCII letters, digits and ._-)"))
    if path.name != art.filename:
        return Judged(path, art, Unusable("misnamed", f"filename does not match its content (it holds "
                                                      f"{art.filename}, not what its filename says)"))
    return Judged(path, art, None)


def rejection(art: Artifact, accepts: Accepts) -> Unusable | None:
    """Why the op (``accepts``) would not take the config of ``art`` for its own spec, or None.

    A spec that does not fit the op's declared axes (``accepts`` raises :class:`SpecError`) is no
    spec the op ever looks up.
    """
    try:
        why = accepts(art.config, dict(art.spec))
    except SpecError as e:
        return Unusable("misfit", f"{e}; lookup never serves this file")
    except Exception as e:  # a plugin's configs() or default() failing on this spec
        why = _failed(e)
    if why:
        return Unusable("rejected", f"config not accepted by op {art.op!r} for spec {spec_line(art.spec)}: "
                                    f"{why}; lookup ignores this file")
    return None


def judge(path: Path, accepts: Accepts | None) -> Judged:
    """:func:`read`, then (given ``accepts``, the op's) whether the op takes its config for its own spec."""
    judged = read(path)
    art = judged.artifact
    if judged.problem is not None or art is None or accepts is None:
        return judged
    return Judged(path, art, rejection(art, accepts))
