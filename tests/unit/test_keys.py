"""The cache key: every axis changes it; keyword order does not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import flyreg
from flyreg import Config
from flyreg._artifacts import cache
from flyreg._core import keys, toolchain
from flyreg._runtime.builder import BuildCache
from flyreg._core.keys import DeviceIdentity, cache_key, env_values, identity_of, normalize_spec, stride_pattern, tensor_axes

from cpu_kernels import FAST, chunked_double

CPU = identity_of(None)


def key_of(tensors: dict[str, torch.Tensor], spec: dict[str, Any] | None = None, *, device: DeviceIdentity = CPU,
           version: str = "1", env: tuple[str, ...] = ()) -> str:
    return cache_key("op", spec if spec is not None else {"n": 64}, tensor_axes(tensors.items()), device, version,
                     env_values(env))


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(64, 32)


def test_key_is_canonical_json(x: torch.Tensor) -> None:
    data = json.loads(key_of({"x": x}))
    assert data["op"] == "op" and data["spec"] == {"n": 64}
    assert data["device"] == CPU.to_json()
    assert data["toolchain"]["op"] == "1"


def test_spec_values_and_axes_change_the_key(x: torch.Tensor) -> None:
    base = key_of({"x": x}, {"n": 64})
    assert key_of({"x": x}, {"n": 128}) != base
    assert key_of({"x": x}, {"m": 64}) != base
    assert key_of({"x": x}, {"n": 64, "eps": 1e-6}) != base
    assert key_of({"x": x}, {"n": 64.0}) != base  # JSON keeps 64 and 64.0 apart
    assert key_of({"x": x}, {"n": 64}) == base


def test_dtype_changes_the_key(x: torch.Tensor) -> None:
    keys_ = {key_of({"x": x.to(dt)}) for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}
    assert len(keys_) == 4


def test_stride_patterns(x: torch.Tensor) -> None:
    row = torch.randn(32)
    assert stride_pattern(x.shape, x.stride())[-1] == 1
    assert stride_pattern(row.expand(64, 32).shape, row.expand(64, 32).stride())[0] == 0
    sliced = x[:, ::2]
    assert stride_pattern(sliced.shape, sliced.stride())[-1] == 2
    assert set(stride_pattern(x.t().shape, x.t().stride())) == {1, 2}


def test_stride_pattern_changes_the_key(x: torch.Tensor) -> None:
    big = torch.randn(64, 64)
    layouts = {
        "contiguous": x,
        "broadcast": torch.randn(32).expand(64, 32),
        "strided": big[:, ::2],
        "transposed": torch.randn(32, 64).t(),
    }
    found = {name: key_of({"x": t}) for name, t in layouts.items()}
    assert len(set(found.values())) == len(layouts), found
    # The same pattern with other sizes and strides is the same key: the pattern is the axis.
    assert key_of({"x": torch.randn(64, 64)[:, ::4]}) == found["strided"]


def test_device_identity_changes_the_key(x: torch.Tensor) -> None:
    other_product = DeviceIdentity("Other_CPU", CPU.arch)
    other_arch = DeviceIdentity(CPU.name, "sm_90")
    assert len({key_of({"x": x}), key_of({"x": x}, device=other_product), key_of({"x": x}, device=other_arch)}) == 3
    assert identity_of("cpu") == identity_of(torch.device("cpu")) == CPU


def test_toolchain_and_op_version_change_the_key(x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    base = key_of({"x": x})
    triton = key_of({"x": x}, {"n": 64, "backend": "triton"})
    assert key_of({"x": x}, version="2") != base
    real = dict(toolchain.toolchain())
    assert real["flyreg"] == flyreg.__version__

    def machine(**parts: str) -> None:
        monkeypatch.setattr(toolchain, "toolchain", lambda: tuple({**real, **parts}.items()))

    machine(torch=real["torch"] + "+other")  # what a spec with no backend axis depends on
    assert key_of({"x": x}) != base
    machine(triton="99.0", flyreg="99.0")  # installing Triton, or another flyreg, keeps a torch op's entries
    assert key_of({"x": x}) == base and key_of({"x": x}, {"n": 64, "backend": "triton"}) != triton


def test_declared_env_var_changes_the_key(x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLYREG_TEST_VARIANT", raising=False)
    unset = key_of({"x": x}, env=("FLYREG_TEST_VARIANT",))
    monkeypatch.setenv("FLYREG_TEST_VARIANT", "a")
    a = key_of({"x": x}, env=("FLYREG_TEST_VARIANT",))
    monkeypatch.setenv("FLYREG_TEST_VARIANT", "b")
    b = key_of({"x": x}, env=("FLYREG_TEST_VARIANT",))
    assert len({unset, a, b}) == 3
    monkeypatch.setenv("UNDECLARED_VARIABLE", "x")
    assert key_of({"x": x}, env=("FLYREG_TEST_VARIANT",)) == b


def test_keyword_order_does_not_change_the_key(x: torch.Tensor) -> None:
    w = torch.randn(32, dtype=torch.float16)
    assert key_of({"x": x, "w": w}) == key_of({"w": w, "x": x})
    assert key_of({"x": x, "w": w}) != key_of({"x": w, "w": x})  # but names stay bound to their tensor


def test_non_tensors_are_not_layout_axes(x: torch.Tensor) -> None:
    assert tensor_axes([("x", x), ("n", 3), ("eps", 1e-6), ("name", "a")]) == tensor_axes([("x", x)])


@pytest.mark.parametrize("spec, error, match", [
    ({"shape": (1, 2)}, TypeError, r"shape.*JSON scalar"),
    ({"t": torch.tensor(1)}, TypeError, r"'t'.*JSON scalar"),
    ({"n": float("nan")}, ValueError, "finite"),
    ({1: 2}, TypeError, "axis names"),
    ([("n", 1)], TypeError, "dict"),
])
def test_normalize_spec_errors(spec: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        normalize_spec(spec)


def test_sanitize_is_filename_safe() -> None:
    for text in ("NVIDIA H200", "a/../b", "x:y*z", "", "ü"):
        out = keys.sanitize(text)
        assert out and all(c.isascii() and (c.isalnum() or c in "._-") for c in out)


# -- the keys inside a tuner ---------------------------------------------------------------


def _tuner(key_env: tuple[str, ...] = ()) -> tuple[Any, list[int]]:
    launches: list[int] = []

    def specialize(x: torch.Tensor, w: torch.Tensor) -> dict[str, Any]:
        return {"n": int(x.shape[0])}

    def build(config: Config, spec: dict[str, Any]) -> Any:
        chunk = int(config.kwargs["CHUNK"])  # type: ignore[arg-type]

        def launch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            launches.append(chunk)
            return chunked_double(x * w, torch.empty_like(x), chunk)

        return launch

    tuner = flyreg.autotune_builder("keyed", build, specialize, [Config({"CHUNK": c}) for c in (4, 64)],
                                    key_env=key_env, build_cache=BuildCache(), **FAST)
    return tuner, launches


def test_tuner_keyword_order_is_one_key(x: torch.Tensor) -> None:
    w = torch.randn(32)
    tuner, _ = _tuner()
    first = tuner(x=x, w=w)
    assert tuner.stats.searches == 1
    second = tuner(w=w, x=x)
    assert tuner.stats.searches == 1
    assert torch.equal(first, second)
    assert tuner.resolve(w=w, x=x).source == "memory"
    assert tuner.resolve(x, w).source == "memory"  # positional names are the same axes


def test_tuner_layout_is_a_new_resolution(x: torch.Tensor) -> None:
    tuner, _ = _tuner()
    w = torch.randn(32)
    tuner(x, w)
    tuner(x, torch.randn(32))  # same spec and layout: a memory hit
    assert tuner.stats.searches == 1
    tuner(x, torch.randn(1).expand(32))  # w broadcast: another key
    assert tuner.stats.searches == 2
    tuner(x.to(torch.float64), w.to(torch.float64))
    assert tuner.stats.searches == 3


def test_env_change_is_a_new_resolution(x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(32)
    monkeypatch.setenv("FLYREG_TEST_VARIANT", "a")
    tuner, _ = _tuner(key_env=("FLYREG_TEST_VARIANT",))
    tuner(x, w)
    tuner(x, w)
    assert tuner.stats.searches == 1
    monkeypatch.setenv("FLYREG_TEST_VARIANT", "b")
    assert tuner.resolve(x, w).source == "search"
    tuner(x, w)
    assert tuner.stats.searches == 2
    monkeypatch.setenv("FLYREG_TEST_VARIANT", "a")
    assert tuner.resolve(x, w).source == "memory"
    assert tuner.stats.searches == 2
    assert len(cache.load("keyed")) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where CUDA is absent")
def test_cuda_identity_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        identity_of("cuda:0")


@pytest.mark.parametrize("device", ["gpu", torch.device("meta"), "meta", "cuda:x", "mps", "", -1, 1.5, True,
                                    object()])
def test_bad_devices_are_clear_value_errors(device: Any) -> None:
    with pytest.raises(ValueError, match="device") as info:
        identity_of(device)
    assert repr(device) in str(info.value)  # it names the device it was given


def test_cpu_spellings_are_one_identity() -> None:
    assert identity_of("cpu") == identity_of("cpu:0") == identity_of(torch.device("cpu")) == identity_of(None)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Two fake CUDA devices (an H200 and an A100); ``state["current"]`` is the current one."""
    state = {"current": 0}
    props = [type("P", (), {"name": "NVIDIA H200", "major": 9, "minor": 0})(),
             type("P", (), {"name": "NVIDIA A100", "major": 8, "minor": 0})()]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["current"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    cached = getattr(keys, "_device_identity", keys.device_identity)
    cached.cache_clear()
    yield state
    cached.cache_clear()


def test_current_cuda_device_is_read_on_every_call(fake_cuda: dict[str, int]) -> None:
    h200, a100 = DeviceIdentity("NVIDIA_H200", "sm_90"), DeviceIdentity("NVIDIA_A100", "sm_80")
    assert identity_of("cuda") == identity_of(torch.device("cuda")) == h200
    fake_cuda["current"] = 1  # torch.cuda.set_device(1)
    assert identity_of("cuda") == identity_of(torch.device("cuda")) == keys.device_identity("cuda") == a100
    assert identity_of("cuda:0") == identity_of(0) == h200 and identity_of(1) == a100
    with pytest.raises(ValueError, match="'cuda:2' does not exist: 2 CUDA device"):
        identity_of("cuda:2")
