"""The build cache: one launch callable per (op, build function, structural knobs, spec), shared by tuners."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from flyreg._core.config import Config, JSONScalar, typed

BuildFn = Callable[[Config, dict[str, JSONScalar]], Callable[..., Any]]


class BuildCache:
    """Launch callables keyed on (op, build function, structural knobs, spec) only.

    Configs that differ only in compiler hints share one build; the hints reach the
    backend at launch, where it keeps one binary per hint value. The build function is
    part of the key, so two ops that happen to share a name never share launches.
    """

    def __init__(self) -> None:
        self._built: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self.builds = 0

    def get(self, op: str, config: Config, spec: dict[str, JSONScalar], structural: tuple[str, ...] | None,
            build: BuildFn) -> Callable[..., Any]:
        key = (op, build, typed(config.structural(structural)), typed(tuple(sorted(spec.items()))))
        launch = self._built.get(key)
        if launch is None:
            launch = build(config, dict(spec))
            if not callable(launch):
                raise TypeError(f"{op}: build() must return a launch callable, got {type(launch).__name__}")
            with self._lock:
                self.builds += 1
                launch = self._built.setdefault(key, launch)
        return launch

    def clear(self, op: str | None = None) -> None:
        with self._lock:
            for key in [k for k in self._built if op is None or k[0] == op]:
                del self._built[key]


#: The one build cache every tuner shares unless given its own.
BUILD_CACHE = BuildCache()
