"""The Autotuner: resolves a config per call key and launches it."""

from __future__ import annotations

import datetime
import functools
import inspect
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import torch

from flyreg._artifacts import cache
from flyreg._core import settings
from flyreg._core.fileio import warn_once
from flyreg._search.bench import TIMINGS, check_counts
from flyreg._runtime.builder import BUILD_CACHE, BuildCache, BuildFn
from flyreg._core.config import Config, JSONScalar
from flyreg._core.keys import DeviceIdentity, cache_key, env_values, fingerprint, identity_of, normalize_spec, tensor_axes
from flyreg._runtime.launch import Launcher, bind_launcher, named_args
from flyreg._artifacts.store import (ArtifactError, OfflineStore, artifact_filename, canonical_spec, emit_artifact, emit_dir, index,
                      load_artifact, spec_text)
from flyreg._core.results import CallKey, GraphCaptureError, Resolution, TuneError, TuneReport, TunerStats

__all__ = ["Autotuner", "GraphCaptureError", "Resolution", "TuneError", "TuneReport", "autotune_forced", "capturing"]


#: Most call signatures a tuner keeps bound launchers for; a new one past it replaces the oldest
#: (which, called again, is bound again from its remembered resolution, without a search).
MAX_BOUND = 4096


def autotune_forced() -> bool:
    """True when ``FLYREG_AUTOTUNE`` asks for a fresh search of every new key."""
    return settings.current().autotune


