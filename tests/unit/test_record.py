"""The op record: its validation, the check of every spec against the declared axes, and hook errors naming op.hook.

The op here, ``Doubling``, computes ``out = 2 x`` ``ROWS`` rows per step on the CPU. It declares its
axes: ``M`` (the row count, ordered, rounded up to 1, 16 or 256), ``N``, ``dtype`` (two allowed
values) and ``place`` (filled from the device). Its ``specialize`` returns the raw row count and no
``place``: the record buckets and fills them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg import Config, hookimpl
from flyreg._artifacts.store import emit_artifact
from flyreg._artifacts.validate import check_artifacts
from flyreg._core.keys import identity_of
from flyreg._plugins import registry
from flyreg._plugins.manager import HookError, OpPlugin, PluginError
from flyreg._plugins.record import check_spec, spec_rows
from flyreg._plugins.registry import Registry
from flyreg.plugin import Axis, OpRecord, RecordError, SpecError

AXES = (
    Axis("M", int, ordered=True, buckets=(1, 16, 256)),
    Axis("N", int),
    Axis("dtype", str, values=("float32", "bfloat16")),
    Axis("place", str, values=("host", "gpu"), device_default=lambda device: "gpu" if device == "cuda" else "host"),
)
RECORD = OpRecord(description="out = 2 x", version="1", structural=["ROWS"], arg_names=["x", "out"], axes=AXES)
ALLOWED = ("Axes: M (int, ordered, buckets 1|16|256); N (int); dtype (str, one of float32|bfloat16); "
           "place (str, one of host|gpu, default from the device)")


class Doubling:
    """out = 2 x, ROWS rows per step; ``describe`` returns ``record``, ``specialize`` adds ``extra`` axes."""

    def __init__(self, record: Any = RECORD, extra: dict[str, Any] | None = None) -> None:
        self.record = record
        self.extra = extra or {}

    @hookimpl
    def specialize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        x = args[0]
        return {"M": x.shape[0], "N": x.shape[1], "dtype": str(x.dtype).removeprefix("torch."), **self.extra}

    @hookimpl
    def build(self, config: Config, spec: dict[str, Any]) -> Any:
        rows = config.kwargs["ROWS"]

        def launch(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            for i in range(0, x.shape[0], rows):
                torch.mul(x[i:i + rows], 2, out=out[i:i + rows])
            return out

        return launch

    @hookimpl
    def configs(self, spec: dict[str, Any]) -> list[Config]:
        return [Config({"ROWS": r}) for r in (1, 16)]

    @hookimpl
    def default(self, spec: dict[str, Any]) -> Config:
        return Config({"ROWS": 16})

    @hookimpl
    def describe(self) -> Any:
        return self.record


@pytest.fixture
def reg(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """A fresh process-wide registry with nothing installed in it."""
    fresh = Registry(entry_points=lambda: [])
    monkeypatch.setattr(registry, "REGISTRY", fresh)
    yield fresh


# -- the record is checked when it is made --------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "", "type": int}, "Axis name must be a non-empty str"),
    ({"name": "M", "type": list}, "Axis 'M': type must be one of int, str, float, bool"),
    ({"name": "d", "type": str, "values": ("float32", 16)}, "Axis 'd': values must be of its type: 16 is not of type str"),
    ({"name": "d", "type": str, "values": ()}, "Axis 'd': values must be a non-empty tuple"),
    ({"name": "d", "type": str, "values": "float32"}, "Axis 'd': values must be a non-empty tuple"),
    ({"name": "d", "type": str, "ordered": True}, "Axis 'd': only an int or float axis can be ordered"),
    ({"name": "M", "type": int, "buckets": (16, 1)}, "Axis 'M': buckets must be a callable or a non-empty ascending"),
    ({"name": "M", "type": int, "buckets": (1, 2.5)}, "Axis 'M': buckets must be of its type: 2.5 is not of type int"),
    ({"name": "b", "type": str, "device_default": "cpu"}, "Axis 'b': device_default must be a callable"),
])
def test_a_malformed_axis_is_a_record_error_naming_it(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(RecordError, match=f"^{message}"):
        Axis(**kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"structural": "ROWS"}, "structural must be a list of names, got 'ROWS'"),
    ({"version": 1.5}, "version must be a string, got 1.5"),
    ({"timing": "fastest"}, r"timing must be one of \['steady', 'flushed', 'graph'\], got 'fastest'"),
    ({"axes": [("M", int)]}, r"axes must be a list of Axis"),
    ({"axes": [Axis("M", int), Axis("M", str)]}, r"axes declares \['M'\] more than once"),
    ({"axes": AXES, "ordered_axes": ["N"]}, r"ordered_axes \['N'\] is derived from the axes"),
    ({"reset_to_zero": ["out"]}, r"reset_to_zero names arguments \['out'\], but no arg_names are given"),
    ({"arg_names": ["x"], "restore_value": ["acc"]}, r"restore_value names arguments \['acc'\] that are not in arg_names"),
    ({"config_dir": 3}, "config_dir must be a path, got 3"),
])
def test_a_malformed_record_is_a_record_error_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(RecordError, match=f"^{message}"):
        OpRecord(**kwargs)


def test_ordered_axes_come_from_the_axes_flags_or_else_from_the_field() -> None:
    assert RECORD.ordered_axes == ("M",)
    assert OpRecord(axes=AXES, ordered_axes=["M"]).ordered_axes == ("M",)
    assert OpRecord(ordered_axes=["M", "N"]).ordered_axes == ("M", "N")  # an op declaring no axes


def test_a_legacy_describe_dict_becomes_the_same_record(tmp_path: Path) -> None:
    legacy = {"description": "d", "version": 2, "structural": ["ROWS"], "restore_value": ["x"], "reset_to_zero": [],
              "ordered_axes": ["M"], "config_dir": str(tmp_path), "key_env": ["K"], "arg_names": ["x", "out"],
              "timing": "flushed"}
    assert OpRecord.of(legacy) == OpRecord(description="d", version="2", structural=("ROWS",), restore_value=("x",),
                                           ordered_axes=("M",), config_dir=tmp_path, key_env=("K",),
                                           arg_names=("x", "out"), timing="flushed")
    assert OpRecord.of(None) == OpRecord() and OpRecord.of(RECORD) is RECORD
    with pytest.raises(RecordError, match=r"unknown keys \['axis'\]"):
        OpRecord.of({"axis": []})
    with pytest.raises(RecordError, match="must return an OpRecord .*, got list"):
        OpRecord.of([])


def test_a_bad_record_or_a_failing_describe_makes_the_op_broken(reg: Registry) -> None:
    with pytest.raises(PluginError, match=r"^op 'bad': describe\(\): timing must be one of"):
        flyreg.register(Doubling(record={"timing": "fastest"}), name="bad")

    class Failing(Doubling):
        @hookimpl
        def describe(self) -> Any:
            return OpRecord(axes=[Axis("place", str, ordered=True)])

    with pytest.raises(PluginError, match=r"^op 'failing': describe\(\): Axis 'place': only an int or float axis"):
        flyreg.register(Failing(), name="failing")
    assert flyreg.ops() == []


# -- one check of every spec ----------------------------------------------------------------------------
def test_every_offending_axis_is_named_in_one_error_with_the_allowed_ones() -> None:
    spec = {"M": "many", "N": 8.5, "dtyp": "float32", "place": "moon"}
    with pytest.raises(SpecError) as caught:
        check_spec("doubling", RECORD, spec, "cpu")
    assert str(caught.value) == (
        f"doubling: spec {spec} does not fit the op's axes: missing dtype; unknown axis dtyp (did you mean dtype?); "
        f"M: 'many' is not of type int; N: 8.5 is not of type int; place: moon is not one of host|gpu. {ALLOWED}")


def test_a_spec_is_typed_bucketed_and_filled_from_the_device() -> None:
    spec = {"M": 20.0, "N": 8, "dtype": "bfloat16"}
    assert check_spec("doubling", RECORD, spec, "cpu") == {"M": 256, "N": 8, "dtype": "bfloat16", "place": "host"}
    assert check_spec("doubling", RECORD, spec, "cuda")["place"] == "gpu"
    assert check_spec("doubling", RECORD, {**spec, "M": 10**6, "place": "gpu"}, "cpu")["M"] == 256  # the largest
    record = OpRecord(axes=[Axis("alpha", float), Axis("flag", bool)])
    assert check_spec("f", record, {"alpha": 2, "flag": True}, "cpu") == {"alpha": 2.0, "flag": True}
    with pytest.raises(SpecError, match=r"flag: 1 is not of type bool"):
        check_spec("f", record, {"alpha": 2, "flag": 1}, "cpu")
    with pytest.raises(SpecError, match=r"alpha: True is not of type float"):
        check_spec("f", record, {"alpha": True, "flag": False}, "cpu")


def test_a_stored_spec_must_be_complete_and_normalized() -> None:
    stored = {"M": 16, "N": 8, "dtype": "float32", "place": "host"}
    assert check_spec("doubling", RECORD, stored) == stored
    with pytest.raises(SpecError, match=r"missing place; M: 20 is not normalized \(the op makes it 256\)"):
        check_spec("doubling", RECORD, {"M": 20, "N": 8, "dtype": "float32"})
    assert check_spec("f", OpRecord(axes=[Axis("alpha", float)]), {"alpha": 2}) == {"alpha": 2.0}  # as JSON keeps it


def test_an_op_that_declares_no_axes_gets_its_spec_back_unchecked() -> None:
    spec = {"dtyp": "float32", "anything": [1]}
    assert check_spec("legacy", OpRecord(ordered_axes=["M"]), spec, "cpu") == spec


def test_spec_rows_stand_for_every_bucket_of_a_left_out_axis() -> None:
    assert spec_rows("doubling", RECORD, {"N": 8, "dtype": "float32"}, "cpu") == [
        {"M": m, "N": 8, "dtype": "float32", "place": "host"} for m in (1, 16, 256)]
    with pytest.raises(SpecError, match=r"^doubling: spec \{'dtype': 'float32'\} does not fit the op's axes: missing N\."):
        spec_rows("doubling", RECORD, {"dtype": "float32"}, "cpu")  # N has no finite values to stand for
    listed = OpRecord(axes=[Axis("M", int, values=(1, 64), buckets=lambda m: 1 if m <= 1 else 64)])
    assert spec_rows("rows", listed, {}, "cpu") == [{"M": 1}, {"M": 64}]
    assert check_spec("rows", listed, {"M": 7}, "cpu") == {"M": 64}


# -- through the registry: calls, resolve_spec, artifacts ---------------------------------------------------
def test_a_call_gets_its_spec_bucketed_and_filled(reg: Registry) -> None:
    flyreg.register(Doubling(), name="doubling")
    x = torch.randn(10, 8)
    out = torch.empty_like(x)
    torch.testing.assert_close(flyreg.op("doubling")(x, out), 2 * x)
    assert flyreg.resolve("doubling", x, out).spec == {"M": 16, "N": 8, "dtype": "float32", "place": "host"}

    flyreg.register(Doubling(extra={"stride": 1}), name="undeclared")
    with pytest.raises(SpecError, match=r"^undeclared: spec .* unknown axis stride"):
        flyreg.op("undeclared")(x, out)


def test_a_mistyped_axis_raises_instead_of_serving_the_default(reg: Registry) -> None:
    typo = {"M": 16, "N": 8, "dtyp": "float32"}
    flyreg.register(Doubling(), name="doubling")
    with pytest.raises(SpecError, match=r"missing dtype; unknown axis dtyp \(did you mean dtype\?\)") as caught:
        flyreg.resolve_spec("doubling", typo)
    assert ALLOWED in str(caught.value)
    # the same op with a legacy describe() dict declares no axes: the typo is served the default, as before
    flyreg.register(Doubling(record={"structural": ["ROWS"], "arg_names": ["x", "out"]}), name="legacy")
    assert flyreg.resolve_spec("legacy", typo).source == "default"


def test_an_artifact_whose_spec_does_not_fit_is_never_served(reg: Registry, isolated_dirs: dict[str, Path]) -> None:
    flyreg.register(Doubling(), name="doubling")
    here, configs = identity_of(None), isolated_dirs["configs"]
    want = {"M": 16, "N": 8, "dtype": "float32", "place": "host"}
    for m in (20, 2.5):  # not a bucket; not an int: either would be the nearest M to 16
        emit_artifact("doubling", {**want, "M": m}, here, Config({"ROWS": 1}), "1", 1.0, 2.0, configs)
    with pytest.warns(flyreg.FlyregWarning) as warned:
        res = flyreg.resolve_spec("doubling", want)
    assert len(warned) == 2
    assert any(re.search(r"ignoring artifact .*M=20,.*M: 20 is not normalized", str(w.message)) for w in warned)
    assert any(re.search(r"ignoring artifact .*M=2\.5,.*M: 2\.5 is not of type int", str(w.message)) for w in warned)
    assert (res.source, res.config) == ("default", Config({"ROWS": 16}))

    emit_artifact("doubling", {**want, "M": 256}, here, Config({"ROWS": 1}), "1", 1.0, 2.0, configs)
    flyreg.unregister("doubling")
    flyreg.register(Doubling(), name="doubling")
    res = flyreg.resolve_spec("doubling", want)
    assert (res.source, res.nearest, res.config) == ("offline", True, Config({"ROWS": 1}))

    problems = {p.path.name: p for p in check_artifacts([configs], {"doubling": "1"}, accepts=registry.accepts)}
    bad = [p for p in problems.values() if p.severity == "error"]
    assert len(problems) == len(bad) == 2
    assert any("M: 20 is not normalized (the op makes it 256)" in p.message for p in bad)
    assert any("M: 2.5 is not of type int" in p.message and p.message.endswith("lookup never serves this file")
               for p in bad)


# -- hook errors say whose they are ---------------------------------------------------------------------------
class RaisingSpecialize(Doubling):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    @hookimpl
    def specialize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        raise self.error


class ShapeError(ValueError):
    """A plugin's own ValueError subclass."""


