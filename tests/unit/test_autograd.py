"""Ops have no backward: inputs that require grad are refused while grad mode is on, never silently detached."""

from __future__ import annotations

import pytest
import torch

import flyreg


def _inputs(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, n), torch.rand(n) + 0.5


def test_an_input_that_requires_grad_is_refused_naming_it() -> None:
    x, w = _inputs()
    x.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"rmsnorm: argument 'x' requires grad, but rmsnorm has no backward"):
        flyreg.op("rmsnorm")(x, w)


def test_a_parameter_weight_is_named_and_no_grad_lets_the_call_through() -> None:
    x, w = _inputs()
    weight = torch.nn.Parameter(w)
    op = flyreg.op("rmsnorm")
    with pytest.raises(RuntimeError, match="argument 'weight' requires grad"):
        op(x, weight)
    with torch.no_grad():
        y = op(x, weight)
    ref = x.double() * torch.rsqrt(x.double().square().mean(-1, keepdim=True) + 1e-6) * w.double()
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-6)


def test_a_signature_bound_under_no_grad_is_still_refused_with_grad_on() -> None:
    x, w = _inputs(96)
    x.requires_grad_(True)
    op = flyreg.op("rmsnorm")
    with torch.inference_mode(False), torch.no_grad():
        op(x, w)  # binds this signature
    with pytest.raises(RuntimeError, match="requires grad"):
        op(x, w)


def test_the_in_place_op_leaves_a_leaf_that_requires_grad_untouched() -> None:
    x, w = _inputs()
    residual = torch.randn(8, 64, requires_grad=True)
    before = residual.detach().clone()
    with pytest.raises(RuntimeError, match="argument 'residual' requires grad"):
        flyreg.op("fused_add_rmsnorm")(x, residual, w)
    assert torch.equal(residual.detach(), before)


def test_tensors_without_grad_are_unaffected() -> None:
    x, w = _inputs()
    y = flyreg.op("rmsnorm")(x, w)
    assert y.shape == x.shape and not y.requires_grad
