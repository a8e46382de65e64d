"""The op plugins installed distributions provide, as their ``flyreg.ops`` entry points name them."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import flyreg


def entry_point(op: str) -> Any:
    (found,) = {ep.value: ep for ep in importlib.metadata.entry_points(group="flyreg.ops") if ep.name == op}.values()
    return found


def plugin(op: str) -> Any:
    """The plugin object of installed op ``op``: its hooks, callable directly."""
    return entry_point(op).load()


def new_tuner(op: str) -> Any:
    """A new tuner of installed op ``op`` (nothing in memory), which serves ``flyreg.op(op)`` from now on: the op
    registered again as its distribution registers it."""
    ep = entry_point(op)
    flyreg.unregister(op)
    flyreg.register(ep.load(), name=op, distribution=ep.dist.name, version=ep.dist.version)
    return flyreg.op(op)
