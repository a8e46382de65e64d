"""The resolution chain: where a call's config comes from, in order.

memory -> scratch cache -> artifacts -> default -> search. Each source is a small object whose
``find(tuner, request)`` gives a :class:`Resolution` or None; a chain is a tuple of sources, tried
in order, the first hit wins. A call, :meth:`Autotuner.resolve`, :meth:`Autotuner.resolve_spec`,
``flyreg show`` and ``flyreg tune``'s planning all resolve through these sources; whether a stored
config may serve is :mod:`flyreg._artifacts.usable`'s rule, for the scratch cache as for artifacts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import attrs
import torch

from flyreg._artifacts import cache
from flyreg._artifacts.lookup import OfflineStore, is_artifact
from flyreg._artifacts.usable import config_problem
from flyreg._core import settings
from flyreg._core.config import Config, JSONScalar
from flyreg._core.fileio import warn_once
from flyreg._core.keys import DeviceIdentity, cache_key, cache_key_prefix, env_values, identity_of
from flyreg._core.results import GraphCaptureError, Resolution, TuneError
from flyreg._core.search_terms import Call
from flyreg._core.spec import normalize_spec, spec_key
from flyreg._runtime import pending
from flyreg._runtime.searching import search
from flyreg._runtime.state import TunerState

Spec = dict[str, JSONScalar]


def autotune_forced() -> bool:
    """True when ``FLYREG_AUTOTUNE`` asks for a fresh search of every new key."""
    return settings.current().autotune


def capturing(device: Any) -> bool:
    """True while the current CUDA stream of ``device`` is capturing a CUDA graph. A call on another device
    (the CPU) counts as in capture while the current CUDA stream captures: a search then would stall the
    capture. False where CUDA was never initialized (nothing can be capturing; the query would initialize it).

    Asked only when a call's key is not yet resolved in memory, never on the steady-state call.
    """
    if getattr(device, "type", None) != "cuda":
        return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()
    if not torch.cuda.is_available():
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


@attrs.frozen
class Request:
    """What to resolve: a spec on a device; a call's scratch-cache key (``pkey``) and arguments (``call``),
    or neither for a spec-only query, which never searches."""

    spec: Spec
    ident: DeviceIdentity
    pkey: str | None = None
    call: Call | None = None


class Source(Protocol):
    """One link of the chain: ``name`` is the :attr:`Resolution.source` of what it finds."""

    name: str

    def find(self, tuner: TunerState, req: Request) -> Resolution | None: ...


class InMemory:
    """What this tuner resolved in this process (:class:`flyreg._runtime.state.Memory`)."""

    name = "memory"

    def find(self, tuner: TunerState, req: Request) -> Resolution | None:
        res = tuner.memory.get(req.pkey, req.spec, req.ident)
        return attrs.evolve(res, source="memory") if res is not None else None


class ScratchCache:
    """The scratch disk cache: the entry at the call's key; for a spec-only query, an entry whose key a
    call of that spec on that device would have, whatever its tensors' layouts."""

    name = "cache"

    def find(self, tuner: TunerState, req: Request) -> Resolution | None:
        if req.pkey is not None:
            entry = cache.get(tuner.name, req.pkey)  # one indexed read
            found = [entry] if entry is not None else []
        else:
            env = env_values(tuner.key_env)
            want = _without_tensors(cache_key(tuner.name, req.spec, [], req.ident, tuner.version, env))
            near = cache.starting_with(tuner.name, cache_key_prefix(tuner.name, req.spec, req.ident, env))
            found = [e for k, e in near.items() if _without_tensors(k) == want]
        for entry in found:
            res = _from_entry(tuner, entry, req.spec)
            if res is not None:
                return res
        return None


class Artifacts:
    """The offline artifacts. ``exact``: only the artifact lookup serves first for exactly this spec on
    this product (quietly); ``exact_current``: that one, and only when current (emission's and
    ``flyreg tune``'s notion of done); ``dirs`` replaces the lookup directories.

    A hit's source names the link of the fallback chain that served it
    (:data:`~flyreg._artifacts.lookup.ARTIFACT_SOURCES`): ``offline`` (the exact artifact),
    ``offline-nearest``, ``offline-other-device``, ``offline-other-toolchain``; its origin is ``offline``.
    """

    name = "offline"

    def __init__(self, exact_current: bool = False, dirs: list[Path] | None = None, exact: bool = False) -> None:
        self.exact_current = exact_current
        self.exact = exact or exact_current
        self.dirs = dirs

    def find(self, tuner: TunerState, req: Request) -> Resolution | None:
        store = tuner.offline if self.dirs is None else OfflineStore(
            tuner.name, (), tuner.offline.ordered_axes, tuner.version, only=self.dirs)
        hit = store.lookup(req.spec, req.ident, tuner.space.accepts, exact_only=self.exact, quiet=self.exact)
        if hit is None or (self.exact_current and hit.stale):
            return None
        return Resolution(tuner.space.canonical(hit.config, req.spec), hit.source, req.spec, "offline",
                          path=str(hit.path), stale=hit.stale, nearest=hit.nearest)


