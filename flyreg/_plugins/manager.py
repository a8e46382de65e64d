"""A typed facade over one op plugin's pluggy hooks."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pluggy

from flyreg._plugins import hookspecs
from flyreg._search.bench import TIMINGS
from flyreg._core.config import Config, JSONScalar

#: The keys ``describe()`` may return.
DESCRIBE_KEYS = frozenset({"description", "version", "structural", "restore_value", "reset_to_zero",
                           "ordered_axes", "config_dir", "key_env", "arg_names", "timing"})


class PluginError(Exception):
    """An op plugin that cannot be used: it failed to load, lacks a hook, or a hook misbehaved."""


@attrs.frozen
class OpDescription:
    """What an op's ``describe`` hook says, with defaults for what it leaves out."""

    description: str = ""
    version: str = "0"
    structural: tuple[str, ...] | None = None
    restore_value: tuple[str, ...] = ()
    reset_to_zero: tuple[str, ...] = ()
    ordered_axes: tuple[str, ...] = ()
    config_dir: Path | None = None
    key_env: tuple[str, ...] = ()
    arg_names: tuple[str, ...] | None = None
    timing: str = "steady"

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None) -> OpDescription:
        """Check and convert what ``describe()`` returned; raises :class:`PluginError` on anything malformed.

        ``restore_value`` and ``reset_to_zero`` need ``arg_names`` listing every name they give:
        a name that is not an argument would otherwise never be restored or zeroed, silently.
        """
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise PluginError(f"describe() must return a mapping, got {type(raw).__name__}")
        unknown = set(raw) - DESCRIBE_KEYS
        if unknown:
            raise PluginError(f"describe() returned unknown keys {sorted(map(str, unknown))}; "
                              f"known: {sorted(DESCRIBE_KEYS)}")

        def names(key: str) -> tuple[str, ...] | None:
            value = raw.get(key)
            if value is None:
                return None
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
                raise PluginError(f"describe()[{key!r}] must be a list of names, got {value!r}")
            return tuple(value)

        for key in ("description", "version"):
            value = raw.get(key)
            if value is not None and not isinstance(value, (str, int)):
                raise PluginError(f"describe()[{key!r}] must be a string, got {value!r}")
        config_dir = raw.get("config_dir")
        if config_dir is not None and not isinstance(config_dir, (str, os.PathLike)):
            raise PluginError(f"describe()['config_dir'] must be a path, got {config_dir!r}")
        timing = raw.get("timing", "steady")
        if timing not in TIMINGS:
            raise PluginError(f"describe()['timing'] must be one of {list(TIMINGS)}, got {timing!r}")
        arg_names = names("arg_names")
        restore_value = names("restore_value") or ()
        reset_to_zero = names("reset_to_zero") or ()
        for key, wanted in (("restore_value", restore_value), ("reset_to_zero", reset_to_zero)):
            missing = [n for n in wanted if n not in (arg_names or ())]
            if not missing:
                continue
            if arg_names is None:
                raise PluginError(f"describe()[{key!r}] names arguments {missing}, but describe() gives no "
                                  f"'arg_names' to find them by; add 'arg_names' (the positional argument names, "
                                  f"in order)")
            raise PluginError(f"describe()[{key!r}] names arguments {missing} that are not in "
                              f"describe()['arg_names'] {list(arg_names)}")
        return cls(
            description=str(raw.get("description") or ""),
            version=str(raw.get("version", "0")),
            structural=names("structural"),
            restore_value=restore_value,
            reset_to_zero=reset_to_zero,
            ordered_axes=names("ordered_axes") or (),
            config_dir=Path(config_dir) if config_dir is not None else None,
            key_env=names("key_env") or (),
            arg_names=arg_names,
            timing=timing,
        )


