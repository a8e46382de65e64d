"""Entry-point discovery of op plugins, their tuners, and runtime resolution by op name.

Discovery reads the entry points of the group ``flyreg.ops`` once per process, on first use;
each entry point is one op, loaded (imported and checked) on first use of that op. A broken
plugin is recorded with its error and never affects other ops.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import re
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs

from flyreg._core import settings
from flyreg._core.config import Config, JSONScalar
from flyreg._core.fileio import warn_once
from flyreg._plugins.manager import OpPlugin, PluginError

if TYPE_CHECKING:
    from flyreg._runtime.tuner import Autotuner, Resolution

GROUP = "flyreg.ops"
IN_PROCESS = "<in-process>"


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
    load: Callable[[], object]
    plugin: OpPlugin | None = None
    error: str | None = None
    tuner: Autotuner | None = None
    loaded: bool = False
    loading: threading.Event | None = None
    announced: bool = False  # the watchers have been told it loaded


def plugin_load_timeout() -> float:
    """Seconds an op plugin may take to import and describe itself before it is marked broken
    (``FLYREG_PLUGIN_TIMEOUT``, default 30)."""
    return settings.current().plugin_timeout


def _canonical(distribution: str) -> str:
    """A distribution name as packaging normalizes it (``My_Kernels`` is ``my-kernels``)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _check_name(name: object) -> str:
    """``name`` if it is an op name; ``TypeError`` (not a str) or ``ValueError`` (empty) naming ``name``."""
    if not isinstance(name, str):
        raise TypeError(f"name must be an op name (a non-empty str), got {type(name).__name__} {name!r}")
    if not name.strip():
        raise ValueError(f"name must be a non-empty op name, got {name!r}")
    return name


def _group_entry_points() -> Iterable[Any]:
    # Looked up at call time so tests can monkeypatch importlib.metadata.entry_points.
    return importlib.metadata.entry_points(group=GROUP)


