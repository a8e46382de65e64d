"""The two ways to make a tuner (decorator and builder mode), the build cache and launch binding."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
import torch

import flyreg
from flyreg import Config
from flyreg import BuildCache

from cpu_kernels import FAST, chunked_double, double_op, inputs

# -- decorator form --------------------------------------------------------------------------


def test_decorator_injects_knobs_as_kwargs() -> None:
    seen: list[tuple[int, int]] = []
    chunks = (1, 16, 256)

    @flyreg.autotune([Config({"CHUNK": c}) for c in chunks], key=["n"], **FAST)
    def double(x: torch.Tensor, out: torch.Tensor, n: int, CHUNK: int) -> torch.Tensor:
        seen.append((n, CHUNK))
        return chunked_double(x, out, CHUNK)

    x, out = inputs(rows=256)
    y = double(x, out, x.shape[0])
    assert y is out and torch.equal(y, x * 2)
    assert {c for _, c in seen} == set(chunks)  # every knob value reached the callable as CHUNK=
    assert double.stats.searches == 1 and double.__name__ == "double"
    assert double.name == f"{__name__}.test_decorator_injects_knobs_as_kwargs._locals_.double"
    chosen = double.resolve(x, out, x.shape[0]).config.kwargs["CHUNK"]
    seen.clear()
    double(x, out, x.shape[0])
    assert seen == [(256, chosen)]
    x2, out2 = inputs(rows=64)
    double(x2, out2, 64)  # another key value: another search
    assert double.stats.searches == 2
    assert torch.equal(out2, x2 * 2)


def test_decorator_passes_hints_the_callable_takes() -> None:
    got: list[int] = []

    @flyreg.autotune([Config({"CHUNK": 8}, num_warps=w) for w in (2, 4)], key=[], **FAST)
    def double(x: torch.Tensor, out: torch.Tensor, CHUNK: int, num_warps: int = 0) -> torch.Tensor:
        got.append(num_warps)
        return chunked_double(x, out, CHUNK)

    double(*inputs())
    assert set(got) == {2, 4}


def test_decorator_errors() -> None:
    configs = [Config({"CHUNK": 8})]

    def fn(x: torch.Tensor, out: torch.Tensor, n: int, CHUNK: int) -> torch.Tensor:
        return chunked_double(x, out, CHUNK)

    with pytest.raises(ValueError, match="'m'"):
        flyreg.autotune(configs, key=["m"])(fn)
    with pytest.raises(TypeError, match="list of argument names"):
        flyreg.autotune(configs, key="n")
    with pytest.raises(ValueError, match="name"):
        flyreg.autotune(configs, key=["n"], name="")
    tuned = flyreg.autotune(configs, key=["n"], **FAST)(fn)
    x, out = inputs()
    with pytest.raises(TypeError, match="CHUNK"):
        tuned(x, out, 256, CHUNK=4)  # the tuner passes knobs, not the caller


def test_same_name_decorators_never_share_builds() -> None:
    def make(factor: float) -> Any:
        @flyreg.autotune([Config({"CHUNK": 64})], key=[], **FAST)
        def scale(x: torch.Tensor, out: torch.Tensor, CHUNK: int) -> torch.Tensor:
            return torch.mul(x, factor, out=out)

        return scale

    double, triple = make(2.0), make(3.0)
    x, out = inputs()
    assert torch.equal(double(x, out), x * 2)
    assert torch.equal(triple(x, out), x * 3)


# -- builder mode ------------------------------------------------------------------------------


def test_builder_mode_runs_the_built_launch() -> None:
    tuner, rec = double_op("builder_op")
    x, out = inputs()
    assert torch.equal(tuner(x, out), x * 2)
    assert {tuple(cfg.items()) for cfg, _ in rec.builds} == {(("CHUNK", c),) for c in (1, 16, 256)}
    assert all(spec == {"n": 256} for _, spec in rec.builds)


def test_build_cache_builds_once_per_structural_value() -> None:
    chunks, warps = (1, 2, 4, 8), (1, 2, 4)
    configs = [Config({"CHUNK": c}, num_warps=w) for c in chunks for w in warps]
    assert len(configs) == 12
    bc = BuildCache()
    tuner, rec = double_op("hints_op", configs, structural=["CHUNK"], build_cache=bc)
    x, out = inputs(rows=64)
    tuner(x, out)
    assert bc.builds == 4 and len(rec.builds) == 4
    assert sorted(cfg["CHUNK"] for cfg, _ in rec.builds) == list(chunks)
    received: dict[int, set[int]] = defaultdict(set)
    for chunk, hints in rec.launches:
        received[chunk].add(hints["num_warps"])
    assert received == {c: set(warps) for c in chunks}
    tuner.tune(x, out, emit=False)  # a second search reuses every build
    assert bc.builds == 4


def test_structural_none_means_every_knob() -> None:
    configs = [Config({"CHUNK": 8, "UNROLL": u}) for u in (1, 2, 3)]
    bc = BuildCache()
    tuner, rec = double_op("all_structural", configs, build_cache=bc)
    tuner(*inputs(rows=64))
    assert bc.builds == 3
    bc2 = BuildCache()
    tuner2, _ = double_op("some_structural", configs, structural=["CHUNK"], build_cache=bc2)
    tuner2(*inputs(rows=64))
    assert bc2.builds == 1


def test_build_cache_is_per_op_and_per_build() -> None:
    bc = BuildCache()
    a, _ = double_op("op_a", build_cache=bc)
    b, _ = double_op("op_b", build_cache=bc)
    a_again, _ = double_op("op_a", build_cache=bc)  # same name, another build function
    x, out = inputs(rows=64)
    for t in (a, b, a_again):
        t.tune(x, out, emit=False)
    assert bc.builds == 9
    bc.clear("op_a")
    b.tune(x, out, emit=False)
    assert bc.builds == 9
    a.tune(x, out, emit=False)
    assert bc.builds == 12


@pytest.mark.parametrize("name", ["", "   ", None, 3])
def test_builder_name_is_required(name: Any) -> None:
    with pytest.raises(ValueError, match="name"):
        flyreg.autotune_builder(name, lambda c, s: print, lambda x: {}, [Config({"CHUNK": 1})])


def test_builder_rejects_non_callables() -> None:
    with pytest.raises(TypeError, match="build"):
        flyreg.autotune_builder("op", None, lambda x: {}, [Config({"CHUNK": 1})])
    with pytest.raises(TypeError, match="specialize"):
        flyreg.autotune_builder("op", lambda c, s: print, {"n": 1}, [Config({"CHUNK": 1})])
    with pytest.raises(TypeError, match="default"):
        flyreg.autotune_builder("op", lambda c, s: print, lambda x: {}, [Config({"CHUNK": 1})], Config({"CHUNK": 1}))
    with pytest.raises(ValueError, match="warmup"):
        flyreg.autotune_builder("op", lambda c, s: print, lambda x: {}, [Config({"CHUNK": 1})], warmup=-1)
    with pytest.raises(ValueError, match="rep"):
        flyreg.autotune_builder("op", lambda c, s: print, lambda x: {}, [Config({"CHUNK": 1})], rep=0)


def test_build_returning_a_non_callable_is_a_failing_config() -> None:
    tuner = flyreg.autotune_builder("nocall", lambda c, s: 42, lambda x, out: {}, [Config({"CHUNK": 1})],
                                    build_cache=BuildCache(), **FAST)
    with pytest.warns(flyreg.FlyregWarning, match="launch callable"), pytest.raises(flyreg.TuneError, match="int"):
        tuner(*inputs())


@pytest.mark.parametrize("bad", [(1, 2), [1], {"a": 1}, torch.tensor(3)])
def test_specialize_must_return_json_scalars(bad: Any) -> None:
    tuner = flyreg.autotune_builder("spec_op", lambda c, s: print, lambda x, out: {"n": 1, "shape": bad},
                                    [Config({"CHUNK": 1})], build_cache=BuildCache())
    with pytest.raises(TypeError, match=r"spec_op: specialize\(\) result\['shape'\].*JSON scalar"):
        tuner(*inputs())


def test_specialize_must_return_a_dict() -> None:
    tuner = flyreg.autotune_builder("spec_op2", lambda c, s: print, lambda x, out: [("n", 1)],
                                    [Config({"CHUNK": 1})], build_cache=BuildCache())
    with pytest.raises(TypeError, match="spec_op2.*dict"):
        tuner(*inputs())


# -- launch binding ----------------------------------------------------------------------------


def _eps_op(launch_takes_eps: bool, default: bool) -> tuple[Any, list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []

    def specialize(x: torch.Tensor, out: torch.Tensor, eps: float = 1e-6) -> dict[str, Any]:
        return {"n": int(x.shape[0])}

    def build(config: Config, spec: dict[str, Any]) -> Any:
        chunk = int(config.kwargs["CHUNK"])  # type: ignore[arg-type]
        if launch_takes_eps:
            def launch(x: torch.Tensor, out: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
                got.append({"eps": eps})
                return chunked_double(x, out, chunk)
        else:
            def launch(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:  # type: ignore[misc]
                got.append({})
                return chunked_double(x, out, chunk)
        return launch

    tuner = flyreg.autotune_builder("eps_op", build, specialize, [Config({"CHUNK": c}) for c in (4, 64)],
                                    (lambda spec: Config({"CHUNK": 64})) if default else None,
                                    build_cache=BuildCache(), **FAST)
    return tuner, got


@pytest.mark.parametrize("default", [True, False])
def test_launch_kwargs_are_filtered(default: bool) -> None:
    tuner, got = _eps_op(launch_takes_eps=False, default=default)
    x, out = inputs()
    assert torch.equal(tuner(x, out, eps=1e-5), x * 2)  # the launch would raise on eps=
    assert got and all(g == {} for g in got)
    tuner2, got2 = _eps_op(launch_takes_eps=True, default=default)
    tuner2(x, out, eps=1e-5)
    assert got2 and all(g == {"eps": 1e-5} for g in got2)


@pytest.mark.parametrize("default", [True, False])
def test_build_only_scalar_passed_positionally_is_rejected(default: bool) -> None:
    tuner, got = _eps_op(launch_takes_eps=False, default=default)
    x, out = inputs()
    with pytest.raises(TypeError, match=r"'eps'.*positionally.*keyword"):
        tuner(x, out, 1e-5)
    assert got == []
    assert tuner.stats.benchmarks == 0


def test_launch_with_var_kwargs_gets_everything() -> None:
    got: list[dict[str, Any]] = []

    def build(config: Config, spec: dict[str, Any]) -> Any:
        def launch(x: torch.Tensor, out: torch.Tensor, **kw: Any) -> torch.Tensor:
            got.append(kw)
            return chunked_double(x, out, 8)
        return launch

    tuner = flyreg.autotune_builder("varkw", build, lambda x, out, eps=0.0: {}, [Config({"CHUNK": 8}, num_warps=4)],
                                    build_cache=BuildCache(), **FAST)
    tuner(*inputs(), eps=0.5)
    assert got and all(kw == {"eps": 0.5, "num_warps": 4} for kw in got)


# -- the op name of a decorated function -------------------------------------------------------


def _kernel_in(module: str, factor: float) -> Any:
    """A function named ``kernel`` defined in module ``module``: ``out = factor * x``."""
    scope: dict[str, Any] = {"__name__": module, "torch": torch, "factor": factor}
    exec("def kernel(x, out, CHUNK):\n    return torch.mul(x, factor, out=out)\n", scope)
    return scope["kernel"]


def test_decorated_functions_of_one_name_in_two_modules_are_two_ops(isolated_dirs: dict[str, Any]) -> None:
    configs = [Config({"CHUNK": c}) for c in (4, 64)]
    a = flyreg.autotune(configs, key=[], emit=True, **FAST)(_kernel_in("pkg_a.ops", 2.0))
    b = flyreg.autotune(configs, key=[], emit=True, **FAST)(_kernel_in("pkg_b.ops", 3.0))
    assert (a.name, b.name) == ("pkg_a.ops.kernel", "pkg_b.ops.kernel")
    assert a.__name__ == b.__name__ == "kernel"
    x, out = inputs()
    assert torch.equal(a(x, out), x * 2)
    assert b.resolve(x, out).source == "search"  # a's scratch-cache entry and artifact are not b's
    assert torch.equal(b(x, out), x * 3)
    names = sorted(p.name.split(",")[0] for p in isolated_dirs["configs"].glob("*.json"))
    assert names == ["pkg_a.ops.kernel", "pkg_b.ops.kernel"]


def test_local_function_op_names_are_sanitized() -> None:
    @flyreg.autotune([Config({"CHUNK": 8})], key=[], **FAST)
    def scale(x: torch.Tensor, out: torch.Tensor, CHUNK: int) -> torch.Tensor:
        return torch.mul(x, 2, out=out)

    assert scale.name == f"{__name__}.test_local_function_op_names_are_sanitized._locals_.scale"
    x, out = inputs()
    assert torch.equal(scale(x, out), x * 2)
    assert flyreg.autotune([Config({"CHUNK": 8})], key=[], name="mine")(scale.__wrapped__).name == "mine"


# -- name-list options ---------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["restore_value", "reset_to_zero", "key_env", "structural", "arg_names",
                                    "ordered_axes"])
def test_name_lists_given_as_one_string_are_rejected(option: str) -> None:
    with pytest.raises(TypeError, match=rf"{option} must be a list of names, got the string 'out'"):
        double_op("stringly", **{option: "out"})
    with pytest.raises(TypeError, match=rf"{option} must be a list of non-empty strings"):
        double_op("not_names", **{option: ["out", 3]})


def test_decorator_rejects_a_string_name_list() -> None:
    with pytest.raises(TypeError, match="restore_value must be a list of names"):
        flyreg.autotune([Config({"CHUNK": 8})], key=[], restore_value="out")(
            lambda x, out, CHUNK: chunked_double(x, out, CHUNK))


def _accumulate_into(name: str, specialize: Any, **options: Any) -> Any:
    """``out += x`` (needs ``out`` zeroed first), with a default config: no search."""
    return flyreg.autotune_builder(name, lambda c, s: (lambda out, x: out.add_(x)), specialize, [Config({"CHUNK": 1})],
                                   lambda spec: Config({"CHUNK": 1}), build_cache=BuildCache(), **FAST, **options)


def test_in_place_names_must_be_argument_names() -> None:
    with pytest.raises(ValueError, match=r"reset_to_zero names arguments \['outt'\] that are not in arg_names \['out', 'x'\]"):
        _accumulate_into("typo", lambda out, x: {}, reset_to_zero=["outt"])
    with pytest.raises(ValueError, match=r"restore_value names arguments \['acc'\] that are not in arg_names \['x', 'y'\]"):
        _accumulate_into("given", lambda *a: {}, restore_value=["acc"], arg_names=["x", "y"])


def test_in_place_names_need_arg_names_when_none_are_known() -> None:
    # A plugin's specialize takes (*args, **kwargs): without arg_names, reset_to_zero would do nothing
    # when `out` is passed by position.
    with pytest.raises(ValueError, match=r"reset_to_zero names arguments \['out'\], but no arg_names.*pass arg_names="):
        _accumulate_into("unnamed", lambda *a, **kw: {}, reset_to_zero=["out"])
    with pytest.raises(ValueError, match="no arg_names"):
        _accumulate_into("unnamed_empty", lambda *a, **kw: {}, reset_to_zero=["out"], arg_names=())
    tuner = _accumulate_into("named", lambda *a, **kw: {}, reset_to_zero=["out"], arg_names=["out", "x"])
    x = torch.ones(4)
    out = torch.full_like(x, 7.0)
    assert torch.equal(tuner(out, x), x)  # zeroed by position


def test_keyword_only_parameters_may_be_in_place_names() -> None:
    tuner = _accumulate_into("kw_only", lambda x, *, out: {}, reset_to_zero=["out"])
    x = torch.ones(4)
    out = torch.full_like(x, 7.0)
    assert torch.equal(tuner(x=x, out=out), x)

    @flyreg.autotune([Config({"CHUNK": 1})], key=[], default=Config({"CHUNK": 1}), reset_to_zero=["out"], **FAST)
    def add_into(x: torch.Tensor, *, out: torch.Tensor, CHUNK: int) -> torch.Tensor:
        return out.add_(x)

    out.fill_(5.0)
    assert torch.equal(add_into(x, out=out), x)
