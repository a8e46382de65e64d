"""The tunable configuration of a kernel: its knobs and its compiler hints."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Union

import attrs

JSONScalar = Union[str, int, float, bool, None]

#: Names the constructor takes for itself, so no hint can be called so.
_RESERVED_HINTS = frozenset({"kwargs", "pre_hook"})

Items = tuple[tuple[str, JSONScalar], ...]


def typed(items: Items) -> tuple[tuple[str, str, JSONScalar], ...]:
    """``items`` with each value's type: ``1``, ``1.0`` and ``True`` read back from JSON as different values."""
    return tuple((k, type(v).__name__, v) for k, v in items)


def check_scalar(value: object, what: str) -> JSONScalar:
    """Return ``value`` if it is a JSON scalar (finite when a float), else raise TypeError naming ``what``."""
    if value is None or isinstance(value, (str, bool, int)):
        return value  # type: ignore[return-value]
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{what} must be a finite number, got {value!r}")
        return value
    raise TypeError(f"{what} must be a JSON scalar (str, int, float, bool or None), got {type(value).__name__} {value!r}")


def _freeze(mapping: Mapping[str, Any] | None, what: str) -> Items:
    if mapping is None:
        return ()
    if not isinstance(mapping, Mapping):
        raise TypeError(f"{what} must be a mapping of name -> JSON scalar, got {type(mapping).__name__}")
    items = []
    for name, value in mapping.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"{what} names must be non-empty strings, got {name!r}")
        items.append((name, check_scalar(value, f"{what}[{name!r}]")))
    return tuple(sorted(items))


@attrs.frozen(init=False, repr=False)
class Config:
    """One point of a kernel's tuning space.

    ``Config({"BLOCK_N": 1024}, num_warps=8)`` holds the kernel's knobs (read them as
    ``.kwargs``) and its compiler hints (``num_warps``, ``num_stages``, ``maxnreg`` and any
    backend-specific hint such as ``waves_per_eu``; read them as ``.hints``).

    ``pre_hook`` is an optional callable run before each launch with this config (outside
    the timed region during a search), given the call's arguments by name. It is never
    persisted: it is left out of JSON, of equality and of hashing; a config read back from a
    cache or an artifact gets it again from the equal candidate config of its op.

    Values compare with their JSON type: ``Config({"A": 1})``, ``Config({"A": 1.0})`` and
    ``Config({"A": True})`` are three different configs, as their JSON texts are.
    """

    knobs: Items = attrs.field(eq=typed)
    hint_items: Items = attrs.field(eq=typed)
    pre_hook: Callable[..., Any] | None = attrs.field(default=None, eq=False)

    def __init__(
        self,
        kwargs: Mapping[str, Any] | None = None,
        *,
        num_warps: int | None = None,
        num_stages: int | None = None,
        maxnreg: int | None = None,
        pre_hook: Callable[..., Any] | None = None,
        **backend_hints: Any,
    ) -> None:
        hints = {"num_warps": num_warps, "num_stages": num_stages, "maxnreg": maxnreg, **backend_hints}
        self._setup(kwargs, hints, pre_hook)

    def _setup(self, kwargs: Mapping[str, Any] | None, hints: Mapping[str, Any],
               pre_hook: Callable[..., Any] | None) -> None:
        knobs = _freeze(kwargs, "Config kwargs")
        hint_items = _freeze({k: v for k, v in hints.items() if v is not None}, "Config hints")
        clash = set(dict(knobs)) & set(dict(hint_items))
        if clash:
            raise ValueError(f"Config: {sorted(clash)} given both as a knob and as a compiler hint")
        reserved = _RESERVED_HINTS & set(dict(hint_items))
        if reserved:
            raise ValueError(f"Config: {sorted(reserved)} cannot be compiler hint names")
        if pre_hook is not None and not callable(pre_hook):
            raise TypeError(f"Config pre_hook must be callable, got {type(pre_hook).__name__}")
        self.__attrs_init__(knobs, hint_items, pre_hook)

    @property
    def kwargs(self) -> dict[str, JSONScalar]:
        """The kernel's knobs, name -> value (a fresh dict)."""
        return dict(self.knobs)

    @property
    def hints(self) -> dict[str, JSONScalar]:
        """The compiler hints that are set, name -> value (a fresh dict)."""
        return dict(self.hint_items)

    def all_kwargs(self) -> dict[str, JSONScalar]:
        """Knobs and hints together, as Triton's ``Config.all_kwargs`` returns them."""
        return {**dict(self.knobs), **dict(self.hint_items)}

    def structural(self, names: tuple[str, ...] | None) -> Items:
        """The knobs that change the built code; ``None`` means every knob."""
        if names is None:
            return self.knobs
        return tuple(item for item in self.knobs if item[0] in names)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"kwargs": {...}, "hints": {...}}`` (``pre_hook`` is dropped)."""
        return {"kwargs": dict(self.knobs), "hints": dict(self.hint_items)}

    @classmethod
    def from_json(cls, data: object) -> Config:
        """Inverse of :meth:`to_json`; raises ValueError/TypeError on anything malformed."""
        if not isinstance(data, Mapping):
            raise TypeError(f"config must be a JSON object, got {type(data).__name__}")
        unknown = set(data) - {"kwargs", "hints"}
        if unknown:
            raise ValueError(f"config has unknown fields {sorted(unknown)}")
        kwargs = data.get("kwargs", {})
        hints = data.get("hints", {})
        if not isinstance(kwargs, Mapping) or not isinstance(hints, Mapping):
            raise TypeError("config 'kwargs' and 'hints' must be JSON objects")
        config = cls.__new__(cls)
        config._setup(kwargs, hints, None)
        return config

    def __repr__(self) -> str:
        parts = [f"{k}={v!r}" for k, v in (*self.knobs, *self.hint_items)]
        return f"Config({', '.join(parts)})"
