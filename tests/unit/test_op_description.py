"""One object describes an op: a declared op holds one record, made and checked once, and its registered
tuner and search settings are read from that very record; a field is checked in one place, whoever gives it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
import torch

import flyreg
from flyreg.plugin import Axis, Config, Declaration, DeclaredOp, OpRecord, RecordError, declare

OP = "described_rows"


def bind_rows(x: torch.Tensor, out: torch.Tensor, *, ROWS: int, num_warps: int | None = None) -> Callable[..., Any]:
    def run(x: torch.Tensor, out: torch.Tensor) -> None:
        for i in range(0, x.shape[0], ROWS):
            torch.mul(x[i:i + ROWS], 2, out=out[i:i + ROWS])

    return run


def declaration_fields() -> dict[str, Any]:
    """A declaration giving every field the record, the tuner and the search share a non-default value."""
    return dict(
        schema="(Tensor x, Tensor out) -> ()", name=OP, key=lambda x, out: {"M": x.shape[0]},
        axes=[Axis("M", int, ordered=True, buckets=(1, 16, 256))], bind=bind_rows,
        configs=[Config({"ROWS": r}) for r in (1, 4)], default=Config({"ROWS": 4}),
        reference=lambda x, out: out.copy_(x * 2),
        description="out = 2 x", version="7", structural=["ROWS"], restore_value=["x"], reset_to_zero=["out"],
        config_dir="/nowhere/configs", key_env=["DESCRIBED_ROWS_MODE"], timing="flushed", strategy="local")


@pytest.fixture
def registered() -> Iterator[DeclaredOp]:
    op = declare(**declaration_fields())
    flyreg.register(op, name=OP)
    try:
        yield op
    finally:
        flyreg.unregister(OP)


def test_a_declaration_holds_one_record_and_none_of_its_fields() -> None:
    op = declare(**declaration_fields())
    record = op.declaration.record
    assert op.describe() is record  # the hook returns the declaration's own record, not a copy
    # No field of the record is repeated on the declaration: the record is its one description.
    assert not set(attrs.fields_dict(Declaration)) & set(attrs.fields_dict(OpRecord))
    fields = declaration_fields()
    for field in ("description", "version", "key_env", "restore_value", "reset_to_zero", "structural",
                  "timing", "strategy"):
        declared = fields[field]
        assert getattr(record, field) == (tuple(declared) if isinstance(declared, list) else declared), field
    assert record.torch_schema == op.declaration.schema == fields["schema"]
    assert str(record.config_dir) == fields["config_dir"] and record.arg_names == ("x", "out")
    assert record.ordered_axes == ("M",)


def test_the_tuner_and_the_search_settings_are_read_from_that_record(registered: DeclaredOp) -> None:
    record = registered.declaration.record
    tuner = flyreg.op(OP)
    assert tuner.record is record  # the very object the registry built the tuner from
    settings = tuner.settings
    assert tuner.version == record.version and tuner.key_env == record.key_env
    assert tuner.structural == record.structural and tuner.arg_names == record.arg_names
    assert tuner.offline.ordered_axes == record.ordered_axes == ("M",)
    assert tuner.offline.plugin_dirs == [record.config_dir] and tuner.offline.op_version == record.version
    for field in ("arg_names", "restore_value", "reset_to_zero", "timing", "strategy"):
        assert getattr(settings, field) == getattr(record, field), field
    assert settings.reference is not None
    assert attrs.evolve(settings, reference=None) == type(settings).from_record(OP, record)
    # A tuner built by hand from the same record is described alike, and keeps the record too.
    by_hand = flyreg.Autotuner.from_record("by_hand", record, registered.build, lambda x, out: {"M": x.shape[0]},
                                           registered.configs, registered.default)
    assert by_hand.record is record
    assert attrs.evolve(by_hand.settings, op=OP) == attrs.evolve(settings, reference=None)
    assert (by_hand.version, by_hand.key_env, by_hand.structural, by_hand.arg_names) == \
        (tuner.version, tuner.key_env, tuner.structural, tuner.arg_names)


def test_a_record_given_whole_is_the_one_the_op_serves(registered: DeclaredOp) -> None:
    record = registered.declaration.record
    fields = {k: v for k, v in declaration_fields().items() if k not in {"schema", "axes", "description", "version",
              "structural", "restore_value", "reset_to_zero", "config_dir", "key_env", "timing", "strategy"}}
    again = declare(record=record, **fields)
    assert again.describe() is record and again.specialize((torch.ones(3, 2), torch.ones(3, 2)), {}) == {"M": 3}
    with pytest.raises(TypeError, match=r"give the op's record or its fields \['version'\], not both"):
        declare(record=record, version="8", **fields)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("timing", "fastest", r"timing must be one of \['steady', 'flushed', 'graph'\], got 'fastest'"),
    ("strategy", "greedy", r"strategy must be one of \['exhaustive', 'local'\] \(or None: flyreg chooses\), "
                           r"got 'greedy'"),
    ("key_env", "MODE", r"key_env must be a list of names, got the string 'MODE' \(write \['MODE'\] for one name\)"),
    ("reset_to_zero", ["y"], r"reset_to_zero names arguments \['y'\] that are not in arg_names \['x', 'out'\]"),
])
def test_a_bad_field_is_rejected_once_by_the_one_check_of_it(field: str, value: Any, message: str) -> None:
    fields = {**declaration_fields(), field: value}
    # Rejected when the op is declared, before anything registers it, naming the field and what was expected.
    with pytest.raises(RecordError, match=f"^{message}") as declared:
        declare(**fields)
    # A tuner made by hand gets the very same check, its message only led by the op's name.
    by_hand = {"arg_names": ["x", "out"], "restore_value": ["x"], "reset_to_zero": ["out"], field: value}
    with pytest.raises((TypeError, ValueError)) as settings:
        flyreg.Autotuner("by_hand", bind_rows, lambda x, out: {}, [Config({"ROWS": 1})], **by_hand)
    assert str(settings.value) == f"by_hand: {declared.value}"
