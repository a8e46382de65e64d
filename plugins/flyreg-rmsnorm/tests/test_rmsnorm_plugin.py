"""The RMSNorm plugin through flyreg on the CPU: argument forms, eps, and the registry."""

from __future__ import annotations

import os

import pytest
import torch

import flyreg
from flyreg_rmsnorm import ops


def installed_plugin(op: str):
    return getattr(ops, op)  # the object this distribution's entry point names


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("op", ["rmsnorm", "fused_add_rmsnorm"])
def test_eps_positional_and_keyword_agree_and_matter(op: str) -> None:
    torch.manual_seed(7)
    x = torch.randn(17, 96) * 1e-2  # small rows, so eps changes the result
    w = torch.rand(96) + 0.5
    plugin = installed_plugin(op)

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
        assert infos[name].status == "ok" and infos[name].distribution == "flyreg-rmsnorm"
        assert infos[name].structural is not None and "BLOCK_N" in infos[name].structural


def test_bad_input_is_a_clear_error_through_the_op() -> None:
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="weight"):
        flyreg.op("rmsnorm")(x, torch.randn(7))
    with pytest.raises(TypeError, match="x"):
        flyreg.op("rmsnorm")(x.to(torch.int32), torch.randn(8))


def test_backend_comes_from_the_device_and_a_bad_spec_is_one_error() -> None:
    spec = {"M": 32, "N": 1024, "dtype": "float32"}
    assert installed_plugin("rmsnorm").describe().ordered_axes == ("M",)  # nearest lookup along M only, as before
    assert flyreg.resolve_spec("rmsnorm", spec).spec == {**spec, "backend": "cpu"}
    assert flyreg.resolve_spec("rmsnorm", {**spec, "M": 20}).spec["M"] == 32  # M is rounded up to its bucket
    with pytest.raises(flyreg.SpecError, match=r"backend: tpu is not one of triton\|cpu; dtype: int8 is not "
                                               r"one of bfloat16\|float16\|float32\. Axes: M \(int, ordered"):
        flyreg.resolve_spec("rmsnorm", {**spec, "dtype": "int8", "backend": "tpu"})
    # the hooks themselves still check a spec handed to them directly
    with pytest.raises(ValueError, match=r"^RMSNorm spec .* lacks axes \['backend'\]"):
        installed_plugin("rmsnorm").default(spec)


def _triton_ok() -> bool:
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _triton_ok(), reason="triton not importable, or no GPU and no interpreter")
@pytest.mark.parametrize("op", ["rmsnorm", "fused_add_rmsnorm"])
def test_triton_launch_binds_once_per_call_signature(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton launch callable validates a call signature once (bind), then only allocates and launches."""
    from flyreg_rmsnorm import triton_kernels

    device = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter runs Triton on CPU tensors
    plugin = installed_plugin(op)
    d = plugin.describe()
    spec = {"M": 32, "N": 100, "backend": "triton", "dtype": "float32"}
    config = plugin.default(spec)
    tuner = flyreg.autotune_builder(  # the default only: its first call binds, no search
        f"{op}_bind_test", plugin.build, lambda *a, **k: {**plugin.specialize(a, k), "backend": "triton"},
        [config], lambda s: config, structural=d.structural, arg_names=d.arg_names, build_cache=flyreg.BuildCache())
    torch.manual_seed(11)
    x = torch.randn(7, 100, device=device) * 1e-2  # small rows, so eps=1e-5 against 1e-6 shows
    w = torch.rand(100, device=device) + 0.5
    args = (x, torch.randn(7, 100, device=device) * 1e-2, w) if op == "fused_add_rmsnorm" else (x, w)
    checks = []
    for name in ("check_rmsnorm", "check_fused_add"):
        real = getattr(triton_kernels, name)
        monkeypatch.setattr(triton_kernels, name, lambda *a, _real=real, **k: checks.append(1) or _real(*a, **k))
    for i in range(3):
        fresh = tuple(a.clone() for a in args)
        expected = plugin.reference(tuple(a.clone() for a in fresh), {"eps": 1e-5})
        out = tuner(*fresh, eps=1e-5)
        assert rel_err(out, expected) < 1e-5
        assert rel_err(out, plugin.reference(tuple(a.clone() for a in fresh), {})) > 1e-3  # eps reached it
        assert len(checks) == 1  # bound at the first call; the steady state re-validates nothing
    assert tuner.stats.searches == 0


@pytest.mark.skipif(not _triton_ok(), reason="triton not importable, or no GPU and no interpreter")
@pytest.mark.parametrize("op", ["rmsnorm", "fused_add_rmsnorm"])
def test_triton_backend_through_a_tuner_with_every_eps_form(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton launch path of the plugin through a tuner (bind included): search, then eps by position,
    by keyword and by default, each against the float64 reference; fused add updates residual once."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    plugin = installed_plugin(op)
    d = plugin.describe()
    tuner = flyreg.autotune_builder(
        f"{op}_triton_test", plugin.build, lambda *a, **k: {**plugin.specialize(a, k), "backend": "triton"},
        plugin.configs, plugin.default, structural=d.structural, arg_names=d.arg_names,
        restore_value=d.restore_value, reference=plugin.reference, warmup=1, rep=2, build_cache=flyreg.BuildCache())
    torch.manual_seed(5)
    w = torch.rand(100, device=device) + 0.5

    def fresh() -> tuple[torch.Tensor, ...]:
        x = torch.randn(9, 100, device=device) * 1e-2
        return (x, torch.randn(9, 100, device=device) * 1e-2, w) if op == "fused_add_rmsnorm" else (x, w)

    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    args = fresh()
    before = [a.clone() for a in args]
    expected = plugin.reference(tuple(a.clone() for a in args), {"eps": 1e-2})
    out = tuner(*args, eps=1e-2)
    assert tuner.stats.searches == 1 and not next(iter(tuner.reports.values())).rejected
    assert rel_err(out, expected) < 1e-5
    if op == "fused_add_rmsnorm":  # exactly one residual += x despite every search rep
        torch.testing.assert_close(args[1], before[1] + before[0], rtol=1e-6, atol=1e-7)
    monkeypatch.delenv("FLYREG_AUTOTUNE")
    for extra, kw, eps in (((1e-2,), {}, 1e-2), ((), {"eps": 1e-2}, 1e-2), ((), {}, 1e-6)):
        args = fresh()
        expected = plugin.reference(tuple(a.clone() for a in args), {"eps": eps})
        assert rel_err(tuner(*args, *extra, **kw), expected) < 1e-5
    assert tuner.stats.searches == 1
