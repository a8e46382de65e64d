"""Binding a resolved config to a launch callable for one call signature."""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from flyreg._core.config import Config


class LaunchSignatureError(TypeError):
    """A call's arguments cannot reach the launch callable (a usage error, not a failing config)."""


ArgsFn = Callable[[tuple[Any, ...], dict[str, Any]], Any]
#: ``bind(args, kwargs)``: the launcher specialized to one call signature.
BindFn = Callable[[tuple[Any, ...], dict[str, Any]], Callable[..., Any]]


def _callable(field: str, optional: bool) -> Callable[[Any, Any, Any], None]:
    def check(_: Any, __: Any, value: Any) -> None:
        if not callable(value) and not (optional and value is None):
            raise TypeError(f"Launch {field} must be a callable{' or None' if optional else ''}, "
                            f"got {type(value).__name__}")

    return check


@attrs.frozen
class Launch:
    """What a ``build`` hook may return instead of a plain launch callable.

    ``launch(*args, **kwargs)`` launches any call. ``bind(args, kwargs)``, when given, is called
    once per call signature (tensor dtypes, shapes, strides and devices, and the other
    arguments' values) with the call's arguments, its keywords plus the compiler hints
    ``launch`` takes; it returns the launcher flyreg then calls with the call's own arguments
    only, so validation, grid arithmetic and compiling stay off the steady-state call. A search
    calls ``bind`` for its candidates from several threads at once. Calling the record calls
    ``launch``.
    """

    launch: Callable[..., Any] = attrs.field(validator=_callable("launch", optional=False))
    bind: BindFn | None = attrs.field(default=None, validator=_callable("bind", optional=True))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.launch(*args, **kwargs)


def launch_parts(built: Callable[..., Any]) -> tuple[Callable[..., Any], BindFn | None]:
    """(launch, bind) of what ``build`` returned: a :class:`Launch`, or a plain callable, whose
    ``bind`` attribute (the older protocol) is still honoured."""
    if isinstance(built, Launch):
        return built.launch, built.bind
    legacy = getattr(built, "bind", None)
    return built, legacy if callable(legacy) else None


def arg_name(arg_names: Sequence[str], i: int) -> str:
    """The name of positional argument ``i``: its entry in ``arg_names``, else ``arg<i>``."""
    return arg_names[i] if i < len(arg_names) else f"arg{i}"


def named_args(args: tuple[Any, ...], kwargs: dict[str, Any], arg_names: Sequence[str]) -> dict[str, Any]:
    """A call's arguments by name: positional ones named by :func:`arg_name`, then the keywords."""
    named = {arg_name(arg_names, i): a for i, a in enumerate(args)}
    named.update(kwargs)
    return named


class Launcher:
    """A launch callable bound to one config and one call signature.

    ``call`` zeroes the ``reset_to_zero`` tensors and runs the config's ``pre_hook`` first;
    ``raw`` only launches and ``pre`` only runs the ``pre_hook`` (None without one): the
    search zeroes and runs the hook outside its timed region.
    """

    __slots__ = ("config", "call", "raw", "pre")

    def __init__(self, config: Config, call: ArgsFn, raw: ArgsFn, pre: ArgsFn | None = None) -> None:
        self.config = config
        self.call = call
        self.raw = raw
        self.pre = pre


def _params(launch: Callable[..., Any]) -> tuple[int | None, set[str] | None]:
    """(how many positional arguments ``launch`` takes, its keyword names); None means any."""
    try:
        params = inspect.signature(launch).parameters.values()
    except (TypeError, ValueError):
        return None, None
    n_pos: int | None = 0
    names: set[str] | None = set()
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            n_pos = None
        elif p.kind is p.VAR_KEYWORD:
            names = None
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and n_pos is not None:
            n_pos += 1
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and names is not None:
            names.add(p.name)
    return n_pos, names


def bind_launcher(op: str, built: Callable[..., Any], config: Config, args: tuple[Any, ...],
                  kwargs: dict[str, Any], arg_names: Sequence[str], reset_to_zero: Sequence[str]) -> Launcher:
    """Bind ``config`` to ``launch`` for calls shaped like ``(args, kwargs)``.

    ``built`` is what ``build`` returned (see :func:`launch_parts`). Call keywords and compiler
    hints are passed only where ``launch`` takes them. A positional argument beyond what
    ``launch`` takes is a build-only scalar passed by position: rejected. With a ``bind``, it is
    called here, once per call signature, with the call's keywords plus the config's compiler
    hints that ``launch`` takes, and what it returns launches instead, with the call's own
    arguments only.
    """
    launch, specialize_to = launch_parts(built)
    n_pos, names = _params(launch)
    if n_pos is not None and len(args) > n_pos:
        i = n_pos
        name = arg_name(arg_names, i)
        raise LaunchSignatureError(
            f"{op}: argument {name!r} (position {i}, value {reprlib.repr(args[i])}) is passed positionally, but the "
            f"launch callable takes {n_pos} positional argument(s); pass build-only scalars by keyword"
        )
    drop = frozenset() if names is None else frozenset(k for k in kwargs if k not in names)
    extra = {k: v for k, v in config.hints.items() if (names is None or k in names) and k not in kwargs}
    if specialize_to is not None:
        launch = specialize_to(args, {**{k: v for k, v in kwargs.items() if k not in drop}, **extra})
        if not callable(launch):
            raise TypeError(f"{op}: the launch's bind() must return a callable, got {type(launch).__name__}")
        extra = {}  # bound in: the bound launcher takes the call's own arguments only
    positions = {n: i for i, n in enumerate(arg_names)}
    reset_pos = tuple(positions[n] for n in reset_to_zero if n in positions and positions[n] < len(args))
    reset_kw = tuple(n for n in reset_to_zero if n in kwargs)
    pre_hook = config.pre_hook

    if not drop and not extra:
        def raw(a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
            return launch(*a, **kw)
    else:
        def raw(a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
            if drop:
                kw = {k: v for k, v in kw.items() if k not in drop}
            return launch(*a, **kw, **extra)

    pre = None
    if pre_hook is not None:
        def pre(a: tuple[Any, ...], kw: dict[str, Any]) -> None:
            pre_hook(named_args(a, kw, arg_names))

    if not reset_pos and not reset_kw and pre is None:
        return Launcher(config, raw, raw)

    def call(a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        for i in reset_pos:
            a[i].zero_()
        for k in reset_kw:
            kw[k].zero_()
        if pre is not None:
            pre(a, kw)
        return raw(a, kw)

    return Launcher(config, call, raw, pre)
