"""The RMSNorm plugin through flyreg on the CPU: argument forms, eps, and the registry."""

from __future__ import annotations

import pytest
import torch

import flyreg
from flyreg.registry import REGISTRY


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("op", ["rmsnorm", "fused_add_rmsnorm"])
def test_eps_positional_and_keyword_agree_and_matter(op: str) -> None:
    torch.manual_seed(7)
    x = torch.randn(17, 96) * 1e-2  # small rows, so eps changes the result
    w = torch.rand(96) + 0.5
    plugin = REGISTRY.plugin(op)

    def call(*extra: object, **kw: object) -> tuple[torch.Tensor, tuple]:
        if op == "fused_add_rmsnorm":
            res = torch.randn(17, 96, generator=torch.Generator().manual_seed(3)) * 1e-2
            args = (x, res, w)
            ref = plugin.reference((x, res.clone(), w, *extra), dict(kw))
            return flyreg.op(op)(*args, *extra, **kw), ref
        return flyreg.op(op)(x, w, *extra, **kw), plugin.reference((x, w, *extra), dict(kw))

    positional, ref_pos = call(1e-2)
    keyword, ref_kw = call(eps=1e-2)
    default, ref_default = call()
    assert torch.equal(positional, keyword)
    assert rel_err(positional, ref_pos) < 1e-5 and rel_err(default, ref_default) < 1e-5
    assert rel_err(positional, default) > 1e-3  # eps reached the kernel


def test_listed_with_description_and_knobs() -> None:
    infos = {i.name: i for i in flyreg.ops()}
    for name in ("rmsnorm", "fused_add_rmsnorm"):
        assert infos[name].status == "ok" and infos[name].distribution == "flyreg"
        assert infos[name].structural is not None and "BLOCK_N" in infos[name].structural


def test_bad_input_is_a_clear_error_through_the_op() -> None:
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="weight"):
        flyreg.op("rmsnorm")(x, torch.randn(7))
    with pytest.raises(TypeError, match="x"):
        flyreg.op("rmsnorm")(x.to(torch.int32), torch.randn(8))


def test_incomplete_spec_names_the_missing_axes() -> None:
    with pytest.raises(ValueError, match=r"lacks axes \['backend'\]"):
        flyreg.resolve_spec("rmsnorm", {"M": 32, "N": 1024, "dtype": "float32"})
    with pytest.raises(ValueError, match="'backend' must be"):
        flyreg.resolve_spec("rmsnorm", {"M": 32, "N": 1024, "dtype": "float32", "backend": "tpu"})
