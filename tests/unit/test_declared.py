"""A declared op (``flyreg.plugin.declare``): its hooks are derived from one declaration, the backend from the
device, and the registry serves and tunes it like a hand-written plugin."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg.plugin import Axis, Config, DeclaredOp, OpRecord, RecordError, Work, declare

BINDS: list[tuple[Any, ...]] = []


def bind_rows(x: torch.Tensor, s: torch.Tensor, bias: float = 0.0, *, ROWS: int,
              num_warps: int | None = None) -> Callable[..., torch.Tensor]:
    """A stand-in for a compiled kernel: out = x * s[:, None] + bias, ROWS rows a step; bound once a signature."""
    BINDS.append((tuple(x.shape), bias, ROWS, num_warps))

    def run(x: torch.Tensor, s: torch.Tensor, bias: float = bias) -> torch.Tensor:
        out = torch.empty_like(x)
        for i in range(0, x.shape[0], ROWS):
            torch.add(x[i:i + ROWS] * s[i:i + ROWS, None], bias, out=out[i:i + ROWS])
        return out

    return run


def scale_rows_cpu(x: torch.Tensor, s: torch.Tensor, bias: float = 0.0, *, STEP: int = 1) -> torch.Tensor:
    return x * s[:, None] + bias


def declared(**extra: Any) -> DeclaredOp:
    fields: dict[str, Any] = dict(
        schema="(Tensor x, Tensor s, float bias=0.0) -> Tensor", name="scale_rows",
        key=lambda x, s, bias: {"M": x.shape[0], "dtype": x.dtype},
        axes=[Axis("M", int, ordered=True, buckets=(1, 16, 256)), Axis("dtype", str)],
        bind=bind_rows, configs=lambda spec: [Config({"ROWS": r}, num_warps=4) for r in (1, 4, 16) if r <= spec["M"]],
        default=Config({"ROWS": 4}, num_warps=4), cpu=scale_rows_cpu,
        cpu_configs=[Config({"STEP": 1}), Config({"STEP": 2})], output_like="x", version="2")
    return declare(**{**fields, **extra})


@pytest.fixture
def registered(request: pytest.FixtureRequest) -> Iterator[str]:
    op = getattr(request, "param", None) or declared()
    flyreg.register(op, name="declared_rows")
    try:
        yield "declared_rows"
    finally:
        flyreg.unregister("declared_rows")


def test_the_record_and_the_spec_come_from_the_declaration() -> None:
    op = declared(description="rows scaled", restore_value=(), config_dir="/nowhere")
    record = op.describe()
    assert isinstance(record, OpRecord) and record.version == "2" and record.description == "rows scaled"
    assert record.arg_names == ("x", "s", "bias") and record.output_like == "x"
    assert [a.name for a in record.axes] == ["M", "backend", "dtype"]  # the backend axis added, in name order
    assert record.ordered_axes == ("M",) and str(record.config_dir) == "/nowhere"
    assert record.torch_schema == "(Tensor x, Tensor s, float bias=0.0) -> Tensor"
    x, s = torch.randn(20, 8, dtype=torch.bfloat16), torch.rand(20, dtype=torch.bfloat16)
    assert op.specialize((x, s), {}) == {"M": 20, "dtype": "bfloat16", "backend": "cpu"}
    assert op.specialize((x,), {"s": s, "bias": 1.0})["backend"] == "cpu"


def test_a_bad_call_or_spec_is_one_clear_error() -> None:
    op = declared()
    x, s = torch.randn(4, 8), torch.rand(4)
    with pytest.raises(TypeError, match=r"^scale_rows\(x, s, bias=0\.0\): too many positional arguments"):
        op.specialize((x, s, 1.0, 2), {})
    with pytest.raises(TypeError, match="missing a required argument: 's'"):
        op.specialize((x,), {})
    with pytest.raises(TypeError, match=r"^the call \(x, s, bias=0\.0\): too many positional arguments"):
        declared(name="").specialize((x, s, 1.0, 2), {})  # unnamed: the registry's error prefixes the op's name
    with pytest.raises(ValueError, match=r"^scale_rows spec .* lacks axes \['backend'\]"):
        op.default({"M": 16, "dtype": "float32"})
    with pytest.raises(ValueError, match="backend' must be 'triton' or 'cpu', got 'tpu'"):
        op.configs({"M": 16, "dtype": "float32", "backend": "tpu"})


def test_each_backend_has_its_own_space_and_build() -> None:
    op = declared()
    gpu, cpu = {"M": 16, "dtype": "float32", "backend": "triton"}, {"M": 16, "dtype": "float32", "backend": "cpu"}
    assert [c.kwargs["ROWS"] for c in op.configs(gpu)] == [1, 4, 16] and op.default(gpu) == Config({"ROWS": 4},
                                                                                                   num_warps=4)
    assert op.configs(cpu) == [Config({"STEP": 1}), Config({"STEP": 2})]
    assert op.default(cpu) == Config({"STEP": 1})  # the first CPU config, none declared
    x, s = torch.randn(10, 3), torch.rand(10)
    torch.testing.assert_close(op.build(Config({"STEP": 2}), cpu)(x, s, 0.5), x * s[:, None] + 0.5)
    BINDS.clear()
    launch = op.build(Config({"ROWS": 4}), gpu)
    run = launch.bind((x, s), {"num_warps": 8, "maxnreg": 64})  # a hint the bind does not take is left out
    assert BINDS == [((10, 3), 0.0, 4, 8)]
    torch.testing.assert_close(run(x, s), x * s[:, None])
    torch.testing.assert_close(launch(x, s, bias=2.0), x * s[:, None] + 2.0)


def test_only_the_declared_optional_hooks_are_implemented() -> None:
    bare = declare(schema="(Tensor x) -> Tensor", key=lambda x: {"N": x.numel()}, bind=lambda x, **k: lambda x: x,
                   configs=[Config({"B": 1})], default=Config({"B": 1}), output_like="x")
    assert not any(hasattr(bare, h) for h in ("workloads", "make_inputs", "reference", "work"))
    assert bare.describe().axes == ()  # no axes declared and no fallback: no backend axis either
    assert bare.specialize((torch.ones(3),), {}) == {"N": 3}
    full = declared(workloads={"cuda": [{"M": 256, "dtype": "bfloat16"}], "cpu": [{"M": 16, "dtype": "float32"}]},
                    make_inputs=lambda spec, device: (torch.randn(spec["M"], 4, device=device),
                                                      torch.rand(spec["M"], device=device)),
                    work=lambda spec: Work(bytes=8 * spec["M"]))
    assert full.workloads("cuda:0") == [{"M": 256, "dtype": "bfloat16", "backend": "triton"}]
    assert full.workloads("cpu") == [{"M": 16, "dtype": "float32", "backend": "cpu"}]
    args, kwargs = full.make_inputs({"M": 16, "dtype": "float32", "backend": "cpu"}, "cpu")
    assert [tuple(a.shape) for a in args] == [(16, 4), (16,)] and kwargs == {}
    assert full.work({"M": 16}) == Work(bytes=128)
    x, s = torch.randn(5, 4), torch.rand(5)
    torch.testing.assert_close(full.reference((x, s), {"bias": 1.0}), x * s[:, None] + 1.0)  # the CPU fallback


def test_a_make_inputs_that_takes_a_seed_gives_a_tuner_that_draws(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "cache"))
    seeds: list[int] = []

    def seeded(spec: dict[str, Any], device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        seeds.append(seed)
        g = torch.Generator().manual_seed(seed)
        return torch.randn(spec["M"], 4, generator=g, device=device), torch.rand(spec["M"], generator=g, device=device)

    spec = {"M": 16, "dtype": "float32", "backend": "cpu"}
    for name, make, drawn in (("drawn_rows", seeded, True),
                              ("plain_rows", lambda spec, device: seeded(spec, device), False)):
        flyreg.register(declared(make_inputs=make), name=name)
        try:
            tuner = flyreg.op(name)
            assert tuner.seeded_inputs is drawn and tuner.make_inputs is not None
            first, again, other = (tuner.make_inputs(spec, "cpu", seed=s)[0] for s in (0, 0, 1))
            assert all(torch.equal(a, b) for a, b in zip(first, again))
            assert any(not torch.equal(a, b) for a, b in zip(first, other)) is drawn  # a seed is its own draw
            tuner.tune(*first, emit=False)
        finally:
            flyreg.unregister(name)
    assert seeds == [0, 0, 1, 0, 0, 0]  # an op whose make_inputs takes no seed is never given one
    # The journal keeps times over draws apart from times over copies of one call: never ranked together.
    with sqlite3.connect(tmp_path / "cache" / "flyreg-journal.sqlite3") as db:
        rows = db.execute("SELECT op, toolchain FROM measurements").fetchall()
    inputs = {op: json.loads(toolchain).get("inputs") for op, toolchain in rows}
    assert inputs == {"drawn_rows": "draws", "plain_rows": None}


def test_a_make_inputs_returning_one_tensor_is_named_as_the_fault() -> None:
    op = declared(make_inputs=lambda spec, device: torch.randn(spec["M"], 4))  # not the call's (x, s)
    with pytest.raises(TypeError, match="make_inputs must return the call's arguments as a tuple, got Tensor"):
        op.make_inputs({"M": 16, "dtype": "float32", "backend": "cpu"}, "cpu")
    args, kwargs = declared(make_inputs=lambda spec, device: [torch.randn(2, 4), torch.rand(2)]).make_inputs(
        {"M": 2, "dtype": "float32", "backend": "cpu"}, "cpu")
    assert [a.shape for a in args] == [(2, 4), (2,)] and kwargs == {}


def test_registered_served_and_tuned_like_a_hand_written_plugin(registered: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "cache"))
    (info,) = [i for i in flyreg.ops() if i.name == registered]
    assert info.status == "ok"
    x, s = torch.randn(40, 8), torch.rand(40)
    torch.testing.assert_close(flyreg.op(registered)(x, s, 0.25), x * s[:, None] + 0.25)
    resolved = flyreg.resolve(registered, x, s)
    assert resolved.spec == {"M": 256, "backend": "cpu", "dtype": "float32"} and resolved.config == Config({"STEP": 1})
    report = flyreg.op(registered).tune(x, s, out_dir=tmp_path / "configs")
    assert not report.failed and report.winner in (Config({"STEP": 1}), Config({"STEP": 2}))
    (artifact,) = (tmp_path / "configs").glob(f"{registered},*.json")
    assert "backend=cpu" in artifact.name


def test_a_declaration_missing_a_field_fails_to_declare() -> None:
    with pytest.raises(TypeError, match="bind"):
        declare(schema="(Tensor x) -> Tensor", key=lambda x: {}, configs=[], default=Config())  # type: ignore[call-arg]
    with pytest.raises(RecordError, match="output_like"):  # the record is made, and checked, at once
        declare(schema="(Tensor x) -> Tensor", key=lambda x: {}, bind=lambda x: x, configs=[], default=Config(),
                output_like="y")


def test_every_hook_is_derived_from_a_full_declaration() -> None:
    import ast

    specs = ast.parse((Path(__file__).resolve().parents[2] / "flyreg" / "_plugins" / "hookspecs.py").read_text())
    lists = {t.id: node.value for node in specs.body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    required, optional = (ast.literal_eval(lists[n]) for n in ("REQUIRED_HOOKS", "OPTIONAL_HOOKS"))
    full = declared(workloads={"cpu": []}, make_inputs=lambda spec, device: (), work=lambda spec: None)
    for hook in (*required, *optional):
        assert hasattr(getattr(full, hook), "flyreg_impl"), hook


def test_every_field_is_described_in_the_plugin_guide() -> None:
    import attrs

    from flyreg.plugin import Declaration

    guide = (Path(__file__).resolve().parents[2] / "docs" / "plugin_authoring.md").read_text(encoding="utf-8")
    section = guide.split("## Declare a Triton op", 1)[1].split("\n## ", 1)[0]
    # The declaration's own fields, and the record's that a declaration gives by keyword (its schema is the
    # record's torch_schema; its arg_names and ordered_axes are derived).
    record = [f.name for f in attrs.fields(OpRecord) if f.name not in {"arg_names", "ordered_axes"}]
    names = [f.name for f in attrs.fields(Declaration)] + record + ["schema"]
    missing = [n for n in names if f"`{n}" not in section and f"{n}=" not in section]
    assert not missing, f"declaration fields the guide's section does not name: {missing}"