class TwoArgError(ValueError):
    def __init__(self, what: str, got: int) -> None:
        super().__init__(f"{what}: got {got}")


@pytest.mark.parametrize(("error", "kind", "message"), [
    (KeyError("x"), HookError, r"^raising\.specialize raised KeyError: 'x'$"),
    (RuntimeError("no device"), HookError, r"^raising\.specialize raised RuntimeError: no device$"),
    (ShapeError("x and weight disagree"), ShapeError, r"^raising\.specialize: x and weight disagree$"),
    (TypeError("x must be a tensor"), TypeError, r"^raising\.specialize: x must be a tensor$"),
    (TwoArgError("rows", 3), ValueError, r"^raising\.specialize: rows: got 3$"),
])
def test_a_hook_error_names_the_op_and_hook(reg: Registry, error: Exception, kind: type, message: str) -> None:
    flyreg.register(RaisingSpecialize(error), name="raising")
    x = torch.randn(4, 8)
    with pytest.raises(kind, match=message) as caught:
        flyreg.op("raising")(x, torch.empty_like(x))
    assert caught.value.__cause__ is error
    assert isinstance(caught.value, PluginError) == (kind is HookError)  # bad input is no plugin error


def test_a_failing_describe_names_the_op_and_hook(reg: Registry) -> None:
    class Failing(Doubling):
        @hookimpl
        def describe(self) -> Any:
            raise KeyError("version")

    with pytest.raises(HookError, match=r"^failing\.describe raised KeyError: 'version'$"):
        OpPlugin("failing", Failing())
    with pytest.raises(PluginError, match=r"^failing\.describe raised KeyError: 'version'$"):
        flyreg.register(Failing(), name="failing")
    assert flyreg.ops() == []


