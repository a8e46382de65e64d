"""A declared op: one object that says what an op is, from which flyreg derives its hooks.

A :class:`Declaration` holds the op's one description, its :class:`OpRecord` (the call's signature as
a torch schema, the spec axes, the version, ...: the object the op's tuner and search settings are
read from), and the functions the hooks are derived from: the key (the spec of a call), the config
space and heuristic default, how to bind a config to a call (:func:`triton_op` derives that from a
``@triton.jit`` kernel, its grid and its arguments) and, optionally, a CPU fallback with its own
knobs. :func:`declare` (or :func:`triton_op`) makes the record of its keywords, once, and of the
declaration the plugin object an entry point names, a :class:`DeclaredOp`: it implements the four
required hooks, ``describe`` (the record itself) and the optional ones declared, so the registry
sees a plugin like any hand-written one.

The backend follows the device: with a ``cpu`` fallback the spec gets a ``backend`` axis,
``"triton"`` for a call on a CUDA tensor and ``"cpu"`` otherwise, and each backend has its own
space. Without one, the kernel runs on every device (on the CPU, in Triton's interpreter).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from flyreg._core.config import Config, JSONScalar
from flyreg._core.device import Device, takes_device
from flyreg._core.launch import Launch
from flyreg._plugins.hookspecs import hookimpl
from flyreg._plugins.record import Axis, OpRecord, RecordError
from flyreg._plugins.schema import parse_schema
from flyreg._plugins.work import Work

__all__ = ["BACKEND", "RECORD_KEYWORDS", "Declaration", "DeclaredOp", "declare"]

Spec = dict[str, JSONScalar]
Space = Sequence[Config] | Callable[[Spec], Sequence[Config]]
Default = Config | Callable[..., Config]  # of the spec, and of the device where it takes ``device``


def backend_on(device: str) -> str:
    """The backend a call on ``device`` (``"cpu"`` or ``"cuda"``) runs: Triton on a GPU, the fallback elsewhere."""
    return "triton" if device.startswith("cuda") else "cpu"


#: The axis a declared op with a CPU fallback adds to its spec.
BACKEND = Axis("backend", str, values=("triton", "cpu"), device_default=backend_on)


def _default_value(text: str | None) -> Any:
    """A torch schema default (``1e-06``, ``True``, ``None``) as the Python value."""
    import ast

    return inspect.Parameter.empty if text is None else ast.literal_eval(text)


def _signature(schema: str) -> inspect.Signature:
    params = [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY if a.kw_only else
                                inspect.Parameter.POSITIONAL_OR_KEYWORD, default=_default_value(a.default))
              for a in parse_schema(schema).args]
    return inspect.Signature(params)


def _space(value: Space) -> Callable[[Spec], list[Config]]:
    return (lambda spec: list(value(spec))) if callable(value) else (lambda spec: list(value))


def _pick(value: Default) -> Callable[[Spec, Device | None], Config]:
    """A default of the spec and the device, from a value or a function of the spec (and of ``device``)."""
    if not callable(value):
        return lambda spec, device: value
    if takes_device(value):
        return lambda spec, device: value(spec, device=device)
    return lambda spec, device: value(spec)


def _spec_value(value: Any) -> JSONScalar:
    """A key's value as a spec holds it: a ``torch.dtype`` by its name (``"bfloat16"``)."""
    name = type(value).__name__  # torch.dtype, told without importing torch
    return str(value).removeprefix("torch.") if name == "dtype" else value


def _device_type(args: Sequence[Any]) -> str:
    """The device type of the first tensor among ``args`` (``"cpu"`` without one)."""
    return next((a.device.type for a in args if hasattr(a, "device") and hasattr(a, "dtype")), "cpu")


