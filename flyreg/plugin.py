"""A typed facade over one op plugin's pluggy hooks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pluggy

from . import hookspecs
from .config import Config, JSONScalar

_DESCRIBE_KEYS = {"description", "version", "structural", "restore_value", "reset_to_zero", "ordered_axes",
                  "config_dir", "key_env", "arg_names"}


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

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None) -> OpDescription:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise PluginError(f"describe() must return a mapping, got {type(raw).__name__}")
        unknown = set(raw) - _DESCRIBE_KEYS
        if unknown:
            raise PluginError(f"describe() returned unknown keys {sorted(unknown)}; known: {sorted(_DESCRIBE_KEYS)}")

        def names(key: str) -> tuple[str, ...] | None:
            value = raw.get(key)
            if value is None:
                return None
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise PluginError(f"describe()[{key!r}] must be a list of names, got {value!r}")
            return tuple(value)

        config_dir = raw.get("config_dir")
        return cls(
            description=str(raw.get("description", "")),
            version=str(raw.get("version", "0")),
            structural=names("structural"),
            restore_value=names("restore_value") or (),
            reset_to_zero=names("reset_to_zero") or (),
            ordered_axes=names("ordered_axes") or (),
            config_dir=Path(config_dir) if config_dir is not None else None,
            key_env=names("key_env") or (),
            arg_names=names("arg_names"),
        )


class OpPlugin:
    """One op's plugin manager: a hook call reaches this op's plugin only."""

    def __init__(self, name: str, obj: object) -> None:
        self.name = name
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        try:
            self.pm.register(obj, name=name)
            self.pm.check_pending()
        except pluggy.PluginValidationError as e:
            raise PluginError(str(e)) from None
        missing = [h for h in hookspecs.REQUIRED_HOOKS if not getattr(self.pm.hook, h).get_hookimpls()]
        if missing:
            raise PluginError(f"op {name!r} lacks required hook(s) {missing}")
        self.description = OpDescription.of(self.pm.hook.describe())

    def implements(self, hook: str) -> bool:
        return bool(getattr(self.pm.hook, hook).get_hookimpls())

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

    def workloads(self) -> list[dict[str, JSONScalar]]:
        return list(self.pm.hook.workloads() or [])

    def make_inputs(self, spec: dict[str, JSONScalar], device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        result = self._required("make_inputs", spec=spec, device=device)
        args, kwargs = result
        return tuple(args), dict(kwargs)

    def reference(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._required("reference", args=args, kwargs=kwargs)