class Autotuner:
    """Picks, remembers and serves the best config of one op.

    On a call: in-memory -> scratch disk cache -> offline artifact -> heuristic default ->
    full search. ``FLYREG_AUTOTUNE=1`` skips everything but the search for each new key and
    re-writes its results. The steady-state call builds a key, looks it up and launches.
    A new key met while a CUDA graph is being captured gets cache -> offline -> default and a
    one-time warning, never a search (not even under ``FLYREG_AUTOTUNE=1``).

    ``emit=True`` makes every new key either a hit on an artifact tuned for exactly its spec,
    on this device product, with the current toolchain and op version (the one lookup serves
    first), or a search whose winner is written as that artifact. Nothing else counts as a hit:
    a scratch-cache entry, another product's artifact, a stale or a nearest-spec artifact and
    the default are all searched, so running a workload once with ``emit=True`` writes an
    artifact for every key it meets that has none. (A scratch-cache entry is searched again
    rather than copied into an artifact: simpler, and every artifact then records a timing taken
    for it in this run.) On a call, a failed artifact write warns once and the winner is still
    served from memory; :meth:`tune` raises it.

    ``restore_value`` and ``reset_to_zero`` must name arguments the tuner can find: entries of
    ``arg_names`` (by default the positional parameters of ``specialize``) or keyword-only
    parameters of ``specialize``. Name lists are lists (or tuples), never one string.

    ``timing`` says how a search on a GPU times candidates (:data:`flyreg._search.bench.TIMINGS`):
    ``"steady"`` (the default) replays many calls in a CUDA graph over rotating copies of the
    call's inputs, as a kernel runs in a model; ``warmup`` and ``rep`` then count replays.
    A search on the CPU times single calls. A search ends with a final round wherever more than
    one config is close: the candidates closest to the fastest, and the default, are timed again
    over :data:`flyreg._search.engine.FINAL_SCALE` times the work, and only those times rank.

    ``spec_check(spec, device)``, when given, checks and normalizes the spec of every call and of
    :meth:`resolve_spec` (axes left out filled from the device); ``spec_check(spec, stored=True)``
    vets the spec of an artifact borrowed for a nearest spec. It raises ValueError for a bad spec.
    """

    def __init__(
        self,
        name: str,
        build: BuildFn,
        specialize: Callable[..., dict[str, JSONScalar]],
        configs: Sequence[Config] | Callable[[dict[str, JSONScalar]], Sequence[Config]],
        default: Callable[[dict[str, JSONScalar]], Config] | None = None,
        *,
        structural: Iterable[str] | None = None,
        arg_names: Sequence[str] | None = None,
        restore_value: Iterable[str] = (),
        reset_to_zero: Iterable[str] = (),
        prune_configs_by: Callable[[list[Config], dict[str, JSONScalar]], Sequence[Config]] | None = None,
        reference: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None = None,
        key_env: Iterable[str] = (),
        version: str = "0",
        warmup: int = 5,
        rep: int = 20,
        tie_band: float = 0.005,
        timing: str = "steady",
        cuda_graph: bool | None = None,
        config_dirs: Iterable[str | os.PathLike[str]] = (),
        ordered_axes: Iterable[str] = (),
        emit: bool = False,
        build_cache: BuildCache | None = None,
        spec_check: Callable[..., dict[str, JSONScalar]] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"name must be a non-empty op name, got {name!r}")
        for what, fn in (("build", build), ("specialize", specialize)):
            if not callable(fn):
                raise TypeError(f"{name}: {what} must be callable, got {type(fn).__name__}")
        if default is not None and not callable(default):
            raise TypeError(f"{name}: default must be a callable of the spec, got {type(default).__name__}")
        if not callable(configs) and not isinstance(configs, Sequence):
            raise TypeError(f"{name}: configs must be a list of Config or a callable of the spec")
        if cuda_graph is not None:
            warnings.warn(f"{name}: cuda_graph= is deprecated; use timing='graph' (or the default 'steady')",
                          DeprecationWarning, stacklevel=2)
            timing = "graph" if cuda_graph else "flushed"
        if timing not in TIMINGS:
            raise ValueError(f"{name}: timing must be one of {list(TIMINGS)}, got {timing!r}")
        if not 0 <= tie_band < 1:
            raise ValueError(f"{name}: tie_band must be in [0, 1), got {tie_band!r}")
        try:
            check_counts(warmup, rep)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        self.name = name
        self._build = build
        self._specialize = specialize
        self._configs = configs
        self._default = default
        self.structural = _names(name, "structural", structural) if structural is not None else None
        self.arg_names = _names(name, "arg_names", arg_names) if arg_names is not None else _params(specialize)[0]
        self.restore_value = _names(name, "restore_value", restore_value)
        self.reset_to_zero = _names(name, "reset_to_zero", reset_to_zero)
        _check_in_place_names(name, self.restore_value, self.reset_to_zero, self.arg_names, _params(specialize)[1])
        self._prune = prune_configs_by
        self._reference = reference
        self.key_env = _names(name, "key_env", key_env)
        self.version = str(version)
        self.warmup, self.rep, self.tie_band, self.timing = warmup, rep, tie_band, timing
        self.emit = emit
        ordered = _names(name, "ordered_axes", ordered_axes)
        self._spec_check = spec_check
        stored_check = functools.partial(spec_check, stored=True) if spec_check is not None else None
        self.offline = OfflineStore(name, [os.fspath(d) for d in config_dirs], ordered, self.version, stored_check)
        self.build_cache = build_cache if build_cache is not None else BUILD_CACHE
        self.stats = TunerStats()
        self.reports: dict[str, TuneReport] = {}
        self._bound: dict[Any, Launcher] = {}
        self._resolved: dict[str, Resolution] = {}
        self._by_spec: dict[tuple[str, DeviceIdentity], Resolution] = {}

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
        key = [(a.dtype, a.shape, a.stride(), a.device) if isinstance(a, tensor)
               else _structural_key(a) if isinstance(a, _SEQUENCES) else (a.__class__, a) for a in args]
        if kwargs:
            for k, v in kwargs.items():
                key.append((k, v.dtype, v.shape, v.stride(), v.device) if isinstance(v, tensor)
                           else (k, _structural_key(v)) if isinstance(v, _SEQUENCES) else (k, v.__class__, v))
        if self.key_env:
            key.append(env_values(self.key_env))
        return tuple(key)

    def _launcher(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Launcher:
        """Resolve a call whose key is not in memory and bind its config to this call's signature."""
        res, spec = self._resolve_call(args, kwargs)
        return self._bind(res.config, spec, args, kwargs)

    # -- resolution -----------------------------------------------------------------------
    def resolve(self, *args: Any, **kwargs: Any) -> Resolution:
        """The config a call with these arguments gets, and its source, without launching it."""
        return self._resolve_call(args, kwargs)[0]

    def resolve_spec(self, spec: dict[str, Any], device: Any = None) -> Resolution:
        """The config a call of ``spec`` on ``device`` (default: the CPU) gets, with no tensors and no search.

        Raises LookupError when only a search could give one.
        """
        spec = normalize_spec(spec)
        ident = identity_of(device)
        if self._spec_check is not None:
            spec = self._spec_check(spec, device)
        hit = self._memory_by_spec(spec, ident) or self._from_disk_by_spec(spec, ident)
        hit = hit or self._from_offline(spec, ident) or self._from_default(spec)
        if hit is None:
            raise LookupError(f"{self.name}: no cached, offline or default config for spec {spec}; tune it first")
        return hit

    def _call_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallKey:
        spec = normalize_spec(self._specialize(*args, **kwargs), f"{self.name}: specialize() result")
        named = named_args(args, kwargs, self.arg_names)
        device = _device_of(named.values())
        if self._spec_check is not None:
            spec = self._spec_check(spec, device)
        ident = identity_of(device)
        pkey = cache_key(self.name, spec, tensor_axes(named.items()), ident, self.version, env_values(self.key_env))
        return CallKey(spec, named, device, ident, pkey)

    def _record(self, ck: CallKey, res: Resolution) -> None:
        self._resolved[ck.pkey] = res
        self._by_spec[(_spec_key(ck.spec), ck.ident)] = res

    def _resolve_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Resolution, dict[str, JSONScalar]]:
        ck = self._call_key(args, kwargs)
        spec = ck.spec
        res = self._resolved.get(ck.pkey)
        if res is not None:
            return attrs.evolve(res, source="memory"), spec
        forced = autotune_forced()
        if capturing(ck.device):  # a search would benchmark and synchronize inside the capture
            res = self._resolve_in_capture(spec, ck.pkey, ck.ident, forced)
        elif forced:
            res = None
        elif self.emit:  # only this key's own current artifact is a hit; anything else is searched and written
            res = self._exact_artifact(spec, ck.ident)
        else:
            res = self._from_disk(ck.pkey, spec) or self._from_offline(spec, ck.ident) or self._from_default(spec)
        if res is None:
            res, error = self._search(ck, args, kwargs, emit=forced or self.emit)
            if error is not None:
                warn_once(f"flyreg: {self.name}: {error}; the winner is served from memory only",
                          key=f"emit-failed:{self.name}")
        self._record(ck, res)
        return res, spec

    def _resolve_in_capture(self, spec: dict[str, JSONScalar], pkey: str, ident: DeviceIdentity,
                            forced: bool) -> Resolution:
        """A new key's config while a CUDA graph is being captured: cache, offline or default, never a search.

        Warns once per op and spec; raises :class:`GraphCaptureError` when only a search could resolve it.
        """
        res = self._from_disk(pkey, spec) or self._from_offline(spec, ident) or self._from_default(spec)
        if res is None:
            raise GraphCaptureError(
                f"{self.name}: spec {spec} was first called while a CUDA graph was being captured, and it has no "
                f"cached, offline or default config; flyreg never searches during capture (a search benchmarks "
                f"and synchronizes). Call the op once with these shapes before capture, or ship an offline "
                f"artifact for it (flyreg tune)")
        skipped = " (FLYREG_AUTOTUNE=1 ignored)" if forced else " (emission skipped)" if self.emit else ""
        warn_once(f"flyreg: {self.name}: spec {spec} was first called while a CUDA graph was being captured; "
                  f"serving the {res.source} config {res.config} with no search{skipped}. Call the op once with "
                  f"these shapes before capture", key=f"capture:{self.name}:{_spec_key(spec)}")
        return res

    def _memory_by_spec(self, spec: dict[str, JSONScalar], ident: DeviceIdentity) -> Resolution | None:
        res = self._by_spec.get((_spec_key(spec), ident))
        return attrs.evolve(res, source="memory") if res is not None else None

    def _known(self, spec: dict[str, JSONScalar]) -> list[Config]:
        """The configs this op offers for ``spec``: its candidates, then its default."""
        known = self._candidates(spec)
        default = self._from_default(spec)
        return [*known, default.config] if default is not None else known

    def _accepts(self, config: Config, spec: dict[str, JSONScalar]) -> str | None:
        """Why ``config`` (read from a file) is not one this op takes for ``spec``, or None."""
        known = self._known(spec)
        if not known or config in known:
            return None
        names = [c.kwargs.keys() for c in known]
        if not any(set(config.kwargs) == set(k) for k in names):
            return f"its knobs {sorted(config.kwargs)} are not this op's {sorted(set().union(*names))}"
        return f"it is not among this op's {len(known)} configs for spec {spec}"

    def _canonical(self, config: Config, spec: dict[str, JSONScalar]) -> Config:
        """The op's own config equal to ``config`` (read from a file), which carries its ``pre_hook``."""
        return next((c for c in self._known(spec) if c == config), config)

    def _from_disk(self, pkey: str, spec: dict[str, JSONScalar]) -> Resolution | None:
        entry = cache.get(self.name, pkey)
        return self._disk_resolution(entry, spec) if entry is not None else None

    def _from_disk_by_spec(self, spec: dict[str, JSONScalar], ident: DeviceIdentity) -> Resolution | None:
        want_fp = fingerprint(self.version)
        env = dict(env_values(self.key_env))
        for entry in cache.load(self.name).values():
            if (entry.get("spec") == spec and entry.get("device") == ident.to_json()
                    and entry.get("toolchain") == want_fp and entry.get("env", {}) == env):
                res = self._disk_resolution(entry, spec)
                if res is not None:
                    return res
        return None

    def _disk_resolution(self, entry: dict[str, Any], spec: dict[str, JSONScalar]) -> Resolution | None:
        path = cache.database()
        try:
            config = Config.from_json(entry.get("config"))
        except (TypeError, ValueError) as e:
            warn_once(f"flyreg: {self.name}: ignoring a bad entry in {path}: {e}")
            return None
        why = self._accepts(config, spec)
        if why:
            warn_once(f"flyreg: {self.name}: ignoring cached config {config} in {path}: {why}")
            return None
        return Resolution(self._canonical(config, spec), "cache", spec, "cache", path=str(path))

    def _exact_artifact(self, spec: dict[str, JSONScalar], ident: DeviceIdentity) -> Resolution | None:
        """The artifact lookup serves first for ``spec`` on this product, when it is current; else None.

        Emission's notion of a hit. Files lookup would skip (malformed, mismatched, a config the
        op does not take) are skipped here too, silently: the search that follows replaces them.
        """
        canon = canonical_spec(spec)
        fname = artifact_filename(self.name, canon, ident.name)
        for d in self.offline.dirs():
            if fname not in index(d):
                continue
            try:
                art = load_artifact(d / fname)
            except ArtifactError:
                continue
            if (art.op != self.name or art.filename != fname or spec_text(art.spec) != spec_text(canon)
                    or art.device != ident or self._accepts(art.config, spec)):
                continue
            if art.stale(self.version):
                return None
            return Resolution(self._canonical(art.config, spec), "offline", spec, "offline", path=str(art.path))
        return None

    def _from_offline(self, spec: dict[str, JSONScalar], ident: DeviceIdentity) -> Resolution | None:
        hit = self.offline.lookup(spec, ident, accepts=lambda c: self._accepts(c, spec))
        if hit is None:
            return None
        return Resolution(self._canonical(hit.config, spec), "offline", spec, "offline", path=str(hit.path),
                          stale=hit.stale, nearest=hit.nearest)

    def _from_default(self, spec: dict[str, JSONScalar]) -> Resolution | None:
        if self._default is None:
            return None
        config = self._default(spec)
        if not isinstance(config, Config):
            raise TypeError(f"{self.name}: default() must return a Config, got {type(config).__name__}")
        return Resolution(config, "default", spec, "default")

    def _candidates(self, spec: dict[str, JSONScalar]) -> list[Config]:
        raw = self._configs(dict(spec)) if callable(self._configs) else self._configs
        cands = list(raw)
        if self._prune is not None:
            cands = list(self._prune(cands, dict(spec)))
        bad = [c for c in cands if not isinstance(c, Config)]
        if bad:
            raise TypeError(f"{self.name}: configs must be Config instances, got {type(bad[0]).__name__}")
        return list(dict.fromkeys(cands))

    # -- binding and searching --------------------------------------------------------------
    def _bind(self, config: Config, spec: dict[str, JSONScalar], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Launcher:
        launch = self.build_cache.get(self.name, config, spec, self.structural, self._build)
        return bind_launcher(self.name, launch, config, args, kwargs, self.arg_names, self.reset_to_zero)

    def tune(self, *args: Any, emit: bool = True, out_dir: str | os.PathLike[str] | None = None,
             **kwargs: Any) -> TuneReport:
        """Search the configs of this call now (whatever is cached), store the winner and return the report.

        A failed artifact write raises OSError after the winner is stored in memory and in the scratch cache.
        """
        ck = self._call_key(args, kwargs)
        if capturing(ck.device):
            raise GraphCaptureError(f"{self.name}: tune() called while a CUDA graph is being captured; "
                                    f"tune before capture (a search benchmarks and synchronizes)")
        res, error = self._search(ck, args, kwargs, emit=emit, out_dir=out_dir)
        self._record(ck, res)
        self._bound.clear()
        if error is not None:
            raise OSError(f"{self.name}: {error}") from error.__cause__
        return self.reports[ck.pkey]

    def _search(self, ck: CallKey, args: tuple[Any, ...], kwargs: dict[str, Any], *, emit: bool,
                out_dir: str | os.PathLike[str] | None = None) -> tuple[Resolution, OSError | None]:
        """Search, store the winner in the scratch cache and, with ``emit``, write its artifact.

        Returns the resolution and the error of a failed artifact write (None when written or not asked).
        """
        from flyreg._search.engine import run_search

        spec, ident = ck.spec, ck.ident
        self.stats.searches += 1
        default = self._from_default(spec)
        report = run_search(self, spec, args, kwargs, ck.named, ck.device, default.config if default else None)
        entry = {"spec": spec, "device": ident.to_json(), "toolchain": fingerprint(self.version),
                 "env": dict(env_values(self.key_env)), "config": report.winner.to_json(),
                 "time_ms": report.winner_ms, "default_ms": report.default_ms,
                 "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        try:
            cache.store(self.name, ck.pkey, entry)
        except OSError as e:
            warn_once(f"flyreg: {self.name}: could not write the scratch cache: {e}")
        artifact, error = None, None
        if emit:
            try:
                artifact = str(emit_artifact(self.name, spec, ident, report.winner, self.version,
                                             report.winner_ms, report.default_ms, out_dir))
            except OSError as e:
                where = out_dir if out_dir is not None else emit_dir()
                error = OSError(f"could not write the artifact of spec {spec} into {os.fspath(where)!r}: "
                                f"{type(e).__name__}: {e}")
                error.__cause__ = e
        self.reports[ck.pkey] = attrs.evolve(report, artifact=artifact)
        return Resolution(report.winner, "search", spec, "search", path=artifact), error


_SEQUENCES = (list, tuple)


def _structural_key(value: Any) -> Any:
    """``value`` for the in-memory key: tensors by layout, lists and tuples item by item, others typed."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.shape, value.stride(), value.device)
    if isinstance(value, _SEQUENCES):
        return (value.__class__, tuple(_structural_key(v) for v in value))
    return (value.__class__, value)


def _params(fn: Callable[..., Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(positional parameter names, keyword-only parameter names) of ``fn``; empty when unknown."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return (), ()
    return (tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)),
            tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY))


def _names(op: str, what: str, value: Any) -> tuple[str, ...]:
    """``value`` (a list of names) as a tuple; a single string, a non-iterable or a non-name is a TypeError."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{op}: {what} must be a list of names, got the string {value!r} "
                        f"(write [{value!r}] for one name)")
    try:
        names = tuple(value)
    except TypeError:
        raise TypeError(f"{op}: {what} must be a list of names, got {type(value).__name__}") from None
    bad = [v for v in names if not isinstance(v, str) or not v]
    if bad:
        raise TypeError(f"{op}: {what} must be a list of non-empty strings, got {bad[0]!r} in it")
    return names


def _check_in_place_names(op: str, restore_value: tuple[str, ...], reset_to_zero: tuple[str, ...],
                          arg_names: tuple[str, ...], keyword_only: tuple[str, ...]) -> None:
    """Every ``restore_value`` and ``reset_to_zero`` name must be findable in a call, else ValueError.

    A name outside ``arg_names`` could only ever match a keyword argument: passed by position it
    would silently be neither restored nor zeroed. Keyword-only parameters of ``specialize`` are
    fine (they cannot be passed by position).
    """
    known = set(arg_names) | set(keyword_only)
    for what, names in (("restore_value", restore_value), ("reset_to_zero", reset_to_zero)):
        missing = [n for n in names if n not in known]
        if missing:
            have = f"arg_names is {list(arg_names)}" if arg_names else "no arg_names were given or found"
            raise ValueError(f"{op}: {what} names {missing}, which are not among the call's argument names "
                             f"({have}); pass arg_names=[...] naming the positional arguments in order")


def capturing(device: Any) -> bool:
    """True while the current CUDA stream of ``device`` is capturing a CUDA graph; False off CUDA.

    Asked only when a call's key is not yet resolved in memory, never on the steady-state call.
    """
    if getattr(device, "type", None) != "cuda" or not torch.cuda.is_available():
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _device_of(values: Iterable[Any]) -> Any:
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device
    return None


def _spec_key(spec: dict[str, JSONScalar]) -> str:
    return repr(sorted(spec.items()))