class Default:
    """The op's heuristic default for the spec."""

    name = "default"

    def find(self, tuner: TunerState, req: Request) -> Resolution | None:
        config = tuner.space.default(req.spec, req.ident)
        return Resolution(config, "default", req.spec, "default") if config is not None else None


class Search:
    """A search on the call's own inputs (never for a spec-only query); its winner goes to the scratch
    cache and, under ``FLYREG_AUTOTUNE=1`` or ``emit=True``, into an artifact. A failed artifact write
    warns once and the winner is served from memory."""

    name = "search"

    def find(self, tuner: TunerState, req: Request) -> Resolution | None:
        if req.call is None or req.pkey is None:
            return None
        try:
            res, error = search(tuner, req.spec, req.ident, req.pkey, req.call, emit=autotune_forced() or tuner.emit)
        except TuneError as e:
            default = tuner.space.default(req.spec, req.ident)
            if not e.rejected or default is None:
                raise
            config, why = e.rejected[0]
            warn_once(f"flyreg: {tuner.name}: every config of spec {req.spec} failed the correctness gate on this "
                      f"call's data ({config}: {why}); serving the default {default}, stored nowhere",
                      key=f"gate-fallback:{tuner.name}:{spec_key(req.spec)}")
            return Resolution(default, "default", req.spec, "default")
        if error is not None:
            warn_once(f"flyreg: {tuner.name}: {error}; the winner is served from memory only",
                      key=f"emit-failed:{tuner.name}")
        return res


class NoSearchInCapture:
    """The end of the chain while a CUDA graph is being captured: a search would benchmark and synchronize."""

    name = "search"

    def find(self, tuner: TunerState, req: Request) -> Resolution | None:
        raise GraphCaptureError(
            f"{tuner.name}: spec {req.spec} was first called while a CUDA graph was being captured, and it has "
            f"no cached, offline or default config; flyreg never searches during capture (a search benchmarks "
            f"and synchronizes). Call the op once with these shapes before capture, or ship an offline "
            f"artifact for it (flyreg tune)")


MEMORY, SCRATCH_CACHE, ARTIFACTS, DEFAULT, SEARCH = InMemory(), ScratchCache(), Artifacts(), Default(), Search()
CURRENT_ARTIFACT = Artifacts(exact_current=True)
#: Every source, in order: what a call resolves through.
CHAIN = (MEMORY, SCRATCH_CACHE, ARTIFACTS, DEFAULT, SEARCH)
#: Without a call's inputs (``resolve_spec``, ``flyreg show``): every source but the search.
LOOKUP = CHAIN[:-1]
#: A new key while a CUDA graph is captured: the lookup, never a search.
IN_CAPTURE = (*LOOKUP, NoSearchInCapture())
#: ``FLYREG_AUTOTUNE=1``: a new key is searched. ``emit=True``: only its own current artifact is a hit.
FORCED = (MEMORY, SEARCH)
EMITTING = (MEMORY, CURRENT_ARTIFACT, SEARCH)

Chain = tuple[Source, ...]


def hits(tuner: TunerState, req: Request, chain: Chain = LOOKUP) -> Iterator[Resolution]:
    """The answer of each source of ``chain`` that has one, in order (lazily: the first is what serves)."""
    for source in chain:
        res = source.find(tuner, req)
        if res is not None:
            yield res


def resolve(tuner: TunerState, req: Request, chain: Chain) -> Resolution | None:
    """The first hit along ``chain``, or None."""
    return next(hits(tuner, req, chain), None)


def resolve_spec(tuner: TunerState, spec: dict[str, Any], device: Any = None) -> Resolution:
    """What a call of ``spec`` on ``device`` gets with no search (:data:`LOOKUP`); LookupError when only a
    search could give a config."""
    return what_serves(tuner, spec, device, offline_too=False)[0]