def _call_args(made: Any) -> tuple[Any, ...]:
    """What ``make_inputs`` returned, as the call's arguments: any sequence of them, but not a bare tensor."""
    if hasattr(made, "shape") and hasattr(made, "dtype"):  # iterable, but by its rows
        raise TypeError(f"make_inputs must return the call's arguments as a tuple, got {type(made).__name__}")
    return tuple(made)


def _takes(fn: Callable[..., Any]) -> Callable[[str], bool]:
    """Whether ``fn`` takes a keyword of a given name (any, with ``**kwargs``; none where it cannot say)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return lambda name: False
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return lambda name: True
    names = {p.name for p in params}
    return names.__contains__


#: The record's fields a declaration may give by keyword, instead of a ``record``: ``schema`` is the record's
#: ``torch_schema``; its ``arg_names`` come from the schema, its ``ordered_axes`` from the axes.
RECORD_KEYWORDS = ("schema", "axes", "description", "version", "output_like", "torch_fake", "structural",
                   "restore_value", "reset_to_zero", "config_dir", "key_env", "timing", "strategy")


def _with_backend(axes: Any) -> Any:
    """``axes`` with :data:`BACKEND` among them, in name order (as given where there are none, or it is there)."""
    if not isinstance(axes, (list, tuple)) or not axes or not all(isinstance(a, Axis) for a in axes):
        return axes  # none declared, or malformed: the record names what is wrong
    if any(a.name == BACKEND.name for a in axes):
        return axes
    return sorted((*axes, BACKEND), key=lambda a: a.name)


def _complete(record: OpRecord, fallback: bool) -> OpRecord:
    """``record`` as a declared op serves it: its ``arg_names`` the schema's, its axes the backend's among them
    where there is a CPU ``fallback``; ``record`` itself where it is so already (a record :func:`declare` made)."""
    if not isinstance(record, OpRecord):
        raise TypeError(f"record must be an OpRecord, got {type(record).__name__}")
    if record.torch_schema is None:
        raise RecordError("a declared op's record needs a torch_schema: the call's arguments and result")
    names = tuple(_signature(record.torch_schema).parameters)
    axes = _with_backend(record.axes) if fallback else record.axes
    if record.arg_names == names and tuple(axes) == record.axes:
        return record
    return attrs.evolve(record, arg_names=names, axes=axes)


@attrs.frozen(kw_only=True)
class Declaration:
    """What an op is, in one place: its :class:`OpRecord` and the functions its hooks are derived from.
    :func:`declare` makes the plugin object of it.

    ``record``: the op's description, the one object its tuner and its search settings are read from
    (:meth:`Autotuner.from_record <flyreg.Autotuner.from_record>`); :func:`declare` makes it of the
    keywords in :data:`RECORD_KEYWORDS`, checked once. Its ``torch_schema`` is the call, as a torch schema
    without the op's name (``"(Tensor x, float eps=1e-06) -> Tensor"``): the argument names (its
    ``arg_names``) and defaults, and ``torch.ops.flyreg.<op>`` through :mod:`flyreg.torch`. With a ``cpu``
    fallback its axes hold a ``backend`` axis.
    ``key(*args)``: the spec of a call, from its arguments (defaults filled in); a ``torch.dtype``
    value stands for its name.
    ``bind(*args, **knobs, **hints)``: the launcher of calls shaped like ``args`` (all of them,
    defaults filled in), compiled once; it is called with a call's own arguments (its keywords too,
    where the launcher takes them; else all of them by position). Hints it does not take are left out.
    ``configs`` and ``default``: the space and heuristic config, each a value or a function of the spec (a
    ``default`` with a ``device`` parameter also gets the :class:`~flyreg.plugin.Device`, as the hook does).
    ``cpu(*args, **knobs)``: a plain torch implementation run on the CPU, with its own ``cpu_configs``
    and ``cpu_default`` (default: the first of them); it is the ``reference`` unless one is given.
    ``workloads``: the specs ``flyreg tune`` tunes, by device type (``{"cuda": [...], "cpu": [...]}``) or a
    function of the device, without the backend. ``make_inputs(spec, device)``: a call's arguments (with a
    ``seed`` keyword where the op's time depends on their values: each seed a draw of its own).
    ``reference(*args)``: the plain result. ``work(spec)``: a :class:`~flyreg.plugin.Work`.
    ``name`` names the op in the errors of its hooks.
    """

    record: OpRecord
    key: Callable[..., Mapping[str, Any]]
    bind: Callable[..., Callable[..., Any]]
    configs: Space
    default: Default
    cpu: Callable[..., Any] | None = None
    cpu_configs: Space = (Config(),)
    cpu_default: Default | None = None
    workloads: Mapping[str, Sequence[Mapping[str, Any]]] | Callable[[str], Sequence[Mapping[str, Any]]] | None = None
    make_inputs: Callable[..., Sequence[Any]] | None = None
    reference: Callable[..., Any] | None = None
    work: Callable[[Spec], Work | None] | None = None
    name: str = ""

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "record", _complete(self.record, self.cpu is not None))

    @property
    def schema(self) -> str:
        """The call's torch schema (the record's ``torch_schema``)."""
        return self.record.torch_schema  # type: ignore[return-value]

    @classmethod
    def of(cls, **fields: Any) -> Declaration:
        """The declaration of these fields: a ``record``, or the record's fields by keyword
        (:data:`RECORD_KEYWORDS`), of which the record is made and checked once, and the rest."""
        missing = [f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING and f.name != "record"
                   and f.name not in fields]
        if missing:  # told before the record is made, as a call missing an argument is
            raise TypeError(f"a declaration needs {missing}")
        given = {k: fields.pop(k) for k in RECORD_KEYWORDS if k in fields}
        if "record" in fields:
            if given:
                raise TypeError(f"give the op's record or its fields {sorted(given)}, not both")
            return cls(**fields)
        if "schema" not in given:
            raise TypeError("a declaration needs the call's schema (schema=...) or a record (record=...)")
        schema, axes = given.pop("schema"), given.pop("axes", ())
        if fields.get("cpu") is not None:
            axes = _with_backend(axes)
        record = OpRecord(torch_schema=schema, arg_names=tuple(_signature(schema).parameters), axes=axes, **given)
        return cls(record=record, **fields)


class DeclaredOp:
    """The plugin object of a :class:`Declaration` (``.declaration``): the four required hooks and
    ``describe``, derived from it, and each optional hook it declares."""

    def __init__(self, declaration: Declaration) -> None:
        d = self.declaration = declaration
        self.name = d.name
        self._sig = _signature(d.schema)
        self._takes = _takes(d.bind)
        cpu_default = d.cpu_default if d.cpu_default is not None else (lambda s: _space(d.cpu_configs)(s)[0])
        self._spaces = {"triton": (_space(d.configs), _pick(d.default)),
                        "cpu": (_space(d.cpu_configs), _pick(cpu_default))}
        # Optional hooks exist only where declared: pluggy then sees the op implement exactly those.
        if d.workloads is not None:
            self.workloads = hookimpl(lambda device: self._workloads(device))
        if d.make_inputs is not None and _takes(d.make_inputs)("seed"):  # its draws differ: a search times several
            self.make_inputs = hookimpl(lambda spec, device, seed: (_call_args(d.make_inputs(spec, device, seed=seed)),
                                                                    {}))
        elif d.make_inputs is not None:
            self.make_inputs = hookimpl(lambda spec, device: (_call_args(d.make_inputs(spec, device)), {}))
        if d.reference is not None or d.cpu is not None:
            self.reference = hookimpl(lambda args, kwargs: self._reference(args, kwargs))
        if d.work is not None:
            self.work = hookimpl(lambda spec: d.work(spec))

    def __repr__(self) -> str:
        return f"<declared op {self.name}: {self.declaration.schema}>"

    # -- the call ------------------------------------------------------------------------------------------

    def call_args(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        """The call's arguments, positional, defaults filled in; a TypeError naming the op and its signature."""
        try:
            bound = self._sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.name or 'the call '}{self._sig}: {e}") from None
        bound.apply_defaults()
        return tuple(bound.arguments.values())

    def spec_of(self, args: tuple[Any, ...]) -> Spec:
        """The spec of a call's (positional, complete) arguments, its backend included."""
        spec = {k: _spec_value(v) for k, v in self.declaration.key(*args).items()}
        if self.declaration.cpu is not None:
            spec["backend"] = backend_on(_device_type(args))
        return spec

    def _backend(self, spec: Mapping[str, Any]) -> str:
        """The backend of ``spec``; a ValueError naming the axes a spec handed to a hook lacks."""
        names = [a.name for a in self.declaration.record.axes]
        missing = [a for a in names if a not in spec]
        if missing:
            raise ValueError(f"{self.name or 'the'} spec {dict(spec)} lacks axes {missing}; it needs {names}")
        if self.declaration.cpu is None:
            return "triton"
        if spec.get("backend") not in BACKEND.values:
            raise ValueError(f"{self.name or 'the'} spec 'backend' must be 'triton' or 'cpu', "
                             f"got {spec.get('backend')!r}")
        return str(spec["backend"])

    def _bound(self, knobs: Mapping[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
        names = self._sig.parameters
        hints = {k: v for k, v in kwargs.items() if k not in names and self._takes(k)}
        full = self.call_args(args, {k: v for k, v in kwargs.items() if k in names})
        run = self.declaration.bind(*full, **knobs, **hints)
        passed = [k for k in kwargs if k in names]
        if not passed or all(_takes(run)(k) for k in passed):
            return run  # the call reaches the launcher as it is
        return lambda *a, **kw: run(*self.call_args(a, kw))

    # -- the hooks -----------------------------------------------------------------------------------------

    @hookimpl
    def specialize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Spec:
        return self.spec_of(self.call_args(args, kwargs))

    @hookimpl
    def build(self, config: Config, spec: Spec) -> Launch | Callable[..., Any]:
        knobs = config.kwargs
        if self._backend(spec) == "cpu":
            return functools.partial(self.declaration.cpu, **knobs)  # type: ignore[arg-type]

        def launch(*args: Any, **kwargs: Any) -> Any:
            call = {k: v for k, v in kwargs.items() if k in self._sig.parameters}
            return self._bound(knobs, args, kwargs)(*self.call_args(args, call))

        return Launch(launch, lambda args, kwargs: self._bound(knobs, args, kwargs))

    @hookimpl
    def configs(self, spec: Spec) -> list[Config]:
        return self._spaces[self._backend(spec)][0](spec)

    @hookimpl
    def default(self, spec: Spec, device: Device | None = None) -> Config:
        return self._spaces[self._backend(spec)][1](spec, device)

    @hookimpl
    def describe(self) -> OpRecord:
        return self.declaration.record

    def _workloads(self, device: str) -> list[Spec]:
        declared = self.declaration.workloads
        kind = "cuda" if device.startswith("cuda") else "cpu"
        specs = declared(device) if callable(declared) else declared.get(kind, ())  # type: ignore[union-attr]
        extra = {"backend": backend_on(kind)} if self.declaration.cpu is not None else {}
        return [{**spec, **extra} for spec in specs]

    def _reference(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        full = self.call_args(args, kwargs)
        d = self.declaration
        if d.reference is not None:
            return d.reference(*full)
        spec = {**self.spec_of(full), "backend": "cpu"}
        return d.cpu(*full, **self._spaces["cpu"][1](spec, None).kwargs)  # type: ignore[misc]


def declare(**fields: Any) -> DeclaredOp:
    """The plugin object of the op these fields declare (:meth:`Declaration.of`); name it in an entry point."""
    return DeclaredOp(Declaration.of(**fields))
