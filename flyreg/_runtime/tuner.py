"""The Autotuner: the hot path of one op, and the keys its calls resolve by.

Where a new key's config comes from is :mod:`flyreg._runtime.resolution`'s chain; the search is
:mod:`flyreg._search.engine`'s, run with the tuner's :class:`SearchSettings`.
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from flyreg._artifacts.lookup import OfflineStore
from flyreg._core.config import Config, JSONScalar
from flyreg._core.keys import cache_key, env_values, identity_of, tensor_axes
from flyreg._core.launch import Launcher, bind_launcher, named_args
from flyreg._core.results import CallKey, GraphCaptureError, Resolution, TuneError, TuneReport, TunerStats
from flyreg._core.search_terms import Call, OpDescription, SearchSettings, names_of
from flyreg._core.spec import normalize_spec
from flyreg._runtime import resolution, serving_record
from flyreg._runtime.builds import BUILD_CACHE, BuildCache, BuildFn
from flyreg._runtime.resolution import Request, autotune_forced, capturing
from flyreg._runtime.searching import search, time_config
from flyreg._runtime.space import ConfigSpace, Configs, Default, Prune
from flyreg._runtime.state import Memory

__all__ = ["Autotuner", "GraphCaptureError", "Resolution", "TuneError", "TuneReport", "autotune_forced", "capturing"]


#: Most call signatures a tuner keeps bound launchers for; a new one past it replaces the oldest
#: (which, called again, is bound again from its remembered resolution, without a search).
MAX_BOUND = 4096


class Autotuner:
    """Picks, remembers and serves the best config of one op.

    On a call: in-memory -> scratch disk cache -> offline artifact -> heuristic default ->
    full search. ``default(spec)`` may take a ``device`` argument: it is then given the
    :class:`~flyreg.plugin.Device` the call runs on (its product's name and datasheet peaks).
    ``FLYREG_AUTOTUNE=1`` skips everything but the search for each new key and re-writes its
    results. The steady-state call builds a key, looks it up and launches; while recording
    (``FLYREG_RECORD``, :func:`flyreg.record`) it also counts the call
    (:mod:`flyreg._runtime.serving_record`).
    A new key met while a CUDA graph is being captured gets cache -> offline -> default and a
    one-time warning, never a search (not even under ``FLYREG_AUTOTUNE=1``); where that is no config
    tuned for it, the key is kept pending for :func:`flyreg.tune_pending` to tune after capture.

    ``emit=True`` makes every new key either a hit on an artifact tuned for exactly its spec,
    on this device product, current for what its backend depends on (the one lookup serves
    first), or a search whose winner is written as that artifact. Nothing else counts as a hit:
    a scratch-cache entry, another product's artifact, a stale or a nearest-spec artifact and
    the default are all searched, so running a workload once with ``emit=True`` writes an
    artifact for every key it meets that has none. (A scratch-cache entry is searched again
    rather than copied into an artifact: simpler, and every artifact then records a timing taken
    for it in this run.) On a call, a failed artifact write warns once and the winner is still
    served from memory; :meth:`tune` raises it.

    ``search_options`` are those of :meth:`SearchSettings.of <flyreg._core.search_terms.SearchSettings.of>`:
    ``warmup``, ``rep``, ``tie_band``, ``timing``, ``restore_value``, ``reset_to_zero``,
    ``reference`` and ``compile_threads`` (and the deprecated ``cuda_graph``). ``restore_value``
    and ``reset_to_zero`` must name arguments the tuner can find: entries of ``arg_names`` (by
    default the positional parameters of ``specialize``) or keyword-only parameters of
    ``specialize``. Name lists are lists (or tuples), never one string.

    ``spec_check(spec, device)``, when given, checks and normalizes the spec of every call and of
    :meth:`resolve_spec` (axes left out filled from the device); ``spec_check(spec, stored=True)``
    vets the spec of a stored config (an artifact's, a cache entry's) before it may serve. It
    raises ValueError (a :class:`~flyreg._core.keys.SpecError`) for a bad spec.

    ``timing`` says how a search on a GPU times candidates (:data:`flyreg._core.search_terms.TIMINGS`):
    ``"steady"`` (the default) replays many calls in a CUDA graph over rotating copies of the
    call's inputs, as a kernel runs in a model; ``warmup`` and ``rep`` then count replays.
    A search on the CPU times single calls. A search ends with a final round wherever more than
    one config is close: the candidates closest to the fastest, and the default, are timed again
    over :data:`flyreg._search.engine.FINAL_SCALE` times the work, and only those times rank.
    """

    def __init__(
        self,
        name: str,
        build: BuildFn,
        specialize: Callable[..., dict[str, JSONScalar]],
        configs: Configs,
        default: Default | None = None,
        *,
        structural: Iterable[str] | None = None,
        arg_names: Sequence[str] | None = None,
        prune_configs_by: Prune | None = None,
        key_env: Iterable[str] = (),
        version: str = "0",
        config_dirs: Iterable[str | os.PathLike[str]] = (),
        ordered_axes: Iterable[str] = (),
        emit: bool = False,
        build_cache: BuildCache | None = None,
        spec_check: Callable[..., dict[str, JSONScalar]] | None = None,
        **search_options: Any,
    ) -> None:
        _check_hooks(name, build, specialize)
        cuda_graph = search_options.pop("cuda_graph", None)
        if cuda_graph is not None:
            warnings.warn(f"{name}: cuda_graph= is deprecated; use timing='graph' (or the default 'steady')",
                          DeprecationWarning, stacklevel=2)
            search_options["timing"] = "graph" if cuda_graph else "flushed"
        positional, keyword_only = _params(specialize)
        names = names_of(name, "arg_names", arg_names) if arg_names is not None else positional
        self._assemble(
            name, build, specialize, configs, default,
            SearchSettings.of(name, arg_names=names, keyword_only=keyword_only, **search_options),
            structural=names_of(name, "structural", structural) if structural is not None else None,
            key_env=names_of(name, "key_env", key_env), version=str(version),
            config_dirs=[os.fspath(d) for d in config_dirs], ordered_axes=names_of(name, "ordered_axes", ordered_axes),
            prune_configs_by=prune_configs_by, emit=emit, build_cache=build_cache, spec_check=spec_check)

    @classmethod
    def from_record(cls, name: str, record: OpDescription, build: BuildFn,
                    specialize: Callable[..., dict[str, JSONScalar]], configs: Configs, default: Default | None = None,
                    *, reference: Callable[..., Any] | None = None,
                    spec_check: Callable[..., dict[str, JSONScalar]] | None = None) -> Autotuner:
        """The tuner of op ``name`` as its description ``record`` (an :class:`~flyreg.plugin.OpRecord`) says,
        calling these hooks; its :attr:`settings` are :meth:`SearchSettings.from_record`'s of the same record,
        and :attr:`record` is ``record`` itself. The record's fields were checked when it was made: they are
        read, never checked again."""
        _check_hooks(name, build, specialize)
        tuner = cls.__new__(cls)
        tuner._assemble(
            name, build, specialize, configs, default, SearchSettings.from_record(name, record, reference=reference),
            structural=record.structural, key_env=record.key_env, version=record.version,
            config_dirs=[os.fspath(record.config_dir)] if record.config_dir else [],
            ordered_axes=record.ordered_axes, spec_check=spec_check, record=record)
        return tuner

    def _assemble(self, name: str, build: BuildFn, specialize: Callable[..., dict[str, JSONScalar]],
                  configs: Configs, default: Default | None, settings: SearchSettings, *,
                  structural: tuple[str, ...] | None, key_env: tuple[str, ...], version: str,
                  config_dirs: list[str], ordered_axes: tuple[str, ...], prune_configs_by: Prune | None = None,
                  emit: bool = False, build_cache: BuildCache | None = None,
                  spec_check: Callable[..., dict[str, JSONScalar]] | None = None,
                  record: OpDescription | None = None) -> None:
        """Set the tuner up from checked fields (``__init__``'s arguments, or an op record's)."""
        self.name = name
        self.build = build
        self.specialize = specialize
        self.spec_check = spec_check
        stored_check = functools.partial(spec_check, stored=True) if spec_check is not None else None
        self.space = ConfigSpace(name, configs, default, prune_configs_by, stored_check)
        #: The op record this tuner was made from (:meth:`from_record`); None for a tuner made by hand.
        self.record = record
        self.settings = settings
        self.structural = structural
        self.key_env = key_env
        self.version = version
        self.emit = emit
        self.offline = OfflineStore(name, config_dirs, ordered_axes, version)
        self.build_cache = build_cache if build_cache is not None else BUILD_CACHE
        self.stats = TunerStats()
        self.reports: dict[str, TuneReport] = {}
        self.memory = Memory()
        self._bound: dict[Any, Launcher] = {}
        self._counted: dict[Any, Any] = {}  # while recording: the counters that replace _bound (serving_record.py)
        #: ``make_inputs(spec, device, seed=0) -> (args, kwargs)``: a call's inputs for a spec, where the op has
        #: the hook (a plugin's); :func:`flyreg.tune_pending` tunes a key missed during capture on them.
        self.make_inputs: Callable[..., tuple[tuple[Any, ...], dict[str, Any]]] | None = None
        #: Whether ``make_inputs`` draws each seed apart: a search then times its candidates over several draws.
        self.seeded_inputs = False
        serving_record.track(self)

    @property
    def arg_names(self) -> tuple[str, ...]:
        """The names of the call's positional arguments (see :attr:`settings`)."""
        return self.settings.arg_names

    @property
    def timing(self) -> str:
        """How a search on a GPU times candidates (see :attr:`settings`)."""
        return self.settings.timing

    @property
    def restore_value(self) -> tuple[str, ...]:
        return self.settings.restore_value

    @property
    def reset_to_zero(self) -> tuple[str, ...]:
        return self.settings.reset_to_zero

    def bound_count(self) -> int:
        """How many call signatures have a bound launcher (at most :data:`MAX_BOUND`)."""
        return len(self._bound)

    def is_bound(self, *args: Any, **kwargs: Any) -> bool:
        """True when a call with these arguments' signature launches with no lookup at all."""
        try:
            return self._fast_key(args, kwargs) in self._bound
        except TypeError:  # unhashable: never remembered
            return False

    # -- the hot path -------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = self._fast_key(args, kwargs)
        try:
            launcher = self._bound.get(key)
        except TypeError:  # an argument that is unhashable even structurally (a dict): resolve, never remember
            return self._launcher(args, kwargs).call(args, kwargs)
        if launcher is None:
            launcher = self._launcher(args, kwargs)
            if len(self._bound) >= MAX_BOUND:  # calls with ever-new scalars (an eps per call): drop the oldest
                del self._bound[next(iter(self._bound))]
            self._bound[key] = launcher
        return launcher.call(args, kwargs)

    def _fast_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The in-memory key of a call: a tensor by (dtype, shape, stride, device), a list or tuple by
        its items (recursively), any other value with its type (``1``, ``1.0`` and ``True`` differ).

        Keywords are taken in the order given, unsorted: another order is another entry, bound
        once to the same resolution (the persistent key sorts them).
        """
        tensor = torch.Tensor
        key = [(a.dtype, a.shape, a.stride(), a.device, a.requires_grad) if isinstance(a, tensor)
               else _structural_key(a) if isinstance(a, _SEQUENCES) else (a.__class__, a) for a in args]
        if kwargs:
            for k, v in kwargs.items():
                key.append((k, v.dtype, v.shape, v.stride(), v.device, v.requires_grad) if isinstance(v, tensor)
                           else (k, _structural_key(v)) if isinstance(v, _SEQUENCES) else (k, v.__class__, v))
        if self.key_env:
            key.append(env_values(self.key_env))
        return tuple(key)

    def _launcher(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Launcher:
        """Resolve a call whose key is not in memory and bind its config to this call's signature."""
        launcher, ck, res = self._serve(args, kwargs)
        serving_record.first_call(self, ck, res)  # FLYREG_RECORD set since this tuner was made: recording starts
        return launcher

    def _serve(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Launcher, CallKey, Resolution]:
        """The launcher of a call (see :meth:`_launcher`), with its call key and resolution.

        A signature with tensors that require grad gets a launcher that refuses them while grad
        mode is on (flyreg ops have no backward); only such signatures pay for that check.
        """
        grads = [n for n, v in named_args(args, kwargs, self.arg_names).items()
                 if isinstance(v, torch.Tensor) and v.requires_grad]
        if grads:
            _refuse_grad(self.name, grads)
        ck = self._call_key(args, kwargs)
        res = self._resolve_call(args, kwargs, ck)
        launcher = self.bind(res.config, res.spec, args, kwargs)
        if not grads:
            return launcher, ck, res
        call, name = launcher.call, self.name

        def call_without_grad(a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
            _refuse_grad(name, grads)
            return call(a, kw)

        return Launcher(launcher.config, call_without_grad, launcher.raw, launcher.pre), ck, res

    # -- resolution -----------------------------------------------------------------------
    def resolve(self, *args: Any, **kwargs: Any) -> Resolution:
        """The config a call with these arguments gets, and its source, without launching it."""
        return self._resolve_call(args, kwargs)

    def resolve_spec(self, spec: dict[str, Any], device: Any = None) -> Resolution:
        """The config a call of ``spec`` on ``device`` (default: the CPU) gets, with no tensors and no search.

        Raises LookupError when only a search could give one.
        """
        return resolution.resolve_spec(self, spec, device)

    def _call_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallKey:
        spec = normalize_spec(self.specialize(*args, **kwargs), f"{self.name}: specialize() result")
        named = named_args(args, kwargs, self.arg_names)
        device = _device_of(named.values())
        if self.spec_check is not None:
            spec = self.spec_check(spec, device)
        ident = identity_of(device)
        pkey = cache_key(self.name, spec, tensor_axes(named.items()), ident, self.version, env_values(self.key_env))
        return CallKey(spec, named, device, ident, pkey)

    def _resolve_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], ck: CallKey | None = None) -> Resolution:
        ck, call = call_of(self, args, kwargs, ck)
        return resolution.resolve_call(self, Request(ck.spec, ck.ident, ck.pkey, call))

    # -- binding and searching --------------------------------------------------------------
    def bind(self, config: Config, spec: dict[str, JSONScalar], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Launcher:
        """The launcher of ``config`` for ``spec``, bound to the signature of this call."""
        launch = self.build_cache.get(self.name, config, spec, self.structural, self.build)
        return bind_launcher(self.name, launch, config, args, kwargs, self.arg_names, self.settings.reset_to_zero)

    def tune(self, *args: Any, emit: bool = True, out_dir: str | os.PathLike[str] | None = None,
             search_options: Mapping[str, Any] | None = None, **kwargs: Any) -> TuneReport:
        """Search the configs of this call now (whatever is cached), store the winner and return the report.

        ``search_options`` change this search's run (:data:`flyreg._core.search_terms.RUN_FIELDS`:
        ``strategy``, ``effort``, ``budget_s``, ``seed``, ``resume``, ``retry_failed``); ``flyreg tune``
        passes its flags, ``resume=True`` and, with ``--force``, ``retry_failed=True``. A failed
        artifact write raises OSError after the winner is stored in memory and in the scratch cache.
        """
        ck, call = call_of(self, args, kwargs)
        if resolution.capturing(ck.device):
            raise GraphCaptureError(f"{self.name}: tune() called while a CUDA graph is being captured; "
                                    f"tune before capture (a search benchmarks and synchronizes)")
        settings = self.settings.with_run(**search_options) if search_options else None
        res, error = search(self, ck.spec, ck.ident, ck.pkey, call, emit=emit, out_dir=out_dir, settings=settings)
        self.memory.record(ck.pkey, ck.spec, ck.ident, res)
        self._bound.clear()
        self._counted.clear()
        if error is not None:
            raise OSError(f"{self.name}: {error}") from error.__cause__
        return self.reports[ck.pkey]

    def time_config(self, config: Config, *args: Any, **kwargs: Any) -> float:
        """Check ``config`` against the reference on this call and time it (ms), as a search does; stores
        nothing. Raises :class:`TuneError` when the config fails or computes a wrong result."""
        ck, call = call_of(self, args, kwargs)
        return time_config(self, config, ck.spec, call)


_SEQUENCES = (list, tuple)


def call_of(tuner: Autotuner, args: tuple[Any, ...], kwargs: dict[str, Any],
            ck: CallKey | None = None) -> tuple[CallKey, Call]:
    """A call's key (its spec, device identity and scratch-cache key; ``ck`` if already built) and the
    call a search runs on, with the op's other draws of its spec where ``make_inputs`` takes a seed."""
    ck = ck if ck is not None else tuner._call_key(args, kwargs)
    make = tuner.make_inputs if tuner.seeded_inputs else None
    draws = None if make is None else functools.partial(make, dict(ck.spec), str(ck.device))  # draws(seed)
    return ck, Call(args, kwargs, ck.named, ck.device, draws)


def _refuse_grad(op: str, names: list[str]) -> None:
    """Raise while grad mode is on: the call's ``names`` tensors require grad and the op has no backward."""
    if torch.is_grad_enabled():
        which = ", ".join(repr(n) for n in names)
        raise RuntimeError(f"{op}: argument {which} requires grad, but {op} has no backward (its result would "
                           f"silently drop out of autograd); call it under torch.no_grad(), or pass a detached tensor")


def _structural_key(value: Any) -> Any:
    """``value`` for the in-memory key: tensors by layout, lists and tuples item by item, others typed."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.shape, value.stride(), value.device)
    if isinstance(value, _SEQUENCES):
        return (value.__class__, tuple(_structural_key(v) for v in value))
    return (value.__class__, value)


def _check_hooks(name: object, build: object, specialize: object) -> None:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty op name, got {name!r}")
    for what, fn in (("build", build), ("specialize", specialize)):
        if not callable(fn):
            raise TypeError(f"{name}: {what} must be callable, got {type(fn).__name__}")


def _params(fn: Callable[..., Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(positional parameter names, keyword-only parameter names) of ``fn``; empty when unknown."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return (), ()
    return (tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)),
            tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY))


def _device_of(values: Iterable[Any]) -> Any:
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device
    return None
