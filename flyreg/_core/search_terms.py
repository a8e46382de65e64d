"""What serving and searching share about a search: the call it runs on, its checked settings, the
names of the timing methods, strategies and efforts a setting may hold, and the one check of each field
an op's description shares with the settings (the op record is made through them).

The serving path builds a tuner's :class:`SearchSettings` and a :class:`Call` without importing the
search (``flyreg._search``), which loads only when a search starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs

#: How a search times candidates on a GPU: ``steady`` (a CUDA graph of calls over rotating input
#: copies, :mod:`flyreg._search.steady`), ``flushed`` (single calls after an L2 flush) or ``graph`` (a CUDA
#: graph of calls on the call's own inputs). A CPU search always times single calls.
TIMINGS = ("steady", "flushed", "graph")
#: The strategies an op may prefer for a large space (:data:`flyreg._search.strategy.STRATEGIES` runs them).
STRATEGIES = ("exhaustive", "local")
#: How much of a space to time: ``auto`` (all of a small one), ``quick`` (a share), ``full`` (all).
EFFORTS = ("auto", "quick", "full")


@attrs.frozen
class Call:
    """The call a search runs on: its arguments, by position and keyword and by name, its device, and
    ``draws(seed) -> (args, kwargs)``, other draws of its spec (None: the op's inputs are drawn alike)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    named: dict[str, Any]
    device: Any
    draws: Callable[[int], tuple[tuple[Any, ...], dict[str, Any]]] | None = None


def check_counts(warmup: object, rep: object) -> None:
    """Raise ValueError unless ``warmup`` is an int >= 0 and ``rep`` an int >= 1 (bools are not counts)."""
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0 (a count of runs), got {warmup!r}")
    if not isinstance(rep, int) or isinstance(rep, bool) or rep < 1:
        raise ValueError(f"rep must be an int >= 1 (a count of runs), got {rep!r}")


class OpDescription(Protocol):
    """The fields of an op's description that its tuner and its search read: an op record
    (:class:`flyreg.plugin.OpRecord`) is one, its fields checked when it is made by this module's checks
    (:func:`check_timing`, :func:`check_strategy`, :func:`names_of`, :func:`check_in_place_names`), which
    :meth:`SearchSettings.of` shares. :meth:`Autotuner.from_record <flyreg._runtime.tuner.Autotuner.from_record>`
    and :meth:`SearchSettings.from_record` read it without checking it again."""

    @property
    def version(self) -> str: ...
    @property
    def structural(self) -> tuple[str, ...] | None: ...
    @property
    def arg_names(self) -> tuple[str, ...] | None: ...
    @property
    def restore_value(self) -> tuple[str, ...]: ...
    @property
    def reset_to_zero(self) -> tuple[str, ...]: ...
    @property
    def ordered_axes(self) -> tuple[str, ...]: ...
    @property
    def config_dir(self) -> os.PathLike[str] | None: ...
    @property
    def key_env(self) -> tuple[str, ...]: ...
    @property
    def timing(self) -> str: ...
    @property
    def strategy(self) -> str | None: ...


#: ``reference(args, kwargs)``: the correct result of a call, for the correctness gate.
Reference = Callable[[tuple[Any, ...], dict[str, Any]], Any]


@attrs.frozen
class SearchSettings:
    """Everything a search of op ``op`` reads besides the call itself.

    ``warmup`` and ``rep`` count runs (replays, with steady timing); ``tie_band`` is how close to
    the fastest the default (then the earliest config) still wins; ``timing`` is one of
    :data:`TIMINGS`. ``arg_names`` name the positional arguments, so
    ``restore_value`` (restored before every run) and ``reset_to_zero`` (zeroed) can name them.
    ``reference`` gates correctness (None: nothing is rejected as wrong). ``compile_threads``
    binds the candidates (None: ``FLYREG_COMPILE_THREADS``, else up to 16, read at each search).
    ``strategy`` is the op's preferred strategy for a large space (a name in
    :data:`STRATEGIES`; None: local search); ``effort`` (``auto``,
    ``quick``, ``full``), ``budget_s`` (seconds one spec's search may take before its final round;
    None: no limit) and ``seed`` choose how much of the space is timed (:func:`~flyreg._search.strategy.choose`).
    ``resume`` reuses the tuning journal's measurements of the same op, spec, device, toolchain and
    timing method instead of timing those configs again (``flyreg tune`` sets it); with ``retry_failed``
    (``flyreg tune --force``) only its timings are reused, and the configs it holds as failed or
    rejected are tried again.
    Build one with :meth:`of`, which checks every field; :meth:`with_run` changes the run's fields.
    """

    op: str
    warmup: int = 5
    rep: int = 20
    tie_band: float = 0.005
    timing: str = "steady"
    arg_names: tuple[str, ...] = ()
    restore_value: tuple[str, ...] = ()
    reset_to_zero: tuple[str, ...] = ()
    reference: Reference | None = None
    compile_threads: int | None = None
    strategy: str | None = None
    effort: str = "auto"
    budget_s: float | None = None
    seed: int = 0
    resume: bool = False
    retry_failed: bool = False

    @classmethod
    def of(cls, op: str, *, warmup: int = 5, rep: int = 20, tie_band: float = 0.005, timing: str = "steady",
           arg_names: Sequence[str] = (), restore_value: Iterable[str] = (), reset_to_zero: Iterable[str] = (),
           keyword_only: Iterable[str] = (), reference: Reference | None = None,
           compile_threads: int | None = None, strategy: str | None = None, effort: str = "auto",
           budget_s: float | None = None, seed: int = 0, resume: bool = False,
           retry_failed: bool = False) -> SearchSettings:
        """Checked settings; ValueError or TypeError naming ``op`` and the bad argument.

        ``keyword_only`` are argument names a call can only pass by keyword, which
        ``restore_value`` and ``reset_to_zero`` may name as well as ``arg_names``.
        """
        if not 0 <= tie_band < 1:
            raise ValueError(f"{op}: tie_band must be in [0, 1), got {tie_band!r}")
        try:
            check_counts(warmup, rep)
        except ValueError as e:
            raise ValueError(f"{op}: {e}") from None
        _check_reference(op, reference)
        if compile_threads is not None and (not isinstance(compile_threads, int) or compile_threads < 1):
            raise ValueError(f"{op}: compile_threads must be a positive int, got {compile_threads!r}")
        names = names_of(op, "arg_names", arg_names)
        restore, zero = names_of(op, "restore_value", restore_value), names_of(op, "reset_to_zero", reset_to_zero)
        check_in_place_names(op, restore, zero, names, tuple(keyword_only))
        return cls(op, warmup, rep, tie_band, check_timing(op, timing), names, restore, zero, reference,
                   compile_threads, *_run_fields(op, strategy, effort, budget_s, seed, resume, retry_failed))

    @classmethod
    def from_record(cls, op: str, record: OpDescription, *, reference: Reference | None = None) -> SearchSettings:
        """The settings an op's description gives its search, with the default run fields.

        ``record`` is a checked description (an :class:`~flyreg.plugin.OpRecord` checks its fields when
        made, by this module's checks), so its fields are taken as they are; only ``reference`` is checked.
        """
        _check_reference(op, reference)
        return cls(op, timing=record.timing, arg_names=record.arg_names or (), restore_value=record.restore_value,
                   reset_to_zero=record.reset_to_zero, reference=reference, strategy=record.strategy)

    def with_run(self, **changes: object) -> SearchSettings:
        """These settings with the run's fields (``strategy``, ``effort``, ``budget_s``, ``seed``, ``resume``,
        ``retry_failed``) changed, checked as :meth:`of` checks them."""
        unknown = sorted(set(changes) - set(RUN_FIELDS))
        if unknown:
            raise TypeError(f"{self.op}: unknown search options {unknown}; known: {list(RUN_FIELDS)}")
        run = {f: changes.get(f, getattr(self, f)) for f in RUN_FIELDS}
        return attrs.evolve(self, **dict(zip(RUN_FIELDS, _run_fields(self.op, **run))))  # type: ignore[arg-type]


#: The fields of one run of a search, which ``flyreg tune`` (or :meth:`Autotuner.tune`) may change per call.
RUN_FIELDS = ("strategy", "effort", "budget_s", "seed", "resume", "retry_failed")


def _run_fields(op: str, strategy: object, effort: object, budget_s: object, seed: object,
                resume: object, retry_failed: object = False) -> tuple[str | None, str, float | None, int, bool, bool]:
    """The run's fields, checked; ValueError or TypeError naming ``op`` and the field."""
    check_strategy(op, strategy)
    check_effort(op, effort)
    if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(budget_s, (int, float))
                                 or not 0 < budget_s < float("inf")):
        raise ValueError(f"{op}: budget_s must be a number of seconds > 0 or None, got {budget_s!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{op}: seed must be an int, got {seed!r}")
    for name, flag in (("resume", resume), ("retry_failed", retry_failed)):
        if not isinstance(flag, bool):
            raise TypeError(f"{op}: {name} must be True or False, got {flag!r}")
    return (strategy, effort, None if budget_s is None else float(budget_s), seed,  # type: ignore[return-value]
            resume, retry_failed)


