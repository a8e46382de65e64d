"""A typed facade over one op plugin's pluggy hooks."""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable
from typing import Any

import pluggy

from flyreg._core.config import Config, JSONScalar
from flyreg._core.device import Device
from flyreg._core.keys import parse_device
from flyreg._plugins import hookspecs
from flyreg._plugins.record import DESCRIBE_KEYS, OpRecord, RecordError, check_spec
from flyreg._plugins.work import Work

__all__ = ["DESCRIBE_KEYS", "HookError", "OpPlugin", "PluginError"]


class PluginError(Exception):
    """An op plugin that cannot be used: it failed to load, lacks a hook, or a hook misbehaved."""


class HookError(PluginError):
    """A hook raised something other than ValueError or TypeError; the message names the op and the hook
    (``rmsnorm.build raised KeyError: 'BLOCK'``) and the hook's exception is chained."""


def _renamed(e: ValueError | TypeError, message: str) -> Exception:
    """An exception of ``e``'s type (or, where that type cannot take one message, its base) saying ``message``."""
    try:
        new = type(e)(message)
    except Exception:
        new = None
    if new is None or str(new) != message:
        new = (ValueError if isinstance(e, ValueError) else TypeError)(message)
    return new


def _named_params(fn: Callable[..., Any]) -> list[str] | None:
    """The argument names of ``fn`` pluggy may pass (with a default or not: pluggy passes those the call has), or None
    if unknown."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _check_arg_names(name: str, obj: object) -> None:
    """Raise a one-line :class:`PluginError` for a hook taking an argument its spec lacks (``build(cfg, spec)``)."""
    for hook in (*hookspecs.REQUIRED_HOOKS, *hookspecs.OPTIONAL_HOOKS):
        fn = getattr(obj, hook, None)
        opts = getattr(fn, f"{hookspecs.PROJECT}_impl", None)
        if not isinstance(opts, dict) or opts.get("specname") not in (None, hook):
            continue  # not a hook implementation, or one of another hook (pluggy validates those)
        have, want = _named_params(fn), _named_params(getattr(hookspecs, hook))
        if have is None or want is None:
            continue
        extra = [p for p in have if p not in want]
        if extra:
            raise PluginError(f"op {name!r}: hook {hook}({', '.join(have)}) takes {extra}, which the hook "
                              f"{hook}({', '.join(want)}) does not pass; use those names (or a subset)")


def _did_you_mean(message: str) -> str:
    """`` (did you mean 'specialize'?)`` where pluggy's ``message`` names an unknown hook close to one of ours."""
    found = re.search(r"unknown hook '([^']+)'", message)
    close = difflib.get_close_matches(found.group(1), [*hookspecs.REQUIRED_HOOKS, *hookspecs.OPTIONAL_HOOKS],
                                      n=1) if found else []
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unmarked(obj: object, hook: str) -> bool:
    """True when ``obj`` has a plain callable named ``hook`` that is not marked with ``@hookimpl``."""
    fn = getattr(obj, hook, None)
    return callable(fn) and not hasattr(fn, f"{hookspecs.PROJECT}_impl")


