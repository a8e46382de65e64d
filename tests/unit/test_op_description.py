"""One object describes an op: a declared op's record, its registered tuner and its search settings
agree field by field, each derived from the declaration."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
import torch

import flyreg
from flyreg.plugin import Axis, Config, DeclaredOp, declare

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


def test_the_record_the_tuner_and_the_search_settings_agree(registered: DeclaredOp) -> None:
    d = registered.declaration
    record = registered.describe()
    tuner = flyreg.op(OP)
    settings = tuner.settings
    # The record holds the declaration's own fields.
    for field in ("description", "version", "key_env", "restore_value", "reset_to_zero", "structural",
                  "timing", "strategy"):
        declared = getattr(d, field)
        assert getattr(record, field) == (tuple(declared) if isinstance(declared, list) else declared), field
    assert str(record.config_dir) == d.config_dir and record.arg_names == ("x", "out")
    # The tuner and its search settings are derived from that one record.
    assert tuner.version == record.version and tuner.key_env == record.key_env
    assert tuner.structural == record.structural and tuner.arg_names == record.arg_names
    assert tuner.offline.ordered_axes == record.ordered_axes == ("M",)
    assert tuner.offline.plugin_dirs == [record.config_dir] and tuner.offline.op_version == record.version
    for field in ("arg_names", "restore_value", "reset_to_zero", "timing", "strategy"):
        assert getattr(settings, field) == getattr(record, field), field
    assert settings.reference is not None
    assert attrs.evolve(settings, reference=None) == type(settings).from_record(OP, record)
    # A tuner built by hand from the same record is described alike.
    by_hand = flyreg.Autotuner.from_record("by_hand", record, registered.build, lambda x, out: {"M": x.shape[0]},
                                           registered.configs, registered.default)
    assert attrs.evolve(by_hand.settings, op=OP) == attrs.evolve(settings, reference=None)
    assert (by_hand.version, by_hand.key_env, by_hand.structural, by_hand.arg_names) == \
        (tuner.version, tuner.key_env, tuner.structural, tuner.arg_names)