class Registry:
    """Every known op: entry points (read once, lazily) plus in-process registrations.

    ``entry_points`` returns the entry points to discover (objects with ``name``, ``load()``
    and ``dist``); the default reads the group ``flyreg.ops`` of the installed distributions.
    """

    def __init__(self, entry_points: Callable[[], Iterable[Any]] | None = None) -> None:
        self._source = entry_points if entry_points is not None else _group_entry_points
        self._entries: dict[str, _Entry] | None = None
        self._lock = threading.RLock()
        self._watchers: list[tuple[Callable[[str, OpPlugin], None], Callable[[str], None]]] = []
        self._mark_load: Callable[[str, bool], None] | None = None

    def mark_loads(self, mark: Callable[[str, bool], None] | None) -> None:
        """Call ``mark(name, True)`` right before an op's plugin code runs (its import and description) and
        ``mark(name, False)`` right after, in the loading thread: a supervising process learns from it which
        op's plugin ended the process (:mod:`flyreg._cli.supervise`)."""
        self._mark_load = mark

    def refuse(self, name: str, why: str) -> None:
        """Mark op ``name`` broken with ``why``, never running its plugin code in this process (its load ended
        an earlier process)."""
        entry = self._discover().get(name)
        if entry is not None:
            with self._lock:
                entry.loaded, entry.error = True, why

    def watch(self, on_load: Callable[[str, OpPlugin], None], on_unload: Callable[[str], None]) -> None:
        """Call ``on_load(name, plugin)`` when an op first loads (or is registered in-process) from now
        on, and ``on_unload(name)`` when such an op is unregistered; each in the caller's thread."""
        with self._lock:
            self._watchers.append((on_load, on_unload))

    def _announce(self, entry: _Entry) -> None:
        if entry.announced or entry.plugin is None:
            return
        with self._lock:
            if entry.announced:
                return
            entry.announced = True
            watchers = list(self._watchers)
        for on_load, _ in watchers:
            on_load(entry.name, entry.plugin)

    def _discover(self) -> dict[str, _Entry]:
        with self._lock:
            if self._entries is None:
                by_name: dict[str, list[_Entry]] = {}
                for ep in self._source():
                    dist = getattr(ep, "dist", None)
                    entry = _Entry(ep.name, getattr(dist, "name", None) or "?",
                                   getattr(dist, "version", None) or "?", ep.load)
                    same = by_name.setdefault(ep.name, [])
                    if all(_canonical(e.distribution) != _canonical(entry.distribution) for e in same):
                        same.append(entry)  # the same distribution seen twice on sys.path counts once
                entries: dict[str, _Entry] = {}
                for name, found in by_name.items():
                    entry = found[0]
                    if len(found) > 1:
                        dists = [e.distribution for e in found]
                        entry.distribution = ", ".join(dists)
                        entry.version = ", ".join(e.version for e in found)
                        entry.error = (f"op {name!r} is registered by {len(dists)} distributions: "
                                       f"{' and '.join(dists)}; uninstall all but one")
                        entry.loaded = True
                    entries[name] = entry
                self._entries = entries
            return self._entries

    def _load(self, entry: _Entry) -> None:
        """Import and check ``entry``'s plugin in a thread of its own, within the load time limit.

        No lock is held while plugin code runs: other ops load and serve meanwhile. A plugin past
        the limit is broken ("load timed out"); its thread is left to finish on its own and
        changes nothing then. ``SystemExit`` from a plugin is recorded like any error.
        """
        with self._lock:
            if entry.loaded:
                return
            done = entry.loading
            if done is None:
                done = entry.loading = threading.Event()
                threading.Thread(target=self._load_now, args=(entry, done), daemon=True,
                                 name=f"flyreg-load-{entry.name}").start()
        limit = plugin_load_timeout()
        if not done.wait(limit):
            with self._lock:
                if not entry.loaded:
                    entry.loaded = True
                    entry.error = (f"load timed out: importing or describing the plugin took longer than "
                                   f"{limit:g} s (FLYREG_PLUGIN_TIMEOUT)")
            mark = self._mark_load
            if mark is not None:  # given up on: whatever ends the process later is not this load
                mark(entry.name, False)

    def _load_now(self, entry: _Entry, done: threading.Event) -> None:
        plugin, error = None, None
        mark = self._mark_load
        if mark is not None:
            mark(entry.name, True)
        try:
            plugin = OpPlugin(entry.name, entry.load())
        except PluginError as e:
            error = str(e)
        except SystemExit as e:
            error = f"the plugin called sys.exit({e.code!r}) while loading"
        except Exception as e:  # any failure isolates this op only
            error = f"{type(e).__name__}: {e}"
        if mark is not None:
            mark(entry.name, False)
        with self._lock:
            if not entry.loaded:  # not timed out meanwhile
                entry.plugin, entry.error, entry.loaded = plugin, error, True
        done.set()

    def register(self, obj: object, name: str, *, distribution: str = IN_PROCESS, version: str = "0") -> None:
        """Register ``obj`` (a module or instance implementing the hooks) as op ``name`` in this process.

        Raises :class:`PluginError` at once if the plugin is broken, ValueError if the name is taken.
        """
        _check_name(name)
        entries = self._discover()
        self._check_free(entries, name)
        entry = _Entry(name, distribution, version, lambda: obj)
        self._load(entry)  # outside the lock: the load runs plugin code
        if entry.plugin is None:
            raise PluginError(entry.error or f"op {name!r} is broken")
        with self._lock:
            self._check_free(entries, name)
            _forget_builds(name)  # a previous op of this name may have left launch callables
            entries[name] = entry
        self._announce(entry)

    @staticmethod
    def _check_free(entries: dict[str, _Entry], name: str) -> None:
        if name in entries:
            raise ValueError(f"op {name!r} is already registered by {entries[name].distribution}; "
                             f"unregister it first")

    def unregister(self, name: str) -> None:
        """Remove op ``name`` from this process (with its tuner and built launch callables).

        An op discovered from an entry point stays removed until the process restarts.
        """
        _check_name(name)
        entries = self._discover()
        with self._lock:
            if name not in entries:
                raise self._unknown(name)
            entry = entries.pop(name)
            _forget_builds(name)
            watchers = list(self._watchers) if entry.announced else []
        for _, on_unload in watchers:
            on_unload(name)

    def disabled(self) -> frozenset[str]:
        """The ops ``FLYREG_DISABLE_OPS`` names; warns once about each set of names no registered op has."""
        names = settings.current().disable_ops
        if names:
            known = self._discover()
            unknown = sorted(n for n in names if n not in known)
            if unknown:
                warn_once(f"flyreg: FLYREG_DISABLE_OPS names no registered op: {', '.join(map(repr, unknown))} "
                          f"(names are matched exactly; known ops: {', '.join(sorted(known)) or 'none'})",
                          key=f"disable-unknown:{unknown}")
        return names

    def names(self) -> list[str]:
        """Every registered op name, whatever its status."""
        return sorted(self._discover())

    def _unknown(self, name: str) -> UnknownOpError:
        known = self.names()
        close = difflib.get_close_matches(name, known, n=1)
        if not close:
            close = [k for k in known if k.lower() == str(name).lower()]
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return UnknownOpError(f"unknown op {name!r}{hint} (known ops: {', '.join(known) or 'none'})")

    def plugin(self, name: str) -> OpPlugin:
        """The usable plugin of op ``name``; raises for unknown, disabled or broken ops."""
        entry = self._discover().get(_check_name(name))
        if entry is None:
            raise self._unknown(name)
        if name in self.disabled():
            raise OpUnavailableError(f"op {name!r} is disabled by FLYREG_DISABLE_OPS")
        self._load(entry)
        if entry.plugin is None:
            raise OpUnavailableError(f"op {name!r} ({entry.distribution}) is broken: {entry.error}")
        self._announce(entry)
        return entry.plugin

    def tuner(self, name: str) -> Autotuner:
        """The op's tuner, assembled from its hooks on first use."""
        plugin = self.plugin(name)  # checks the name
        entry = self._discover()[name]
        if entry.tuner is None:
            with self._lock:
                if entry.tuner is None:
                    entry.tuner = build_tuner(plugin)
        return entry.tuner

    def infos(self) -> list[OpInfo]:
        """Every registered op with its status; loads each op not disabled."""
        out = []
        disabled = self.disabled()
        for name, entry in sorted(self._discover().items()):
            if name in disabled:
                out.append(OpInfo(name, entry.distribution, entry.version, "disabled"))
                continue
            self._load(entry)
            if entry.plugin is None:
                out.append(OpInfo(name, entry.distribution, entry.version, "broken", entry.error))
                continue
            rec = entry.plugin.record
            out.append(OpInfo(name, entry.distribution, entry.version, "ok", None, rec.description, rec.structural))
        return out


