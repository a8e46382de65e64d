"""The one-call constructors of a tuner: ``autotune_builder`` (builder mode) and the ``autotune`` decorator."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from flyreg._core.config import Config, JSONScalar
from flyreg._runtime.builds import BUILD_CACHE, BuildCache, BuildFn
from flyreg._runtime.tuner import Autotuner

__all__ = ["BUILD_CACHE", "BuildCache", "BuildFn", "autotune", "autotune_builder", "default_op_name"]

#: Runs of characters an op name of a decorated function does not keep (``<locals>`` -> ``_locals_``).
_NOT_IN_OP_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def default_op_name(fn: Callable[..., Any]) -> str:
    """The op name of a decorated function: ``module.qualname``, e.g. ``mypkg.kernels.scale`` or
    ``mypkg.kernels.make._locals_.scale``, so two functions of one name in different modules (or
    scopes) never share cache entries or artifacts.

    Characters other than ASCII letters, digits and ``._-`` become ``_``: the name then is its own
    artifact filename part (``offline.name_part`` keeps ``._-``; a leading ``_``, as in
    ``__main__``, is kept in the op name and gets a hash suffix in the filename).
    """
    module = getattr(fn, "__module__", None) or "_"
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return _NOT_IN_OP_NAME.sub("_", f"{module}.{qualname}")


def autotune_builder(
    name: str,
    build: BuildFn,
    specialize: Callable[..., dict[str, JSONScalar]],
    configs: Sequence[Config] | Callable[[dict[str, JSONScalar]], Sequence[Config]],
    default: Callable[..., Config] | None = None,
    structural: Iterable[str] | None = None,
    **options: Any,
) -> Any:
    """Assemble an op's tuner in one call (builder mode).

    ``build(config, spec)`` returns a launch callable; ``specialize(*args, **kwargs)`` returns
    the call's spec axes; ``configs`` is a list or a callable of the spec; ``default(spec)`` is
    the heuristic config served with no search (one with a ``device`` parameter also gets the
    :class:`~flyreg.plugin.Device` it serves); ``structural`` names the knobs that change
    the built code (default: all). Other options are those of :class:`flyreg.Autotuner`.

    Example::

        rmsnorm = autotune_builder("my_rmsnorm", build, specialize, configs, default, structural=["BLOCK"])
        y = rmsnorm(x, w)
    """
    return Autotuner(name, build, specialize, configs, default, structural=structural, **options)


def autotune(
    configs: Sequence[Config] | Callable[[dict[str, JSONScalar]], Sequence[Config]],
    key: Iterable[str],
    *,
    name: str | None = None,
    default: Config | None = None,
    **options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorate a plain callable: the winning config's knobs are passed to it as keyword arguments.

    ``key`` names the arguments whose values enter the cache key, as with ``triton.autotune``.
    Compiler hints are passed too when the callable takes them (``num_warps=...``). The op's
    name is ``name``, else ``module.qualname`` of the function (:func:`default_op_name`); a
    caller may not pass a knob itself.

    Example::

        @autotune([Config({"CHUNK": 64}), Config({"CHUNK": 512})], key=["n"])
        def scale(x, out, n, CHUNK): ...
    """
    if isinstance(key, str):
        raise TypeError(f"autotune key must be a list of argument names, got the string {key!r}")
    key_names = tuple(key)
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"autotune name must be a non-empty op name, got {name!r}")
    if default is not None and not isinstance(default, Config):
        raise TypeError(f"autotune default must be a Config, got {type(default).__name__}")
    if not callable(configs):
        configs = list(configs)
    knob_names = frozenset() if callable(configs) else frozenset(k for c in configs for k in getattr(c, "kwargs", {}))

    def wrap(fn: Callable[..., Any]) -> Any:
        sig = inspect.signature(fn)
        missing = [k for k in key_names if k not in sig.parameters]
        if missing:
            raise ValueError(f"autotune key names {missing} are not parameters of {fn.__name__}{sig}")
        arg_names = [p.name for p in sig.parameters.values()
                     if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

        def specialize(*args: Any, **kwargs: Any) -> dict[str, JSONScalar]:
            bound = sig.bind_partial(*args, **kwargs)
            passed = sorted(knob_names & set(bound.arguments))
            if passed:
                raise TypeError(f"{fn.__name__}: {passed} are tuned knobs; the autotuner passes them, not the caller")
            bound.apply_defaults()
            return {k: bound.arguments[k] for k in key_names}

        specialize.__signature__ = sig  # type: ignore[attr-defined]  # the tuner reads argument names from it

        def build(config: Config, spec: dict[str, JSONScalar]) -> Callable[..., Any]:
            return functools.partial(fn, **config.kwargs)

        tuner = Autotuner(name if name is not None else default_op_name(fn), build, specialize, configs,
                          (lambda spec: default) if default is not None else None,
                          arg_names=arg_names, **options)
        functools.update_wrapper(tuner, fn)
        return tuner

    return wrap