def _required_params(fn: Callable[..., Any]) -> list[str] | None:
    """The argument names pluggy passes to ``fn`` (those without a default), or None if unknown."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in params
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _check_arg_names(name: str, obj: object) -> None:
    """Raise a one-line :class:`PluginError` for a hook taking an argument its spec lacks (``build(cfg, spec)``)."""
    for hook in (*hookspecs.REQUIRED_HOOKS, *hookspecs.OPTIONAL_HOOKS):
        fn = getattr(obj, hook, None)
        opts = getattr(fn, f"{hookspecs.PROJECT}_impl", None)
        if not isinstance(opts, dict) or opts.get("specname") not in (None, hook):
            continue  # not a hook implementation, or one of another hook (pluggy validates those)
        have, want = _required_params(fn), _required_params(getattr(hookspecs, hook))
        if have is None or want is None:
            continue
        extra = [p for p in have if p not in want]
        if extra:
            raise PluginError(f"op {name!r}: hook {hook}({', '.join(have)}) takes {extra}, which the hook "
                              f"{hook}({', '.join(want)}) does not pass; use those names (or a subset)")


def _unmarked(obj: object, hook: str) -> bool:
    """True when ``obj`` has a plain callable named ``hook`` that is not marked with ``@hookimpl``."""
    fn = getattr(obj, hook, None)
    return callable(fn) and not hasattr(fn, f"{hookspecs.PROJECT}_impl")


class OpPlugin:
    """One op's plugin manager: a hook call reaches this op's plugin only.

    Construction checks the plugin: each hook's argument names must be among the spec's
    (pluggy's validation), every required hook must be implemented, and ``describe()`` (when
    implemented) must return known keys of the right types. Any failure is a :class:`PluginError`.
    """

    def __init__(self, name: str, obj: object) -> None:
        if inspect.isclass(obj):
            raise PluginError(f"op {name!r}: the plugin object is the class {obj.__name__}; "
                              "register a module or an instance of it")
        self.name = name
        self.obj = obj
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        _check_arg_names(name, obj)
        try:
            self.pm.register(obj, name=name)
            self.pm.check_pending()
        except pluggy.PluginValidationError as e:  # e.g. a marked function that is no hook (a typo)
            raise PluginError(f"op {name!r}: {' '.join(str(e).split())}") from None
        missing = [h for h in hookspecs.REQUIRED_HOOKS if not self.implements(h)]
        if missing:
            unmarked = [h for h in missing if _unmarked(obj, h)]
            hint = f" ({', '.join(unmarked)} not marked with @flyreg.hookimpl)" if unmarked else ""
            raise PluginError(f"op {name!r} lacks required hook(s) {missing}{hint}")
        try:
            self.description = OpDescription.of(self.pm.hook.describe())
        except PluginError as e:
            raise PluginError(f"op {name!r}: {e}") from None

    def implements(self, hook: str) -> bool:
        """True when the plugin has a (non-wrapper) implementation of ``hook``."""
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        return any(not (i.hookwrapper or i.wrapper) for i in impls)

    def _required(self, hook: str, **kwargs: Any) -> Any:
        result = getattr(self.pm.hook, hook)(**kwargs)
        if result is None:
            raise PluginError(f"op {self.name!r}: hook {hook}() returned None")
        return result

    def specialize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, JSONScalar]:
        return self._required("specialize", args=args, kwargs=kwargs)

    def build(self, config: Config, spec: dict[str, JSONScalar]) -> Callable[..., Any]:
        return self._required("build", config=config, spec=spec)

    def configs(self, spec: dict[str, JSONScalar]) -> list[Config]:
        return list(self._required("configs", spec=spec))

    def default(self, spec: dict[str, JSONScalar]) -> Config:
        return self._required("default", spec=spec)

    def workloads(self, device: str) -> list[dict[str, JSONScalar]]:
        return list(self.pm.hook.workloads(device=device) or [])

    def make_inputs(self, spec: dict[str, JSONScalar], device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        result = self._required("make_inputs", spec=spec, device=device)
        try:
            args, kwargs = result
            return tuple(args), dict(kwargs)
        except (TypeError, ValueError):
            raise PluginError(f"op {self.name!r}: make_inputs() must return (args, kwargs), "
                              f"got {type(result).__name__}") from None

    def reference(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._required("reference", args=args, kwargs=kwargs)