def _forget_builds(name: str) -> None:
    from flyreg._runtime.builds import BUILD_CACHE

    BUILD_CACHE.clear(name)


def build_tuner(plugin: OpPlugin) -> Autotuner:
    """Assemble the autotuner of one op from its record and its registered hooks (it uses the shared build cache)."""
    from flyreg._runtime.tuner import Autotuner

    rec = plugin.record

    def specialize(*args: Any, **kwargs: Any) -> dict[str, JSONScalar]:
        return plugin.specialize(args, kwargs)

    tuner = Autotuner.from_record(
        plugin.name, rec, plugin.build, specialize, plugin.configs, plugin.default,
        reference=plugin.reference if plugin.implements("reference") else None,
        spec_check=plugin.check_spec if rec.axes else None)
    if plugin.implements("make_inputs"):
        tuner.make_inputs, tuner.seeded_inputs = plugin.make_inputs, plugin.seeded_inputs()
    return tuner


REGISTRY = Registry()


def op(name: str) -> Autotuner:
    """The callable of op ``name``: specializes the call, resolves its config and launches.

    Keep the returned tuner: its steady-state call skips every hook. Example::

        rmsnorm = flyreg.op("rmsnorm")
        y = rmsnorm(x, weight)
    """
    return REGISTRY.tuner(name)


def resolve(name: str, *args: Any, **kwargs: Any) -> Resolution:
    """The config (and its source) a call of op ``name`` with these arguments gets, without launching."""
    return REGISTRY.tuner(name).resolve(*args, **kwargs)


def resolve_spec(name: str, spec: dict[str, Any], device: Any = None) -> Resolution:
    """The config (and its source) of op ``name`` for ``spec`` on ``device`` (default: the CPU); no tensors, no search.

    A spec that does not fit the op's declared axes raises :class:`~flyreg._core.keys.SpecError`; axes
    it leaves out that have a device default get the device's value.
    """
    return REGISTRY.tuner(name).resolve_spec(spec, device)


def accepts(name: str, spec: dict[str, JSONScalar], config: Config) -> str | None:
    """Why op ``name`` would not take ``config`` (read from a file) for ``spec``, or None if it would.

    Lookup serves a stored config only when it is one of the op's ``configs(spec)`` or its
    ``default(spec)``, knobs and hints alike. Raises :class:`~flyreg._core.keys.SpecError` for a spec
    that is not one the op stores (one that does not fit its declared axes), and what the op's hooks
    raise for ``spec``.
    """
    return REGISTRY.tuner(name).space.accepts(config, spec)


def ops() -> list[OpInfo]:
    """Every registered op with its distribution, version and status."""
    return REGISTRY.infos()


def register(obj: object, name: str, *, distribution: str = IN_PROCESS, version: str = "0") -> None:
    """Register ``obj`` (a module or instance implementing the hooks) as op ``name`` in this process."""
    REGISTRY.register(obj, name, distribution=distribution, version=version)


def unregister(name: str) -> None:
    """Remove op ``name`` from this process's registry."""
    REGISTRY.unregister(name)
