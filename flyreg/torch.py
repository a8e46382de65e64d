"""flyreg ops as torch custom ops, for ``torch.compile`` and CUDA graphs: ``torch.ops.flyreg.<op>``.

Every op whose record declares a ``torch_schema`` (see :class:`flyreg.plugin.OpRecord`) is
registered, and no plugin writes torch.library code. When:

* ``import flyreg.torch`` registers every op installed then that has a schema (it loads each
  op's plugin; a broken or disabled op is left out);
* after that import, an op registers itself when it loads or is registered with
  :func:`flyreg.register`, and :func:`flyreg.unregister` removes it again.

``import flyreg`` and importing a plugin register nothing. Example::

    import flyreg.torch

    y = torch.ops.flyreg.rmsnorm(x, weight, 1e-6)

Each op's real implementation is the flyreg tuner of the op (``flyreg.op(name)``), so the
scratch cache, the artifacts and the defaults apply exactly as in eager code. Its fake (meta)
implementation is the record's ``torch_fake``, or allocates the output like the argument its
``output_like`` names, so ``torch.compile`` traces through it with no graph break. Arguments
written in place are marked mutated (``Tensor(a!)``) in the schema and their version counter is
bumped after each call, so autograd refuses a backward through a graph that saved their old value.

Cost: the ops are defined with ``torch.library.Library`` (a schema and one
CompositeExplicitAutograd kernel), not ``torch.library.custom_op``, whose Python wrapper layers
cost about 25 us per eager call on the H200's host; the dispatcher calls the tuner itself for an
op that writes nothing in place. Inside a compiled graph replayed through CUDA graphs the
dispatch cost is paid at capture only.

Forward only: no autograd formula is registered. A tuner refuses inputs that require grad with
grad mode on, naming the argument.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from flyreg._core.fileio import FlyregWarning
from flyreg._plugins.manager import OpPlugin
from flyreg._plugins.record import OpRecord
from flyreg._plugins.registry import REGISTRY, OpUnavailableError, UnknownOpError
from flyreg._plugins.schema import Schema

__all__ = ["NAMESPACE", "register", "registered"]

NAMESPACE = "flyreg"

_lock = threading.RLock()
#: One Library per registered op: its registrations live as long as it does.
_libs: dict[str, torch.library.Library] = {}


def _written(schema: Schema) -> tuple[tuple[int, str], ...]:
    return tuple((i, a.name) for i, a in enumerate(schema.args) if a.mutated)


def _real(name: str, schema: Schema) -> Callable[..., Any]:
    """The real implementation: the op's tuner, plus the version bumps of the tensors it writes."""
    tuner = REGISTRY.tuner(name)
    written = _written(schema)
    if not written and not schema.returns_nothing:
        return tuner
    bump = torch.autograd.graph.increment_version
    nothing = schema.returns_nothing

    def real(*args: Any, **kwargs: Any) -> Any:
        out = tuner(*args, **kwargs)
        for i, arg in written:
            t = args[i] if i < len(args) else kwargs.get(arg)
            if t is not None and not t.is_inference():  # inference tensors have no version counter
                bump(t)
        return None if nothing else out

    return real


def _fake(record: OpRecord, schema: Schema) -> Callable[..., Any]:
    if record.torch_fake is not None:
        return record.torch_fake
    if record.output_like is None:  # returns ()
        return lambda *args, **kwargs: None
    like = record.output_like
    at = schema.names.index(like)

    def fake(*args: Any, **kwargs: Any) -> torch.Tensor:
        t = args[at] if at < len(args) else kwargs[like]
        return t.new_empty(t.shape)

    return fake


def _define(name: str, plugin: OpPlugin) -> Any:
    schema = plugin.record.schema()
    if schema is None:
        return None
    if not name.isidentifier():
        raise ValueError(f"op {name!r} declares a torch_schema, but torch op names must be identifiers")
    register_fake = getattr(torch.library, "register_fake", None)
    if register_fake is None:
        raise RuntimeError(f"flyreg torch ops need torch.library.register_fake (torch >= 2.4); "
                           f"this is torch {torch.__version__}")
    with _lock:
        if name in _libs:
            return getattr(getattr(torch.ops, NAMESPACE), name)
        lib = torch.library.Library(NAMESPACE, "FRAGMENT")
        try:
            lib.define(schema.text(name))
            lib.impl(name, _real(name, schema), "CompositeExplicitAutograd")
            register_fake(f"{NAMESPACE}::{name}", _fake(plugin.record, schema), lib=lib)
        except BaseException:
            lib._destroy()
            raise
        _libs[name] = lib
        return getattr(getattr(torch.ops, NAMESPACE), name)


def register(name: str) -> Any:
    """Register op ``name`` as ``torch.ops.flyreg.<name>`` (once per process) and return its op packet.

    Raises :class:`flyreg.UnknownOpError` or :class:`flyreg.OpUnavailableError` for an op that
    cannot be loaded, ValueError for one without a ``torch_schema``, and torch's own error for a
    schema torch rejects.
    """
    packet = _define(name, REGISTRY.plugin(name))
    if packet is None:
        raise ValueError(f"op {name!r} declares no torch_schema in its record, so it has no torch op")
    return packet


def registered() -> dict[str, Any]:
    """The op packets (``torch.ops.flyreg.<name>``) registered so far, by op name."""
    with _lock:
        names = sorted(_libs)
    ns = getattr(torch.ops, NAMESPACE)
    return {n: getattr(ns, n) for n in names}


def _on_load(name: str, plugin: OpPlugin) -> None:
    try:
        _define(name, plugin)
    except Exception as e:  # the op still serves flyreg.op(name); only its torch op is missing
        warnings.warn(f"flyreg: op {name!r} is not registered as torch.ops.{NAMESPACE}.{name}: "
                      f"{type(e).__name__}: {e}", FlyregWarning, stacklevel=2)


def _on_unload(name: str) -> None:
    with _lock:
        lib = _libs.pop(name, None)
        if lib is not None:
            lib._destroy()


def _register_installed() -> None:
    REGISTRY.watch(_on_load, _on_unload)
    for name in REGISTRY.names():
        try:
            plugin = REGISTRY.plugin(name)  # an op loading for the first time is registered by _on_load
        except (UnknownOpError, OpUnavailableError):
            continue
        _on_load(name, plugin)  # one loaded before this import


_register_installed()
