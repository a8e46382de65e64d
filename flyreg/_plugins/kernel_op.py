"""One ``@triton.jit`` kernel as a declared op (:func:`triton_op`): its launch derived from the kernel, a grid and
the kernel's arguments, as ``@triton.autotune``'s; the rest is a :class:`~flyreg._plugins.declared.Declaration`.

A declaration whose configs do not fit the kernel fails when it is made, not on the first GPU: every config
given as a value (and a default given as one) must name only the kernel's constexprs and give each that has no
default. Configs given by a function of the spec are checked the same way when a launcher is bound, and a grid
or an args function that fails there names itself and what it was given.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import sys
from collections.abc import Callable, Sequence
from typing import Any

from flyreg._core.config import Config
from flyreg._plugins.declared import DeclaredOp, _signature, declare

__all__ = ["triton_op"]

Grid = Callable[[dict[str, Any]], Sequence[int]]


def triton_op(kernel: Any, *, schema: str, grid: Grid | Sequence[int], args: Callable[..., Sequence[Any]],
              output_like: str | None = None, **declared: Any) -> DeclaredOp:
    """A declared op whose launch is ``kernel[grid](*args(...), **knobs, **hints)``, as ``@triton.autotune``'s.

    ``args(*call_args, out)``: the kernel's runtime arguments (its constexprs are the config's knobs),
    from the call's arguments and, with ``output_like``, the output allocated like that argument
    (``torch.empty_like``), which the call returns. ``grid(meta)``: the launch grid from ``meta``, the
    kernel's arguments by name plus the knobs (or a fixed grid, a tuple). The kernel is compiled once per call
    signature (:func:`flyreg.triton.compiled_launcher`). Every other argument is a :class:`Declaration` field
    or a record field of :data:`RECORD_KEYWORDS` (not ``record``: the schema is given); ``description`` defaults
    to the first line of the kernel's docstring, else of its module's. A config that names a knob the kernel has
    no constexpr of, or leaves out a constexpr without a default, is a TypeError.
    """
    if not hasattr(kernel, "arg_names") or not hasattr(kernel, "run"):  # a JITFunction, or one autotune wraps
        raise TypeError(f"kernel must be a @triton.jit function, got {type(kernel).__name__}")
    if isinstance(grid, (tuple, list)) and all(isinstance(g, int) for g in grid):
        grid = functools.partial(_fixed_grid, tuple(grid))
    if not callable(grid):
        raise TypeError(f"grid must be a function of meta (the kernel's arguments by name plus the knobs) "
                        f"or a tuple of ints, got {grid!r}")
    if not callable(args):
        raise TypeError(f"args must be a function of the call's arguments giving the kernel's, got {args!r}")
    for field in ("configs", "default"):
        value = declared.get(field)
        for config in [value] if isinstance(value, Config) else value if isinstance(value, (list, tuple)) else []:
            if isinstance(config, Config):
                _check_knobs(kernel, config.kwargs, f"{field} {config}")
    if "description" not in declared and "record" not in declared:
        declared["description"] = _first_doc_line(kernel)
    names = list(_signature(schema).parameters)
    out_at = names.index(output_like) if output_like in names else None  # the record names a wrong one
    return declare(schema=schema, bind=functools.partial(_bind_kernel, kernel, grid, args, out_at, len(names)),
                   output_like=output_like, **declared)


def _first_doc_line(kernel: Any) -> str:
    """The first line of the kernel's docstring, else of its module's ("" without either): ``flyreg list``'s
    description of an op declared without one."""
    fn = getattr(kernel, "fn", kernel)
    for doc in (getattr(fn, "__doc__", None), getattr(sys.modules.get(getattr(fn, "__module__", "")), "__doc__", None)):
        if isinstance(doc, str) and doc.strip():
            return doc.strip().splitlines()[0].strip()
    return ""


def _fixed_grid(size: tuple[int, ...], meta: dict[str, Any]) -> tuple[int, ...]:
    return size


def _kernel_name(kernel: Any) -> str:
    return str(getattr(getattr(kernel, "fn", kernel), "__name__", kernel))


def _constexprs(kernel: Any) -> list[tuple[str, bool]] | None:
    """The kernel's constexpr parameters, each with whether it has a default; None where a wrapper
    (``@triton.autotune``, ``@triton.heuristics``) may supply them, or the kernel cannot say."""
    params = getattr(kernel, "params", None)
    if params is not None:  # a JITFunction
        return [(p.name, getattr(p, "default", inspect.Parameter.empty) is not inspect.Parameter.empty)
                for p in params if getattr(p, "is_constexpr", False)]
    fn = getattr(kernel, "fn", None)
    if not inspect.isfunction(fn):  # a wrapper of another kernel
        return None
    # Triton's interpreter: the plain function, its constexprs by annotation (an object or, postponed, a string)
    return [(p.name, p.default is not p.empty) for p in inspect.signature(fn).parameters.values()
            if p.annotation is not p.empty and "constexpr" in getattr(p.annotation, "__name__", str(p.annotation))]


def _check_knobs(kernel: Any, knobs: Any, what: str) -> None:
    """A TypeError where ``knobs`` (names) are not the kernel's constexprs, or leave out one without a default."""
    params = _constexprs(kernel)
    if params is None:
        return
    constexprs = [name for name, _ in params]
    problems = []
    for name in (k for k in knobs if k not in constexprs):
        close = difflib.get_close_matches(name, constexprs, n=1)
        problems.append(f"knob {name!r} is no constexpr of it" + (f" (did you mean {close[0]!r}?)" if close else ""))
    problems += [f"constexpr {name!r} has no value" for name, has_default in params
                 if not has_default and name not in knobs]
    if problems:
        raise TypeError(f"{what} does not fit the kernel {_kernel_name(kernel)}{tuple(kernel.arg_names)}: "
                        + "; ".join(problems))


