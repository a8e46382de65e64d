"""Config: a frozen, hashable record of knobs and hints with an exact JSON round trip."""

from __future__ import annotations

import json
import math

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flyreg import Config

NAMES = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=12)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**62), max_value=2**62),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
HINT_NAMES = NAMES.filter(lambda n: n not in ("kwargs", "pre_hook"))


def typed_json(value: object) -> object:
    """``value`` with every scalar tagged by its type, so 1, 1.0 and True compare differently."""
    if isinstance(value, dict):
        return {k: typed_json(v) for k, v in value.items()}
    return (type(value).__name__, value)


def test_knobs_and_hints_are_read_back() -> None:
    c = Config({"BLOCK_N": 1024, "EVEN": True}, num_warps=8, num_stages=3, maxnreg=128, waves_per_eu=2)
    assert c.kwargs == {"BLOCK_N": 1024, "EVEN": True}
    assert c.hints == {"num_warps": 8, "num_stages": 3, "maxnreg": 128, "waves_per_eu": 2}
    assert c.all_kwargs() == {**c.kwargs, **c.hints}
    assert Config({"BLOCK_N": 1024}).hints == {}  # unset hints are left out, not None


def test_kwargs_is_a_copy() -> None:
    c = Config({"BLOCK_N": 1024}, num_warps=8)
    c.kwargs["BLOCK_N"] = 1
    c.hints["num_warps"] = 1
    assert c.kwargs == {"BLOCK_N": 1024}
    assert c.hints == {"num_warps": 8}


def test_frozen() -> None:
    c = Config({"BLOCK_N": 1024}, num_warps=8)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        c.knobs = ()  # type: ignore[misc]


def test_hashable_and_equal_by_value() -> None:
    a = Config({"BLOCK_N": 1024, "X": 1}, num_warps=8)
    b = Config({"X": 1, "BLOCK_N": 1024}, num_warps=8)  # knob order does not matter
    assert a == b and hash(a) == hash(b)
    assert len({a, b, Config({"BLOCK_N": 1024, "X": 1}, num_warps=4)}) == 2
    assert a != Config({"BLOCK_N": 512, "X": 1}, num_warps=8)
    assert a != Config({"BLOCK_N": 1024, "X": 1}, num_warps=8, num_stages=2)


def test_json_types_stay_distinct() -> None:
    configs = [Config({"A": 1}), Config({"A": 1.0}), Config({"A": True})]
    assert len(set(configs)) == 3
    assert len({json.dumps(c.to_json()) for c in configs}) == 3
    for c in configs:
        back = Config.from_json(json.loads(json.dumps(c.to_json())))
        assert [other == back for other in configs] == [other is c for other in configs]


def test_pre_hook_is_never_persisted() -> None:
    calls: list[dict[str, object]] = []
    hooked = Config({"BLOCK_N": 1024}, num_warps=8, pre_hook=calls.append)
    plain = Config({"BLOCK_N": 1024}, num_warps=8)
    assert hooked == plain and hash(hooked) == hash(plain)
    text = json.dumps(hooked.to_json())
    assert "pre_hook" not in text and "append" not in text
    back = Config.from_json(json.loads(text))
    assert back == hooked and back.pre_hook is None
    assert hooked.pre_hook == calls.append
    assert "pre_hook" not in repr(hooked)


def test_repr_reads_like_the_constructor() -> None:
    assert repr(Config({"BLOCK_N": 1024}, num_warps=8)) == "Config(BLOCK_N=1024, num_warps=8)"
    assert repr(Config({"MODE": "fast", "X": None})) == "Config(MODE='fast', X=None)"
    assert repr(Config()) == "Config()"


@settings(max_examples=200, deadline=None)
@given(knobs=st.dictionaries(NAMES, SCALARS, max_size=6), hints=st.dictionaries(HINT_NAMES, SCALARS, max_size=4))
def test_json_round_trip_is_exact(knobs: dict[str, object], hints: dict[str, object]) -> None:
    hints = {k: v for k, v in hints.items() if k not in knobs}
    c = Config(knobs, **hints)
    text = json.dumps(c.to_json())
    back = Config.from_json(json.loads(text))
    assert back == c and hash(back) == hash(c)
    assert repr(back) == repr(c)
    assert json.dumps(back.to_json()) == text
    assert typed_json(back.kwargs) == typed_json(knobs)
    assert typed_json(back.hints) == typed_json({k: v for k, v in hints.items() if v is not None})


@pytest.mark.parametrize("bad", [[1, 2], (1, 2), {"a": 1}, {1, 2}, object(), torch.tensor(1), b"bytes"])
def test_non_scalar_knob_is_a_clear_error(bad: object) -> None:
    with pytest.raises(TypeError, match=r"BLOCK_N.*JSON scalar"):
        Config({"BLOCK_N": bad})
    with pytest.raises(TypeError, match=r"num_warps.*JSON scalar"):
        Config({"BLOCK_N": 1}, num_warps=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_knob_is_an_error(bad: float) -> None:
    with pytest.raises(ValueError, match="BLOCK_N.*finite"):
        Config({"BLOCK_N": bad})


def test_other_construction_errors() -> None:
    with pytest.raises(ValueError, match="num_warps"):
        Config({"num_warps": 4}, num_warps=8)
    with pytest.raises(TypeError, match="names"):
        Config({1: 2})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="names"):
        Config({"": 2})
    with pytest.raises(TypeError, match="mapping"):
        Config([("BLOCK_N", 1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pre_hook"):
        Config({"BLOCK_N": 1}, pre_hook=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("data, error", [
    ([1], TypeError),
    ({"kwargs": {"A": 1}, "extra": 1}, ValueError),
    ({"kwargs": [1]}, TypeError),
    ({"kwargs": {"A": [1]}}, TypeError),
    ({"hints": {"num_warps": {"x": 1}}}, TypeError),
    ({"hints": {"kwargs": 1}}, ValueError),
    ({"hints": {"pre_hook": 1}}, ValueError),
    ({"kwargs": {"num_warps": 1}, "hints": {"num_warps": 2}}, ValueError),
])
def test_from_json_rejects_malformed(data: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        Config.from_json(data)


def test_structural_selects_knobs() -> None:
    c = Config({"BLOCK": 64, "UNROLL": 2}, num_warps=4)
    assert dict(c.structural(None)) == c.kwargs
    assert dict(c.structural(("BLOCK",))) == {"BLOCK": 64}
    assert c.structural(("num_warps",)) == ()  # hints are never structural
