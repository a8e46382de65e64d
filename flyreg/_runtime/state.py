"""What the resolution chain and the search read of a tuner, and what it remembers in memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from flyreg._artifacts.lookup import OfflineStore
from flyreg._core.config import Config, JSONScalar
from flyreg._core.keys import DeviceIdentity
from flyreg._core.launch import Launcher
from flyreg._core.results import Resolution, TuneReport, TunerStats
from flyreg._core.search_terms import SearchSettings
from flyreg._core.spec import spec_key
from flyreg._runtime.builds import BuildCache
from flyreg._runtime.space import ConfigSpace

Spec = dict[str, JSONScalar]


class Memory:
    """What a tuner resolved in this process, by scratch-cache key and by (spec, device)."""

    def __init__(self) -> None:
        self.by_key: dict[str, Resolution] = {}
        self.by_spec: dict[tuple[str, DeviceIdentity], Resolution] = {}

    def get(self, pkey: str | None, spec: Spec, ident: DeviceIdentity) -> Resolution | None:
        """The resolution of the call of key ``pkey``; with no key, the last of ``spec`` on ``ident``."""
        return self.by_key.get(pkey) if pkey is not None else self.by_spec.get((spec_key(spec), ident))

    def record(self, pkey: str | None, spec: Spec, ident: DeviceIdentity, res: Resolution) -> None:
        if pkey is not None:
            self.by_key[pkey] = res
        self.by_spec[(spec_key(spec), ident)] = res


class TunerState(Protocol):
    """The public parts of an :class:`~flyreg._runtime.tuner.Autotuner` the chain and the search use."""

    name: str
    version: str
    key_env: tuple[str, ...]
    emit: bool
    structural: tuple[str, ...] | None
    build: Callable[[Config, Spec], Callable[..., Any]]
    spec_check: Callable[..., Spec] | None
    space: ConfigSpace
    settings: SearchSettings
    offline: OfflineStore
    memory: Memory
    build_cache: BuildCache
    stats: TunerStats
    reports: dict[str, TuneReport]
    seeded_inputs: bool

    def bind(self, config: Config, spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Launcher: ...