# -- the checks of a description's fields: the op record's and the search settings' ------------------------
# Each takes the op's name to begin its message with ("" for none: the op record names its op where it loads).


def _where(op: str) -> str:
    return f"{op}: " if op else ""


def _check_reference(op: str, reference: object) -> None:
    if reference is not None and not callable(reference):
        raise TypeError(f"{_where(op)}reference must be a callable of (args, kwargs), got {type(reference).__name__}")


def check_timing(op: str, timing: object) -> str:
    """``timing``, one of :data:`TIMINGS`; else ValueError naming it and the choices."""
    if timing not in TIMINGS:
        raise ValueError(f"{_where(op)}timing must be one of {list(TIMINGS)}, got {timing!r}")
    return timing  # type: ignore[return-value]


def check_strategy(op: str, strategy: object) -> str | None:
    """``strategy``, one of :data:`STRATEGIES` or None; else ValueError naming it and the choices."""
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"{_where(op)}strategy must be one of {sorted(STRATEGIES)} (or None: flyreg chooses), "
                         f"got {strategy!r}")
    return strategy  # type: ignore[return-value]


def check_effort(op: str, effort: object) -> str:
    """``effort``, one of :data:`EFFORTS`; else ValueError naming it and the choices."""
    if effort not in EFFORTS:
        raise ValueError(f"{_where(op)}effort must be one of {list(EFFORTS)}, got {effort!r}")
    return effort  # type: ignore[return-value]


