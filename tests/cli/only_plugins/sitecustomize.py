"""Run at start-up by every interpreter with this directory on PYTHONPATH: the CLI tests' ``flyreg``
commands, and the interpreters those start (``list`` and ``check`` run in a child).

With ``_FLYREG_TEST_DISTRIBUTIONS`` set (comma-separated distribution names), only the
``flyreg.ops`` entry points of those distributions are seen, so a third-party plugin installed
in the same environment never changes what a test's command prints; and SIGINT raises
KeyboardInterrupt as in a command started from a terminal (a test runner started in the
background of a non-interactive shell hands its children SIGINT ignored). Then the
environment's own ``sitecustomize``, which this file hides, runs as usual.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import signal
import sys
from collections.abc import Callable, Iterable
from typing import Any

VARIABLE = "_FLYREG_TEST_DISTRIBUTIONS"
GROUP = "flyreg.ops"


def canonical(distribution: str) -> str:
    """A distribution name as packaging normalizes it (``Broken_Ops`` is ``broken-ops``)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


#: ``importlib.metadata.entry_points`` as it was before any restriction.
_EVERY: Callable[..., Any] = importlib.metadata.entry_points


def restrict_plugins(dists: Iterable[str]) -> None:
    """From now on, ``flyreg.ops`` entry points come only from the distributions ``dists`` (in place of any
    earlier restriction)."""
    allowed = {canonical(d) for d in dists}

    def entry_points(**params: Any) -> Any:
        found = _EVERY(**params)
        if params.get("group") != GROUP:
            return found
        return [ep for ep in found if ep.dist is not None and canonical(ep.dist.name) in allowed]

    importlib.metadata.entry_points = entry_points  # type: ignore[assignment]


def as_from_a_terminal() -> None:
    """Take SIGINT as a command started from a terminal does."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _run_the_hidden_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != here])
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if (_dists := os.environ.get(VARIABLE)) is not None:
    restrict_plugins(_dists.split(","))
    as_from_a_terminal()
_run_the_hidden_sitecustomize()
