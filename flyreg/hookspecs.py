"""The hooks an op plugin implements. One plugin object is one op.

Implement them as plain functions (or methods) marked with :data:`flyreg.hookimpl`, in a
module named by an entry point of the group ``flyreg.ops``::

    [project.entry-points."flyreg.ops"]
    scale = "my_kernels.scale"

An implementation may take a subset of a hook's arguments, as pluggy allows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pluggy

from .config import Config, JSONScalar

PROJECT = "flyreg"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: Hooks every op must implement.
REQUIRED_HOOKS = ("specialize", "build", "configs", "default")
#: Hooks an op may implement.
OPTIONAL_HOOKS = ("workloads", "make_inputs", "reference", "describe")


@hookspec(firstresult=True)
def specialize(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, JSONScalar]:
    """Return the spec axes of a call: every value the best config depends on, as JSON scalars.

    Example::

        @hookimpl
        def specialize(args, kwargs):
            x = args[0]
            return {"N": x.shape[-1], "dtype": str(x.dtype).removeprefix("torch.")}
    """


@hookspec(firstresult=True)
def build(config: Config, spec: dict[str, JSONScalar]) -> Callable[..., Any]:
    """Return the launch callable for ``config`` on ``spec``.

    It is called once per (structural knobs, spec); the launch callable receives the call's
    arguments plus each compiler hint of the config whose name it takes as a keyword.

    Example::

        @hookimpl
        def build(config, spec):
            chunk = config.kwargs["CHUNK"]
            return lambda x, out: torch.mul(x, 2, out=out) if chunk else None
    """


@hookspec(firstresult=True)
def configs(spec: dict[str, JSONScalar]) -> list[Config]:
    """Return the candidate configs searched for ``spec``.

    Example::

        @hookimpl
        def configs(spec):
            return [Config({"CHUNK": c}) for c in (64, 256, 1024) if c <= spec["N"]]
    """


@hookspec(firstresult=True)
def default(spec: dict[str, JSONScalar]) -> Config:
    """Return the heuristic config used with no search and no artifact.

    Example::

        @hookimpl
        def default(spec):
            return Config({"CHUNK": 256})
    """


@hookspec(firstresult=True)
def workloads() -> list[dict[str, JSONScalar]]:
    """Return the specs that ``flyreg tune`` tunes when none are given.

    Example::

        @hookimpl
        def workloads():
            return [{"N": n, "dtype": "float32"} for n in (1024, 4096)]
    """


@hookspec(firstresult=True)
def make_inputs(spec: dict[str, JSONScalar], device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return ``(args, kwargs)`` of a call whose spec is ``spec``, on ``device``, for benchmarking.

    Example::

        @hookimpl
        def make_inputs(spec, device):
            x = torch.randn(64, spec["N"], device=device)
            return (x, torch.empty_like(x)), {}
    """


@hookspec(firstresult=True)
def reference(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Return what a correct call returns, computed plainly; used to gate wrong configs.

    It must not modify its inputs. Example::

        @hookimpl
        def reference(args, kwargs):
            return args[0].double() * 2
    """


@hookspec(firstresult=True)
def describe() -> Mapping[str, Any]:
    """Return facts about the op. Every key is optional:

    ``description`` (one line), ``version`` (bump it to invalidate caches), ``structural``
    (knob names that change the built code; default: all knobs), ``restore_value`` and
    ``reset_to_zero`` (argument names), ``ordered_axes`` (spec axes for nearest lookup),
    ``config_dir`` (a directory of shipped artifacts), ``key_env`` (environment variables
    whose values invalidate cached configs).

    Example::

        @hookimpl
        def describe():
            return {"description": "y = 2 x", "structural": ["CHUNK"], "ordered_axes": ["N"]}
    """