def what_serves(tuner: TunerState, spec: dict[str, Any], device: Any = None,
                offline_too: bool = True) -> tuple[Resolution, Resolution | None]:
    """What a call of ``spec`` on ``device`` gets (as :func:`resolve_spec`), and the artifact that would
    serve it once memory and the scratch cache are gone (None: none would, or not asked)."""
    checked, ident = normalize_spec(spec), identity_of(device)
    if tuner.spec_check is not None:
        checked = tuner.spec_check(checked, device)
    req = Request(checked, ident)
    found = hits(tuner, req, LOOKUP)
    first = next(found, None)
    if first is None:
        raise LookupError(f"{tuner.name}: no cached, offline or default config for spec {req.spec}; tune it first")
    if is_artifact(first.source) or not offline_too:
        return first, first if is_artifact(first.source) else None
    return first, next((r for r in found if is_artifact(r.source)), None)


def current_artifact(tuner: TunerState, spec: Spec, ident: DeviceIdentity, directory: Path) -> Resolution | None:
    """The artifact in ``directory`` that lookup would serve first for ``spec`` on ``ident``, when it is
    current: what ``flyreg tune`` need not tune again (emission's notion of a hit, in one directory)."""
    return Artifacts(exact_current=True, dirs=[directory]).find(tuner, Request(dict(spec), ident))


def own_artifact(tuner: TunerState, spec: Spec, ident: DeviceIdentity,
                 dirs: list[Path] | None = None) -> Resolution | None:
    """The artifact lookup would serve first for exactly ``spec`` on the product ``ident``, across the lookup
    directories (or ``dirs``), current or stale (:attr:`Resolution.stale`); None when there is none."""
    return Artifacts(exact=True, dirs=dirs).find(tuner, Request(dict(spec), ident))


def resolve_call(tuner: TunerState, req: Request) -> Resolution:
    """A call's config through the chain its mode uses, remembered in memory (a memory hit is not
    recorded again). A new key met during capture gets the lookup and a one-time warning."""
    assert req.call is not None
    res = MEMORY.find(tuner, req)  # every chain starts here, before the capture state is asked
    if res is not None:
        return res
    in_capture = capturing(req.call.device)
    forced = autotune_forced()
    chain = IN_CAPTURE if in_capture else FORCED if forced else EMITTING if tuner.emit else CHAIN
    try:
        res = resolve(tuner, req, chain[1:])
    except GraphCaptureError:
        if in_capture:
            _keep_pending(tuner, req, "nothing")
        raise
    assert res is not None  # the chain ends in a search, which resolves or raises
    if in_capture:
        skipped = " (FLYREG_AUTOTUNE=1 ignored)" if forced else " (emission skipped)" if tuner.emit else ""
        warn_once(f"flyreg: {tuner.name}: spec {req.spec} was first called while a CUDA graph was being captured; "
                  f"serving the {res.source} config {res.config} with no search{skipped}. Call the op once with "
                  f"these shapes before capture, or call flyreg.tune_pending() after it",
                  key=f"capture:{tuner.name}:{spec_key(req.spec)}")
        if pending.missed(res, forced, tuner.emit):
            _keep_pending(tuner, req, res.source)
            res = attrs.evolve(res, source=pending.CAPTURE + res.source)
    tuner.memory.record(req.pkey, req.spec, req.ident, res)
    return res


def _keep_pending(tuner: TunerState, req: Request, served_by: str) -> None:
    """Keep a key missed during capture for :func:`flyreg._runtime.pending.tune_pending`."""
    assert req.call is not None and req.pkey is not None
    pending.note(tuner, req.spec, req.ident, req.pkey, req.call.device, served_by, req.call.args, req.call.kwargs)


def _from_entry(tuner: TunerState, entry: dict[str, Any], spec: Spec) -> Resolution | None:
    path = cache.database()
    try:
        config = Config.from_json(entry.get("config"))
    except (TypeError, ValueError) as e:
        warn_once(f"flyreg: {tuner.name}: ignoring a bad entry in {path}: {e}")
        return None
    why = config_problem(config, spec, tuner.space.accepts)
    if why:
        warn_once(f"flyreg: {tuner.name}: ignoring cached config {config} in {path}: {why}")
        return None
    return Resolution(tuner.space.canonical(config, spec), "cache", spec, "cache", path=str(path))


def _without_tensors(key: str) -> dict[str, Any] | None:
    """A scratch-cache key without its tensor layouts: what a spec-only query can match; None if not a key."""
    try:
        fields = json.loads(key)
    except (ValueError, RecursionError):
        return None
    if not isinstance(fields, dict) or "tensors" not in fields:
        return None
    fields.pop("tensors")
    return fields
