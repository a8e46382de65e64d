"""Entry-point discovery of op plugins, their tuners, and runtime resolution by op name."""

from __future__ import annotations

import difflib
import importlib.metadata
import os
import threading
from typing import Any

import attrs

from .config import JSONScalar
from .plugin import OpPlugin, PluginError

GROUP = "flyreg.ops"


class UnknownOpError(LookupError):
    """No op of that name is registered."""


class OpUnavailableError(RuntimeError):
    """The op is registered but broken or disabled."""


@attrs.frozen
class OpInfo:
    """A registered op as ``flyreg.ops()`` lists it; ``status`` is ``ok``, ``broken`` or ``disabled``."""

    name: str
    distribution: str
    version: str
    status: str
    error: str | None = None
    description: str = ""
    structural: tuple[str, ...] | None = None


@attrs.define
class _Entry:
    name: str
    distribution: str
    version: str
    load: Any  # () -> plugin object
    plugin: OpPlugin | None = None
    error: str | None = None
    tuner: Any = None
    loaded: bool = False


def disabled_ops() -> set[str]:
    """The ops named in ``FLYREG_DISABLE_OPS`` (comma-separated)."""
    return {n.strip() for n in os.environ.get("FLYREG_DISABLE_OPS", "").split(",") if n.strip()}


class Registry:
    """Every known op: entry points (read once, lazily) plus in-process registrations."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] | None = None
        self._lock = threading.RLock()

    def _discover(self) -> dict[str, _Entry]:
        with self._lock:
            if self._entries is None:
                entries: dict[str, _Entry] = {}
                for ep in importlib.metadata.entry_points(group=GROUP):
                    dist = getattr(ep, "dist", None)
                    entry = _Entry(ep.name, dist.name if dist else "?", dist.version if dist else "?", ep.load)
                    other = entries.get(ep.name)
                    if other is not None and other.distribution != entry.distribution:
                        other.error = (f"op {ep.name!r} is registered by two distributions: "
                                       f"{other.distribution} and {entry.distribution}")
                        other.loaded = True
                        continue
                    entries[ep.name] = entry
                self._entries = entries
            return self._entries

    def _load(self, entry: _Entry) -> None:
        with self._lock:
            if entry.loaded:
                return
            entry.loaded = True
            try:
                entry.plugin = OpPlugin(entry.name, entry.load())
            except Exception as e:  # any failure isolates this op only
                entry.error = f"{type(e).__name__}: {e}"

    def register(self, obj: object, name: str, *, distribution: str = "<in-process>", version: str = "0") -> None:
        """Register ``obj`` as op ``name`` in this process (for notebooks and tests)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty op name, got {name!r}")
        entries = self._discover()
        with self._lock:
            if name in entries:
                raise ValueError(f"op {name!r} is already registered by {entries[name].distribution}")
            entry = _Entry(name, distribution, version, lambda: obj)
            self._load(entry)
            if entry.error:
                raise PluginError(f"op {name!r}: {entry.error}")
            entries[name] = entry

    def unregister(self, name: str) -> None:
        """Remove an op registered with :meth:`register` (and its tuner)."""
        entries = self._discover()
        with self._lock:
            entry = entries.get(name)
            if entry is None:
                raise self._unknown(name)
            del entries[name]

    def _unknown(self, name: str) -> UnknownOpError:
        known = sorted(self._discover())
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return UnknownOpError(f"unknown op {name!r}{hint} (known ops: {', '.join(known) or 'none'})")

    def plugin(self, name: str) -> OpPlugin:
        """The usable plugin of op ``name``; raises for unknown, disabled or broken ops."""
        entry = self._discover().get(name)
        if entry is None:
            raise self._unknown(name)
        if name in disabled_ops():
            raise OpUnavailableError(f"op {name!r} is disabled by FLYREG_DISABLE_OPS")
        self._load(entry)
        if entry.plugin is None:
            raise OpUnavailableError(f"op {name!r} ({entry.distribution}) is broken: {entry.error}")
        return entry.plugin

    def tuner(self, name: str) -> Any:
        """The op's tuner, assembled from its hooks on first use."""
        plugin = self.plugin(name)
        entry = self._discover()[name]
        if entry.tuner is None:
            with self._lock:
                if entry.tuner is None:
                    entry.tuner = build_tuner(plugin)
        return entry.tuner

    def infos(self) -> list[OpInfo]:
        out = []
        disabled = disabled_ops()
        for name, entry in sorted(self._discover().items()):
            if name in disabled:
                out.append(OpInfo(name, entry.distribution, entry.version, "disabled"))
                continue
            self._load(entry)
            if entry.plugin is None:
                out.append(OpInfo(name, entry.distribution, entry.version, "broken", entry.error))
                continue
            d = entry.plugin.description
            out.append(OpInfo(name, entry.distribution, entry.version, "ok", None, d.description, d.structural))
        return out


def build_tuner(plugin: OpPlugin) -> Any:
    """Assemble the autotuner of one op from its registered hooks."""
    from .builder import autotune_builder

    d = plugin.description

    def specialize(*args: Any, **kwargs: Any) -> dict[str, JSONScalar]:
        return plugin.specialize(args, kwargs)

    return autotune_builder(
        plugin.name, plugin.build, specialize, plugin.configs, plugin.default, structural=d.structural,
        arg_names=d.arg_names or (), restore_value=d.restore_value, reset_to_zero=d.reset_to_zero,
        reference=plugin.reference if plugin.implements("reference") else None, key_env=d.key_env,
        version=d.version, config_dirs=[d.config_dir] if d.config_dir else [], ordered_axes=d.ordered_axes,
    )


REGISTRY = Registry()


def op(name: str) -> Any:
    """The callable of op ``name``: specializes the call, resolves its config and launches.

    Example::

        y = flyreg.op("rmsnorm")(x, weight)
    """
    return REGISTRY.tuner(name)


def resolve(name: str, *args: Any, **kwargs: Any) -> Any:
    """The config (and its source) a call of op ``name`` with these arguments gets, without launching."""
    return REGISTRY.tuner(name).resolve(*args, **kwargs)


def resolve_spec(name: str, spec: dict[str, Any], device: Any = None) -> Any:
    """The config (and its source) of op ``name`` for ``spec`` on ``device`` (default: the CPU); no tensors, no search."""
    return REGISTRY.tuner(name).resolve_spec(spec, device)


def ops() -> list[OpInfo]:
    """Every registered op with its distribution, version and status."""
    return REGISTRY.infos()


def register(obj: object, name: str) -> None:
    """Register ``obj`` (a module or instance implementing the hooks) as op ``name`` in this process."""
    REGISTRY.register(obj, name)


def unregister(name: str) -> None:
    """Remove op ``name`` registered with :func:`register`."""
    REGISTRY.unregister(name)
