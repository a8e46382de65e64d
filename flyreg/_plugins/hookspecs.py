"""The hooks an op plugin implements. One plugin object is one op.

Implement them as plain functions (or methods) marked with :data:`flyreg.hookimpl`, in a
module (or an instance) named by an entry point of the group ``flyreg.ops``::

    [project.entry-points."flyreg.ops"]
    scale = "my_kernels.scale"

An implementation may take a subset of a hook's arguments, as pluggy allows, but no argument
the spec lacks. Every hook is ``firstresult``: it returns one value. Hooks run when a call key
is first seen (or when tuning); the steady-state call of an op runs none of them.
See ``docs/plugin_authoring.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pluggy

from flyreg._core.config import Config, JSONScalar
from flyreg._core.device import Device
from flyreg._plugins.record import OpRecord
from flyreg._plugins.work import Work

PROJECT = "flyreg"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: Hooks every op must implement.
REQUIRED_HOOKS = ("specialize", "build", "configs", "default")
#: Hooks an op may implement.
OPTIONAL_HOOKS = ("workloads", "make_inputs", "reference", "describe", "work")


@hookspec(firstresult=True)
def specialize(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, JSONScalar]:
    """Return the spec axes of a call: every value the best config depends on, as JSON scalars.

    Called with the call's positional ``args`` and keyword ``kwargs`` on the first call of
    each new argument signature (dtypes, shapes, strides, devices, scalar values).

    Example::

        @hookimpl
        def specialize(args, kwargs):
            x = args[0]
            return {"N": x.shape[-1], "dtype": str(x.dtype).removeprefix("torch.")}
    """


@hookspec(firstresult=True)
def build(config: Config, spec: dict[str, JSONScalar]) -> Callable[..., Any]:
    """Return the launch for ``config`` on ``spec``: a plain callable, or a :class:`flyreg.plugin.Launch`.

    Called once per (op, structural knobs, spec) in the process: the build cache shared by
    every tuner keeps the result. The launch callable receives the call's arguments plus each
    compiler hint of the config whose name it takes as a keyword. A ``Launch(launch, bind)``
    adds ``bind(args, kwargs)``: flyreg calls it once per call signature (tensor dtypes,
    shapes, strides, devices and other argument values), with the call's keywords plus those
    hints, and launches what it returns with the call's own arguments, so validation, launch
    arithmetic and compiling stay off the steady-state call. A search calls ``bind`` for its
    candidates from several threads at once. (A ``bind`` attribute set on a plain callable is
    read the same way, for plugins written before the record.)

    Example::

        @hookimpl
        def build(config, spec):
            chunk = config.kwargs["CHUNK"]

            def launch(x, out):
                for i in range(0, x.shape[0], chunk):
                    torch.mul(x[i:i + chunk], 2, out=out[i:i + chunk])

            return launch
    """


@hookspec(firstresult=True)
def configs(spec: dict[str, JSONScalar]) -> list[Config]:
    """Return the candidate configs searched for ``spec``.

    Called when a spec is searched, and to check that a config read from a cache or an
    artifact has this op's knobs.

    Example::

        @hookimpl
        def configs(spec):
            return [Config({"CHUNK": c}) for c in (1, 16, 256)]
    """


@hookspec(firstresult=True)
def default(spec: dict[str, JSONScalar], device: Device | None) -> Config:
    """Return the heuristic config used with no search and no artifact.

    Called when a new spec has no cached or offline config (and it is always timed in a search).
    ``device`` is the :class:`~flyreg.plugin.Device` the config is for (its name, architecture and
    known datasheet peaks), or None where none is named (the check that a stored config is the op's).
    An implementation may leave ``device`` out: its default is then the same on every device.

    Example::

        @hookimpl
        def default(spec, device):
            fast_memory = device is not None and (device.bandwidth or 0) >= 4e12
            return Config({"CHUNK": 32 if fast_memory else 16})
    """


@hookspec(firstresult=True)
def workloads(device: str) -> list[dict[str, JSONScalar]]:
    """Return the specs that ``flyreg tune`` tunes on ``device`` (``"cpu"``, ``"cuda"``, ...) when none are given.

    Called by tuning tools only, never on a call. An implementation may leave ``device`` out.

    Example::

        @hookimpl
        def workloads(device):
            return [{"N": n, "dtype": "float32"} for n in (1024, 4096)]
    """


@hookspec(firstresult=True)
def make_inputs(spec: dict[str, JSONScalar], device: str, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return ``(args, kwargs)`` of a call whose spec is ``spec``, on ``device``, for benchmarking.

    Called by tuning tools that tune a spec with no real call at hand (``workloads()``). ``seed``
    (0 first) picks the draw: an op whose time depends on its inputs' values, not only their shapes
    (a routing, a sparsity pattern), takes it and draws each seed apart. A search then times every
    candidate over several draws (:data:`flyreg._search.steady.DRAWS`), not one; an op that leaves
    ``seed`` out is timed on copies of one call.

    Example::

        @hookimpl
        def make_inputs(spec, device):
            x = torch.randn(64, spec["N"], device=device)
            return (x, torch.empty_like(x)), {}

        @hookimpl
        def make_inputs(spec, device, seed):  # an op routed by its inputs' values
            g = torch.Generator(device=device).manual_seed(seed)
            x = torch.randn(64, spec["N"], device=device, generator=g)
            return (x, torch.randint(0, 8, (64,), device=device, generator=g)), {}
    """


@hookspec(firstresult=True)
def reference(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Return what a correct call returns, computed plainly; used to gate wrong configs.

    Called once per search, before the candidates run; each candidate's result must match
    it. During a search it gets private copies of the ``restore_value`` and ``reset_to_zero``
    tensors: updating those as the kernel would makes each candidate's in-place results
    checked too. It must not modify any other input.

    Example::

        @hookimpl
        def reference(args, kwargs):
            return args[0] * 2
    """


@hookspec(firstresult=True)
def work(spec: dict[str, JSONScalar]) -> Work:
    """Return what one call of ``spec`` moves and computes: a :class:`flyreg.plugin.Work` with ``bytes``
    (read plus written in device memory) and/or ``flops``.

    Called by ``flyreg report`` only, never on a call: the report shows the winner's throughput as
    a fraction of the device's peak (bandwidth for bytes, FLOP/s for flops). An implementation
    may return None for a spec it cannot say.

    Example::

        @hookimpl
        def work(spec):
            size = {"float32": 4, "bfloat16": 2}[spec["dtype"]]
            return Work(bytes=2 * spec["M"] * spec["N"] * size)
    """


@hookspec(firstresult=True)
def describe() -> OpRecord | Mapping[str, Any]:
    """Return the op's record (:class:`flyreg.plugin.OpRecord`); every field is optional:

    ``description`` (one line), ``version`` (bump it to invalidate caches and artifacts),
    ``structural`` (knob names that change the built code; default: all knobs),
    ``arg_names`` (names of the positional arguments), ``restore_value`` and ``reset_to_zero``
    (argument names of tensors the kernel updates in place), ``axes`` (the spec axes, each a
    :class:`flyreg.plugin.Axis`: every spec is checked against them), ``ordered_axes`` (spec axes
    for nearest lookup, for an op that declares no ``axes``), ``config_dir`` (the directory of
    the artifacts the plugin ships, e.g. ``Path(__file__).parent / "configs"``), ``key_env``
    (environment variables whose values invalidate cached configs), ``timing`` (how a search on a GPU times candidates: ``"steady"``, the default,
    ``"flushed"`` for kernels that cannot be captured in a CUDA graph, or ``"graph"``),
    ``strategy`` (the search strategy preferred for a large config space, ``"exhaustive"`` or
    ``"local"``; None lets flyreg choose),
    ``torch_schema`` (the op's torch schema without its name, registered as
    ``torch.ops.flyreg.<op>`` by :mod:`flyreg.torch`), ``output_like`` (the argument the one
    output is shaped like, for its fake implementation) or ``torch_fake`` (the fake
    implementation itself).

    A dict of these fields (``axes`` aside) is accepted too, as before the record; any other key
    is an error. Called once, when the op is loaded.

    Example::

        @hookimpl
        def describe():
            return OpRecord(description="y = 2 x", structural=["CHUNK"], arg_names=["x", "out"],
                            axes=[Axis("N", int, ordered=True), Axis("dtype", str, values=("float32",))])
    """
