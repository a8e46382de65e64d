"""An op's config space: the candidates a search tries, its default, and which stored configs it takes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from flyreg._core.config import Config, JSONScalar
from flyreg._core.device import device_of, takes_device
from flyreg._core.keys import DeviceIdentity

Spec = dict[str, JSONScalar]
Configs = Sequence[Config] | Callable[[Spec], Sequence[Config]]
Default = Callable[..., Config]  # of the spec, and of the device where it takes a ``device`` argument
Prune = Callable[[list[Config], Spec], Sequence[Config]]


class ConfigSpace:
    """The configs ``op`` offers for a spec: ``configs`` (a list, or a callable of the spec), pruned by
    ``prune``, and ``default``, the heuristic config served with no search (None: no default), a function of the
    spec and, where it takes a ``device`` parameter, of the :class:`~flyreg._core.device.Device` it serves (None
    where no device is named: the check of a stored config).

    ``stored_check(spec)`` raises ValueError (a :class:`~flyreg._core.keys.SpecError`) for a spec the
    op never looks up (one that does not fit its declared axes): no stored config of it is taken.
    """

    def __init__(self, op: str, configs: Configs, default: Default | None = None, prune: Prune | None = None,
                 stored_check: Callable[[Spec], object] | None = None) -> None:
        if default is not None and not callable(default):
            raise TypeError(f"{op}: default must be a callable of the spec, got {type(default).__name__}")
        if not callable(configs) and not isinstance(configs, Sequence):
            raise TypeError(f"{op}: configs must be a list of Config or a callable of the spec")
        self.op = op
        self.configs = configs
        self.default_fn = default
        self.default_takes_device = default is not None and takes_device(default)
        self.prune = prune
        self.stored_check = stored_check

    def candidates(self, spec: Spec) -> list[Config]:
        """The configs a search of ``spec`` tries, pruned, each once, in order."""
        raw = self.configs(dict(spec)) if callable(self.configs) else self.configs
        cands = list(raw)
        if self.prune is not None:
            cands = list(self.prune(cands, dict(spec)))
        bad = [c for c in cands if not isinstance(c, Config)]
        if bad:
            raise TypeError(f"{self.op}: configs must be Config instances, got {type(bad[0]).__name__}")
        return list(dict.fromkeys(cands))

    def default(self, spec: Spec, ident: DeviceIdentity | None = None) -> Config | None:
        """The op's default config for ``spec`` on the device ``ident`` (None: no device named), or None when it has
        no default. A default of the device that differs from the one with none must be among the candidates, so a
        stored copy of it is a config the op takes (:meth:`accepts` knows no device): a TypeError otherwise."""
        if self.default_fn is None:
            return None
        if not self.default_takes_device:
            return self._checked(self.default_fn(spec))
        anywhere = self._checked(self.default_fn(spec, device=None))
        if ident is None:
            return anywhere
        config = self._checked(self.default_fn(spec, device=device_of(ident)))
        if config != anywhere and config not in self.candidates(spec):
            raise TypeError(f"{self.op}: default() gave {config} on {ident.name} for spec {spec}, which is not among "
                            f"its configs(spec): a stored copy would be refused; offer it in configs(spec)")
        return config

    def _checked(self, config: object) -> Config:
        if not isinstance(config, Config):
            raise TypeError(f"{self.op}: default() must return a Config, got {type(config).__name__}")
        return config

    def known(self, spec: Spec) -> list[Config]:
        """The configs this op offers for ``spec``: its candidates, then its default."""
        known = self.candidates(spec)
        default = self.default(spec)
        return [*known, default] if default is not None else known

    def accepts(self, config: Config, spec: Spec) -> str | None:
        """Why ``config`` (read from a file) is not one this op takes for ``spec``, or None.

        Raises what ``stored_check`` and the op's hooks raise for ``spec``.
        """
        if self.stored_check is not None:
            self.stored_check(spec)
        known = self.known(spec)
        if not known or config in known:
            return None
        names = [c.kwargs.keys() for c in known]
        if not any(set(config.kwargs) == set(k) for k in names):
            return f"its knobs {sorted(config.kwargs)} are not this op's {sorted(set().union(*names))}"
        return f"it is not among this op's {len(known)} configs for spec {spec}"

    def canonical(self, config: Config, spec: Spec) -> Config:
        """The op's own config equal to ``config`` (read from a file), which carries its ``pre_hook``."""
        return next((c for c in self.known(spec) if c == config), config)