class OpPlugin:
    """One op's plugin manager: a hook call reaches this op's plugin only.

    Construction checks the plugin: each hook's argument names must be among the spec's
    (pluggy's validation), every required hook must be implemented, and ``describe()`` (when
    implemented) must return a valid :class:`OpRecord` (or a legacy dict of its fields). Any
    failure is a :class:`PluginError`.

    A hook's ValueError or TypeError (bad input, such as tensors that disagree) reaches the
    caller as the same type, its message prefixed ``op.hook: ``; anything else it raises
    becomes a :class:`HookError`, ``op.hook raised Type: message``.
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
            raise PluginError(f"op {name!r}: {' '.join(str(e).split())}{_did_you_mean(str(e))}") from None
        missing = [h for h in hookspecs.REQUIRED_HOOKS if not self.implements(h)]
        if missing:
            unmarked = [h for h in missing if _unmarked(obj, h)]
            hint = f" ({', '.join(unmarked)} not marked with @flyreg.hookimpl)" if unmarked else ""
            raise PluginError(f"op {name!r} lacks required hook(s) {missing}{hint}")
        try:
            self.record = OpRecord.of(self.pm.hook.describe())
        except RecordError as e:  # raised making the record, in describe() or here from a legacy dict
            raise PluginError(f"op {name!r}: describe(): {e}") from None
        except Exception as e:
            raise HookError(f"{name}.describe raised {type(e).__name__}: {e}") from e

    @property
    def description(self) -> OpRecord:
        """The op's record (its former name)."""
        return self.record

    def check_spec(self, spec: dict[str, Any], device: Any = None, *, stored: bool = False) -> dict[str, JSONScalar]:
        """``spec`` checked against the op's axes and normalized, axes left out filled from ``device``
        (default: the CPU); with ``stored``, a spec as stored, which must be complete and normalized already.
        Raises one :class:`~flyreg._core.keys.SpecError`."""
        return check_spec(self.name, self.record, spec, None if stored else parse_device(device)[0])

    def implements(self, hook: str) -> bool:
        """True when the plugin has a (non-wrapper) implementation of ``hook``."""
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        return any(not (i.hookwrapper or i.wrapper) for i in impls)

    def _call(self, hook: str, **kwargs: Any) -> Any:
        try:
            return getattr(self.pm.hook, hook)(**kwargs)
        except (ValueError, TypeError) as e:
            raise _renamed(e, f"{self.name}.{hook}: {e}") from e
        except Exception as e:
            raise HookError(f"{self.name}.{hook} raised {type(e).__name__}: {e}") from e

    def _required(self, hook: str, **kwargs: Any) -> Any:
        result = self._call(hook, **kwargs)
        if result is None:
            raise PluginError(f"op {self.name!r}: hook {hook}() returned None")
        return result

    def specialize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, JSONScalar]:
        return self._required("specialize", args=args, kwargs=kwargs)

    def build(self, config: Config, spec: dict[str, JSONScalar]) -> Callable[..., Any]:
        return self._required("build", config=config, spec=spec)

    def configs(self, spec: dict[str, JSONScalar]) -> list[Config]:
        return list(self._required("configs", spec=spec))

    def default(self, spec: dict[str, JSONScalar], device: Device | None = None) -> Config:
        return self._required("default", spec=spec, device=device)

    def workloads(self, device: str) -> list[dict[str, JSONScalar]]:
        return list(self._call("workloads", device=device) or [])

    def make_inputs(self, spec: dict[str, JSONScalar], device: str,
                    seed: int = 0) -> tuple[tuple[Any, ...], dict[str, Any]]:
        result = self._required("make_inputs", spec=spec, device=device, seed=seed)
        try:
            args, kwargs = result
            return tuple(args), dict(kwargs)
        except (TypeError, ValueError):
            raise PluginError(f"op {self.name!r}: make_inputs() must return (args, kwargs), "
                              f"got {type(result).__name__}") from None

    def seeded_inputs(self) -> bool:
        """Whether the op's ``make_inputs`` takes a ``seed``: its draws differ, so a search times several."""
        return any("seed" in (*i.argnames, *i.kwargnames) for i in self.pm.hook.make_inputs.get_hookimpls())

    def reference(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._required("reference", args=args, kwargs=kwargs)

    def work(self, spec: dict[str, JSONScalar]) -> Work | None:
        """What one call of ``spec`` moves and computes; None when the op does not say."""
        result = self._call("work", spec=spec)
        if result is not None and not isinstance(result, Work):
            raise PluginError(f"op {self.name!r}: work() must return flyreg.plugin.Work (or None), "
                              f"got {type(result).__name__}")
        return result
