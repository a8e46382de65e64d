"""The correctness gate's comparison: per-dtype tolerances, shapes, NaNs, nested outputs.

Each case is one candidate of an op whose launch returns a prepared output and whose reference
returns a prepared result; ``Autotuner.time_config`` runs the gate on it as a search does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "autotune_guide.md"


def documented_tolerances() -> dict[torch.dtype, tuple[float, float]]:
    """The guide's table of (rtol, atol) by output dtype."""
    rows = re.findall(r"^\s*\| (\w+) \| ([0-9.e-]+) \| ([0-9.e-]+) \|$", GUIDE.read_text(encoding="utf-8"), re.M)
    return {getattr(torch, name): (float(rtol), float(atol)) for name, rtol, atol in rows}


TOLERANCES = documented_tolerances()


def mismatch(out: Any, ref: Any) -> str | None:
    """Why the gate rejects a candidate whose output is ``out`` when the reference gives ``ref``, or None."""
    def build(config: Config, spec: dict[str, Any]) -> Any:
        return lambda x: out

    tuner = flyreg.autotune_builder("gate_probe", build, lambda x: {"n": 1}, [Config({"ONLY": 1})],
                                    reference=lambda args, kwargs: ref, build_cache=BuildCache(), warmup=0, rep=1)
    try:
        tuner.time_config(Config({"ONLY": 1}), torch.zeros(1))
    except flyreg.TuneError as e:
        ((_, why),) = e.rejected
        return why
    return None


def test_the_guide_documents_every_float_dtype_searched_most() -> None:
    assert set(TOLERANCES) == {torch.bfloat16, torch.float16, torch.float32, torch.float64}


@pytest.mark.parametrize("dtype", list(TOLERANCES))
def test_within_and_beyond_the_dtype_tolerance(dtype: torch.dtype) -> None:
    rtol, atol = TOLERANCES[dtype]
    ref = torch.linspace(1, 2, 64, dtype=torch.float64)
    close = (ref * (1 + rtol / 4)).to(dtype)
    assert mismatch(close, ref.to(dtype)) is None
    far = ref.clone()
    far[3] += 10 * (atol + rtol * abs(far[3]))
    why = mismatch(far.to(dtype), ref.to(dtype))
    assert why is not None and "1 of 64" in why


def test_shape_type_and_nan() -> None:
    ref = torch.ones(4, 4)
    assert "shape" in (mismatch(torch.ones(16), ref) or "")
    assert "expected a tensor" in (mismatch(3, ref) or "")
    bad = ref.clone()
    bad[0, 0] = float("nan")
    assert "NaN" in (mismatch(bad, ref) or "")
    assert mismatch(torch.full((2,), float("nan")), torch.full((2,), float("nan"))) is None


def test_integer_outputs_must_be_equal() -> None:
    ref = torch.arange(10)
    assert mismatch(ref.clone(), ref) is None
    assert mismatch(ref + 1, ref) is not None


def test_nested_outputs_name_the_element() -> None:
    a, b = torch.ones(3), torch.zeros(3)
    assert mismatch((a, b), (a, b)) is None
    assert "output[1]" in (mismatch((a, a), (a, b)) or "")
    assert "sequence" in (mismatch((a,), (a, b)) or "")
    assert mismatch({"y": a, "n": 3}, {"y": a, "n": 3}) is None
    assert "output['y']" in (mismatch({"y": b, "n": 3}, {"y": a, "n": 3}) or "")
    assert "keys" in (mismatch({"y": a}, {"y": a, "n": 3}) or "")
    assert mismatch(3, 3) is None and "expected 4" in (mismatch(3, 4) or "")
    assert "a tensor, expected NoneType" in (mismatch((torch.ones(3),), (None,)) or "")