def _bind_kernel(kernel: Any, grid: Grid, kernel_args: Callable[..., Sequence[Any]], out_at: int | None, arity: int,
                 *call: Any, **options: Any) -> Callable[..., Any]:
    """The launcher of ``kernel`` for calls shaped like ``call`` (see :func:`triton_op`)."""
    import torch

    from flyreg.triton import compiled_launcher

    hint_names = set(options) - set(kernel.arg_names)
    knobs = {k: v for k, v in options.items() if k not in hint_names}
    hints = {k: v for k, v in options.items() if k in hint_names}
    _check_knobs(kernel, knobs, f"the config's knobs {knobs} (hints {hints})")
    like = call[out_at] if out_at is not None else None
    outs = (torch.empty_like(like),) if like is not None else ()
    try:
        example = tuple(kernel_args(*call, *outs))
    except Exception as e:
        given = f"the call's {len(call)} arguments" + (" and the output" if outs else "")
        raise TypeError(f"args, called with {given}, raised {type(e).__name__}: {e}") from e
    meta = {**dict(zip(kernel.arg_names, example)), **knobs}
    try:
        size = tuple(grid(meta))
    except Exception as e:
        raise TypeError(f"grid(meta) raised {type(e).__name__}: {e}; meta holds {sorted(meta)}") from e
    defaults = call  # a later call may leave trailing arguments at the defaults the first one had
    launch = None if 0 in size else compiled_launcher(kernel, size, example, knobs, hints, _device(example))

    def run(*a: Any) -> Any:
        if len(a) < arity:
            a = (*a, *defaults[len(a):])
        out = (torch.empty_like(a[out_at]),) if out_at is not None else ()
        if launch is not None:
            launch(*kernel_args(*a, *out))
        return out[0] if out else None

    return run


def _device(args: Sequence[Any]) -> Any:
    import torch

    return next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
