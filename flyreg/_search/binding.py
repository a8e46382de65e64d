"""Binding a search's candidates before any is timed: builds in order, binds on a thread pool."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flyreg._core.config import Config
from flyreg._core.launch import Launcher, LaunchSignatureError

class CandidateExited(Exception):
    """A candidate called ``sys.exit()``: the failure of that config, never the end of the search's process."""

    @classmethod
    def of(cls, e: BaseException) -> Exception:
        """``e`` as a candidate's failure: a ``SystemExit`` becomes this error, any other exception stays itself."""
        return e if isinstance(e, Exception) else cls(f"the candidate called sys.exit({getattr(e, 'code', None)!r})")


#: ``build(config)``: build (or take from the build cache) the launch callable of ``config`` for the spec.
Build = Callable[[Config], Any]
#: ``bind(config)``: ``config``'s launcher bound to the call's signature.
Bind = Callable[[Config], Launcher]


def compile_threads() -> int:
    """Threads that bind (and so compile) a search's candidates: ``FLYREG_COMPILE_THREADS``, else up to 16."""
    from flyreg._core.settings import current

    return current().compile_threads


def bind_all(op: str, cands: list[Config], build: Build, bind: Bind, threads: int | None = None,
             deadline: float | None = None) -> dict[Config, Launcher | Exception]:
    """Every candidate's bound launcher (or the exception binding it raised), before any is timed.

    Builds run in order on this thread (the build cache counts each structural build once), then
    the first bind; the other binds, where backends compile, run on a thread pool so their
    compiles overlap (so ``bind`` must be thread-safe). A
    :class:`LaunchSignatureError` (the call is wrong, not a config) is raised. ``threads`` None
    is :func:`compile_threads`. Past ``deadline`` (a :func:`time.monotonic` instant) no build or
    bind starts: those candidates are left out of the answer.
    """

    def late() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    out: dict[Config, Launcher | Exception] = {}
    built = []
    for config in cands:
        if late():
            break
        try:
            build(config)
            built.append(config)
        except Exception as e:
            out[config] = e
        except SystemExit as e:
            out[config] = CandidateExited.of(e)
    todo = [c for c in built if not late()]

    def bind_one(config: Config) -> Launcher | Exception | None:
        if late():
            return None
        try:
            return bind(config)
        except LaunchSignatureError:
            raise
        except Exception as e:
            return e
        except SystemExit as e:
            return CandidateExited.of(e)

    threads = min(threads if threads is not None else compile_threads(), len(todo))
    if threads <= 1:
        results = [(c, bind_one(c)) for c in todo]
    else:
        # The first bind runs here, alone: a backend's first use of a kernel may set up caches unsafely.
        results = [(todo[0], bind_one(todo[0]))]
        with ThreadPoolExecutor(threads, thread_name_prefix=f"flyreg-bind-{op}") as pool:
            results += zip(todo[1:], pool.map(bind_one, todo[1:]))
    out.update((c, r) for c, r in results if r is not None)
    return out