def test_torch_schema_marks_in_place_arguments_and_needs_an_output_rule() -> None:
    from flyreg._plugins.record import OpRecord, RecordError

    rec = OpRecord(arg_names=["x", "residual", "w"], restore_value=["residual"],
                   torch_schema="(Tensor x, Tensor residual, Tensor w, float eps=1e-06) -> Tensor", output_like="x")
    schema = rec.schema()
    assert schema is not None
    assert schema.text("op") == "op(Tensor x, Tensor(a!) residual, Tensor w, float eps=1e-06) -> Tensor"
    kw = OpRecord(reset_to_zero=["out"], arg_names=["x", "out"], torch_schema="(Tensor x, Tensor out, *, int k=2) -> ()")
    assert kw.schema().text("acc") == "acc(Tensor x, Tensor(a!) out, *, int k=2) -> ()"  # type: ignore[union-attr]
    bad = {
        "give output_like": dict(torch_schema="(Tensor x) -> Tensor"),
        "must begin with arg_names": dict(arg_names=["y"], torch_schema="(Tensor x) -> Tensor", output_like="x"),
        "must name a Tensor argument": dict(torch_schema="(Tensor x, int n) -> Tensor", output_like="n"),
        "not '<type> <name>": dict(torch_schema="(Tensor) -> Tensor", output_like="x"),
        "is not '\\(<arguments>\\) -> <returns>'": dict(torch_schema="op(Tensor x)", output_like="x"),
        "restore_value and reset_to_zero do not name it": dict(torch_schema="(Tensor(a!) x) -> ()"),
        "must be a Tensor": dict(arg_names=["n"], restore_value=["n"], torch_schema="(int n) -> ()"),
        "no torch_schema is given": dict(output_like="x"),
        "not both": dict(torch_schema="(Tensor x) -> Tensor", output_like="x", torch_fake=lambda x: x),
    }
    for message, fields in bad.items():
        with pytest.raises(RecordError, match=message):
            OpRecord(**fields)
