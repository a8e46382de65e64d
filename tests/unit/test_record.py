"""The op record: its validation, the check of every spec against the declared axes, and hook errors naming op.hook.

The op here, ``Doubling``, computes ``out = 2 x`` ``ROWS`` rows per step on the CPU. It declares its
axes: ``M`` (the row count, ordered, rounded up to 1, 16 or 256), ``N``, ``dtype`` (two allowed
values) and ``place`` (filled from the device). Its ``specialize`` returns the raw row count and no
``place``: the record buckets and fills them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg import Config, check_artifacts, hookimpl
from flyreg.plugin import Axis, HookError, OpRecord, PluginError, RecordError, SpecError

from on_disk import write_artifact

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
def reg() -> Iterator[Callable[..., None]]:
    """``register(plugin, name)``: registered in this process until the test ends."""
    names: list[str] = []

    def register(plugin: object, name: str) -> None:
        flyreg.register(plugin, name=name)
        names.append(name)

    yield register
    for name in names:
        flyreg.unregister(name)


def ours(*names: str) -> list[str]:
    return [i.name for i in flyreg.ops() if i.name in names]


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
    ({"name": "d", "type": str, "low": 1}, "Axis 'd': only an int or float axis has a range"),
    ({"name": "M", "type": int, "low": 0.5}, "Axis 'M': low must be of its type: 0.5 is not of type int"),
    ({"name": "M", "type": int, "low": 8, "high": 4}, "Axis 'M': low 8 is above high 4"),
])
def test_a_malformed_axis_is_a_record_error_naming_it(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(RecordError, match=f"^{message}"):
        Axis(**kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"structural": "ROWS"}, "structural must be a list of names, got the string 'ROWS'"),
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


def test_a_bad_record_or_a_failing_describe_makes_the_op_broken() -> None:
    with pytest.raises(PluginError, match=r"^op 'bad': describe\(\): timing must be one of"):
        flyreg.register(Doubling(record={"timing": "fastest"}), name="bad")

    class Failing(Doubling):
        @hookimpl
        def describe(self) -> Any:
            return OpRecord(axes=[Axis("place", str, ordered=True)])

    with pytest.raises(PluginError, match=r"^op 'failing': describe\(\): Axis 'place': only an int or float axis"):
        flyreg.register(Failing(), name="failing")
    assert ours("bad", "failing") == []


# -- one check of every spec ----------------------------------------------------------------------------
# Each spec is checked the way it enters flyreg: ``resolve_spec`` (a spec for a device), an artifact's (a stored
# spec), ``flyreg show`` (a spec that stands for every bucket of an axis it leaves out).

def test_every_offending_axis_is_named_in_one_error_with_the_allowed_ones(reg: Callable[..., None]) -> None:
    reg(Doubling(), "doubling")
    spec = {"M": "many", "N": 8.5, "dtyp": "float32", "place": "moon"}
    with pytest.raises(SpecError) as caught:
        flyreg.resolve_spec("doubling", spec, "cpu")
    assert str(caught.value) == (
        f"doubling: spec {spec} does not fit the op's axes: missing dtype; unknown axis dtyp (did you mean dtype?); "
        f"M: 'many' is not of type int; N: 8.5 is not of type int; place: moon is not one of host|gpu. {ALLOWED}")


#: A process with a fake CUDA device that prints the spec a resolution of SPEC (JSON) on "cuda" gets from the
#: op ``doubling`` of this module's record.
ON_CUDA = """
import json, sys, types
import torch
import flyreg
from test_record import Doubling

torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.current_device = lambda: 0
torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0)
torch.version.hip = None
flyreg.register(Doubling(), name="doubling")
print(json.dumps(flyreg.resolve_spec("doubling", json.loads(sys.argv[1]), "cuda").spec))
"""


def test_a_spec_is_typed_bucketed_and_filled_from_the_device(reg: Callable[..., None], fresh_process: Any) -> None:
    reg(Doubling(), "doubling")
    spec = {"M": 20.0, "N": 8, "dtype": "bfloat16"}
    assert flyreg.resolve_spec("doubling", spec, "cpu").spec == {"M": 256, "N": 8, "dtype": "bfloat16", "place": "host"}
    argv = [json.dumps(spec)]
    on_cuda = fresh_process.run(f"import sys\nsys.argv[1:] = {argv!r}\n" + ON_CUDA, path=[Path(__file__).parent])
    assert on_cuda.one()["place"] == "gpu"
    assert flyreg.resolve_spec("doubling", {**spec, "M": 10**6, "place": "gpu"}, "cpu").spec["M"] == 256  # the largest
    reg(Doubling(OpRecord(axes=[Axis("alpha", float), Axis("flag", bool)])), "f")
    assert flyreg.resolve_spec("f", {"alpha": 2, "flag": True}, "cpu").spec == {"alpha": 2.0, "flag": True}
    with pytest.raises(SpecError, match=r"flag: 1 is not of type bool"):
        flyreg.resolve_spec("f", {"alpha": 2, "flag": 1}, "cpu")
    with pytest.raises(SpecError, match=r"alpha: True is not of type float"):
        flyreg.resolve_spec("f", {"alpha": True, "flag": False}, "cpu")


def test_a_value_outside_an_axis_range_is_refused_not_bucketed(reg: Callable[..., None]) -> None:
    ranged = (Axis("M", int, ordered=True, buckets=(1, 16, 256), low=0), Axis("alpha", float, low=-1, high=1))
    reg(Doubling(OpRecord(axes=ranged)), "ranged")
    assert flyreg.resolve_spec("ranged", {"M": 0, "alpha": -1}, "cpu").spec == {"M": 1, "alpha": -1.0}  # the edges
    assert flyreg.resolve_spec("ranged", {"M": 10**6, "alpha": 1}, "cpu").spec["M"] == 256  # above the buckets: the largest
    with pytest.raises(SpecError, match=r"M: -5 is out of its range >= 0; alpha: 1\.5 is out of its range -1\.0\.\.1\.0\. "
                                        r"Axes: M \(int, ordered, >= 0, buckets 1\|16\|256\); alpha \(float, -1\.0\.\.1\.0\)"):
        flyreg.resolve_spec("ranged", {"M": -5, "alpha": 1.5}, "cpu")


def test_a_stored_spec_must_be_complete_and_normalized(reg: Callable[..., None], isolated_dirs: dict[str, Path]) -> None:
    reg(Doubling(), "doubling")
    reg(Doubling(OpRecord(axes=[Axis("alpha", float)])), "f")
    configs = isolated_dirs["configs"]
    stored = {"M": 16, "N": 8, "dtype": "float32", "place": "host"}
    good = write_artifact(configs, "doubling", stored, Config({"ROWS": 1}), op_version="1")
    bad = write_artifact(configs, "doubling", {"M": 20, "N": 8, "dtype": "float32"}, Config({"ROWS": 1}), op_version="1")
    as_json_keeps_it = write_artifact(configs, "f", {"alpha": 2}, Config({"ROWS": 1}))
    problems = flyreg.check_artifacts([configs], {"doubling": "1", "f": "0"}, accepts=flyreg.accepts)
    assert [(p.path, p.severity) for p in problems] == [(bad, "error")]
    assert re.search(r"missing place; M: 20 is not normalized \(the op makes it 256\)", problems[0].message)
    assert flyreg.resolve_spec("doubling", stored).path == str(good)
    assert flyreg.resolve_spec("f", {"alpha": 2.0}).path == str(as_json_keeps_it)


def test_an_op_that_declares_no_axes_gets_its_spec_back_unchecked(reg: Callable[..., None]) -> None:
    reg(Doubling(OpRecord(ordered_axes=["M"])), "legacy")
    spec = {"dtyp": "float32", "anything": 1}
    assert flyreg.resolve_spec("legacy", spec, "cpu").spec == spec


def test_show_stands_for_every_bucket_of_a_left_out_axis(reg: Callable[..., None],
                                                         flyreg_cli: Callable[..., Any]) -> None:
    reg(Doubling(), "doubling")
    rows = flyreg_cli("show", "doubling", "--spec", "N=8,dtype=float32", "--device", "cpu", "--json")
    assert rows.code == 0, rows.err
    assert [r["spec"] for r in json.loads(rows.out)] == [{"M": m, "N": 8, "dtype": "float32", "place": "host"}
                                                          for m in (1, 16, 256)]
    missing = flyreg_cli("show", "doubling", "--spec", "dtype=float32", "--device", "cpu")  # N: no values to stand for
    assert missing.code != 0 and "does not fit the op's axes: missing N." in missing.err
    listed = OpRecord(axes=[Axis("M", int, values=(1, 64), buckets=lambda m: 1 if m <= 1 else 64), Axis("k", str)])
    reg(Doubling(listed), "rows")
    rows = flyreg_cli("show", "rows", "--spec", "k=a", "--device", "cpu", "--json")
    assert [r["spec"] for r in json.loads(rows.out)] == [{"M": 1, "k": "a"}, {"M": 64, "k": "a"}]
    assert flyreg.resolve_spec("rows", {"M": 7, "k": "a"}, "cpu").spec == {"M": 64, "k": "a"}


# -- through the registry: calls, resolve_spec, artifacts ---------------------------------------------------
def test_a_call_gets_its_spec_bucketed_and_filled(reg: Callable[..., None]) -> None:
    reg(Doubling(), "doubling")
    x = torch.randn(10, 8)
    out = torch.empty_like(x)
    torch.testing.assert_close(flyreg.op("doubling")(x, out), 2 * x)
    assert flyreg.resolve("doubling", x, out).spec == {"M": 16, "N": 8, "dtype": "float32", "place": "host"}

    reg(Doubling(extra={"stride": 1}), "undeclared")
    with pytest.raises(SpecError, match=r"^undeclared: spec .* unknown axis stride"):
        flyreg.op("undeclared")(x, out)


def test_a_mistyped_axis_raises_instead_of_serving_the_default(reg: Callable[..., None]) -> None:
    typo = {"M": 16, "N": 8, "dtyp": "float32"}
    reg(Doubling(), "doubling")
    with pytest.raises(SpecError, match=r"missing dtype; unknown axis dtyp \(did you mean dtype\?\)") as caught:
        flyreg.resolve_spec("doubling", typo)
    assert ALLOWED in str(caught.value)
    # the same op with a legacy describe() dict declares no axes: the typo is served the default, as before
    reg(Doubling(record={"structural": ["ROWS"], "arg_names": ["x", "out"]}), "legacy")
    assert flyreg.resolve_spec("legacy", typo).source == "default"


def test_an_artifact_whose_spec_does_not_fit_is_never_served(reg: Callable[..., None], isolated_dirs: dict[str, Path],
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reg(Doubling(), "doubling")
    configs = isolated_dirs["configs"]
    want = {"M": 16, "N": 8, "dtype": "float32", "place": "host"}
    for m in (20, 2.5):  # not a bucket; not an int: either would be the nearest M to 16
        write_artifact(configs, "doubling", {**want, "M": m}, Config({"ROWS": 1}), op_version="1")
    with pytest.warns(flyreg.FlyregWarning) as warned:
        res = flyreg.resolve_spec("doubling", want)
    assert len(warned) == 2
    assert any(re.search(r"ignoring artifact .*M=20,.*M: 20 is not normalized", str(w.message)) for w in warned)
    assert any(re.search(r"ignoring artifact .*M=2\.5,.*M: 2\.5 is not of type int", str(w.message)) for w in warned)
    assert (res.source, res.config) == ("default", Config({"ROWS": 16}))

    again = tmp_path / "again"  # the same files and a good neighbour, in a directory not listed yet
    again.mkdir()
    for path in configs.iterdir():
        path.rename(again / path.name)
    write_artifact(again, "doubling", {**want, "M": 256}, Config({"ROWS": 1}), op_version="1")
    monkeypatch.setenv("FLYREG_CONFIG_DIR", str(again))
    flyreg.unregister("doubling")
    flyreg.register(Doubling(), name="doubling")
    res = flyreg.resolve_spec("doubling", want)
    assert (res.source, res.nearest, res.config) == ("offline-nearest", True, Config({"ROWS": 1}))

    problems = {p.path.name: p for p in check_artifacts([again], {"doubling": "1"}, accepts=flyreg.accepts)}
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
def test_a_hook_error_names_the_op_and_hook(reg: Callable[..., None], error: Exception, kind: type,
                                            message: str) -> None:
    reg(RaisingSpecialize(error), "raising")
    x = torch.randn(4, 8)
    with pytest.raises(kind, match=message) as caught:
        flyreg.op("raising")(x, torch.empty_like(x))
    assert caught.value.__cause__ is error
    assert isinstance(caught.value, PluginError) == (kind is HookError)  # bad input is no plugin error


def test_a_failing_describe_names_the_op_and_hook() -> None:
    class Failing(Doubling):
        @hookimpl
        def describe(self) -> Any:
            raise KeyError("version")

    with pytest.raises(PluginError, match=r"^failing\.describe raised KeyError: 'version'$"):
        flyreg.register(Failing(), name="failing")
    assert ours("failing") == []


def test_torch_schema_marks_in_place_arguments_and_needs_an_output_rule() -> None:
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
