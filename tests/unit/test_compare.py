"""The correctness gate's comparison: per-dtype tolerances, shapes, NaNs, nested outputs."""

from __future__ import annotations

import pytest
import torch

from flyreg._search.gate import TOLERANCES, mismatch


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
    assert "tensor" in (mismatch(torch.ones(3), None) or "")