def names_of(op: str, what: str, value: Any) -> tuple[str, ...]:
    """``value`` (a list of names) as a tuple; a single string, a non-iterable or a non-name is a TypeError."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{_where(op)}{what} must be a list of names, got the string {value!r} "
                        f"(write [{value!r}] for one name)")
    try:
        names = tuple(value)
    except TypeError:
        raise TypeError(f"{_where(op)}{what} must be a list of names, got {type(value).__name__}") from None
    bad = [v for v in names if not isinstance(v, str) or not v]
    if bad:
        raise TypeError(f"{_where(op)}{what} must be a list of non-empty strings, got {bad[0]!r} in it")
    return names


def check_in_place_names(op: str, restore_value: tuple[str, ...], reset_to_zero: tuple[str, ...],
                         arg_names: tuple[str, ...] | None, keyword_only: tuple[str, ...] = ()) -> None:
    """Every ``restore_value`` and ``reset_to_zero`` name must be findable in a call, else ValueError.

    A name outside ``arg_names`` could only ever match a keyword argument: passed by position it
    would silently be neither restored nor zeroed. Keyword-only parameters are fine (they cannot
    be passed by position).
    """
    known = set(arg_names or ()) | set(keyword_only)
    for what, names in (("restore_value", restore_value), ("reset_to_zero", reset_to_zero)):
        missing = [n for n in names if n not in known]
        if missing and not arg_names:
            raise ValueError(f"{_where(op)}{what} names arguments {missing}, but no arg_names are given to find "
                             f"them by; pass arg_names=[...] naming the positional arguments, in order")
        if missing:
            raise ValueError(f"{_where(op)}{what} names arguments {missing} that are not in arg_names "
                             f"{list(arg_names or ())}: passed by position, they would be found by no name")
