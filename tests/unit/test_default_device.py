"""A default may depend on the device it serves: the ``default`` hook, a declared op's ``default`` and an
Autotuner's ``default`` get the :class:`flyreg.plugin.Device` where they take a ``device`` argument."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import flyreg
from flyreg import Config, hookimpl
from flyreg.plugin import Device, PluginError

from row_scale import RowScale
from test_declared import declared

SPEC = {"M": 32, "N": 8, "op": "scale"}


class ByDevice(RowScale):
    """RowScale whose default is 64 rows a step on a device flyreg knows a bandwidth of, 8 on any other."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Device | None] = []

    @hookimpl
    def default(self, spec: dict[str, Any], device: Device | None) -> Config:
        self.seen.append(device)
        return Config({"ROWS": 64 if device is not None and device.bandwidth else 8})


@pytest.fixture
def by_device() -> Iterator[ByDevice]:
    plugin = ByDevice()
    flyreg.register(plugin, name="rows_by_device")
    try:
        yield plugin
    finally:
        flyreg.unregister("rows_by_device")


def test_the_default_hook_gets_the_device_it_serves(by_device: ByDevice) -> None:
    res = flyreg.resolve_spec("rows_by_device", SPEC, "cpu")
    assert res.source == "default" and res.config == Config({"ROWS": 8})
    device = by_device.seen[-1]
    assert isinstance(device, Device) and device.arch.startswith("cpu-") and device.bandwidth is None
    assert device == Device.of("cpu")
    x, s = torch.randn(32, 8), torch.rand(32)
    torch.testing.assert_close(flyreg.op("rows_by_device")(x, s, torch.empty_like(x)), x * s[:, None])
    assert by_device.seen[-1] == device  # a call resolves its default for the same device


def test_a_default_hook_without_the_device_is_served_as_before() -> None:
    plugin = RowScale(default_rows=4)
    flyreg.register(plugin, name="rows_spec_only")
    try:
        assert flyreg.resolve_spec("rows_spec_only", SPEC, "cpu").config == Config({"ROWS": 4})
    finally:
        flyreg.unregister("rows_spec_only")


def test_a_known_product_carries_its_datasheet_peaks() -> None:
    h200, h100 = Device.named("NVIDIA_H200", "sm_90"), Device.named("NVIDIA_H100_80GB_HBM3", "sm_90")
    assert h200.bandwidth is not None and h100.bandwidth is not None and h200.bandwidth > h100.bandwidth
    assert h200.flops == h100.flops and h200.flops is not None
    other = Device.named("Some_New_GPU", "sm_120")
    assert (other.name, other.arch, other.bandwidth, other.flops) == ("Some_New_GPU", "sm_120", None, None)


def test_a_declared_default_of_the_device_gets_it_and_one_of_the_spec_does_not() -> None:
    seen: list[Device | None] = []

    def by_device(spec: dict[str, Any], device: Device | None) -> Config:
        seen.append(device)
        return Config({"STEP": 2 if device is None else 1})

    op = declared(cpu_default=by_device)
    spec = {"M": 16, "dtype": "float32", "backend": "cpu"}
    flyreg.register(op, name="declared_by_device")
    try:
        assert flyreg.resolve_spec("declared_by_device", spec, "cpu").config == Config({"STEP": 1})
        assert isinstance(seen[-1], Device) and seen[-1].arch.startswith("cpu-")
    finally:
        flyreg.unregister("declared_by_device")
    assert op.default(spec) == Config({"STEP": 2}) and seen[-1] is None  # no device named
    assert declared().default(spec) == Config({"STEP": 1})  # a default of the spec alone


def rows_tuner(name: str, fast_rows: int) -> flyreg.Autotuner:
    """An Autotuner offering ROWS 1 and 2, whose default is ``fast_rows`` on a device of known bandwidth, else 1."""

    def default(spec: dict[str, Any], device: Device | None) -> Config:
        return Config({"ROWS": fast_rows if device is not None and device.bandwidth else 1})

    return flyreg.Autotuner(name, lambda config, spec: (lambda x: x), lambda x: {"M": x.shape[0]},
                            [Config({"ROWS": 1}), Config({"ROWS": 2})], default)


H200 = flyreg.DeviceIdentity("NVIDIA_H200", "sm_90")


def test_an_autotuner_default_of_the_device_gets_it_and_a_stored_copy_is_taken() -> None:
    tuner = rows_tuner("rows_tuner_by_device", fast_rows=2)
    assert tuner.resolve_spec({"M": 4}, "cpu").config == Config({"ROWS": 1})  # no bandwidth known for a CPU
    assert tuner.space.default({"M": 4}, H200) == Config({"ROWS": 2})  # a product of known bandwidth
    assert tuner.space.default({"M": 4}) == Config({"ROWS": 1})  # no device named
    assert tuner.space.accepts(Config({"ROWS": 2}), {"M": 4}) is None  # the H200's default, read back from a file


def test_a_default_of_the_device_outside_the_configs_is_a_clear_error() -> None:
    tuner = rows_tuner("rows_tuner_outside", fast_rows=64)
    with pytest.raises(TypeError, match=r"default\(\) gave .*ROWS=64.* on NVIDIA_H200 .* not among its configs"):
        tuner.space.default({"M": 4}, H200)


class MisnamedDevice(RowScale):
    @hookimpl
    def default(self, spec: dict[str, Any], dev: Device | None = None) -> Config:  # never passed: not the hook's name
        return Config({"ROWS": 8})


def test_a_default_hook_naming_the_device_otherwise_is_refused() -> None:
    with pytest.raises(PluginError, match=r"hook default\(spec, dev\) takes \['dev'\], which the hook "
                                          r"default\(spec, device\) does not pass"):
        flyreg.register(MisnamedDevice(), name="rows_misnamed_device")


def test_a_search_times_the_default_of_the_device_it_runs_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    seen: list[Device | None] = []

    def default(spec: dict[str, Any], device: Device | None) -> Config:
        seen.append(device)
        return Config({"ROWS": 2})

    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    tuner = flyreg.Autotuner("rows_tuner_searched", lambda config, spec: (lambda x: x * 1.0),
                             lambda x: {"M": x.shape[0]}, [Config({"ROWS": 1}), Config({"ROWS": 2})], default)
    x = torch.randn(4, 3)
    torch.testing.assert_close(tuner(x), x)
    report = next(iter(tuner.reports.values()))
    assert report.default_ms is not None and Device.of("cpu") in seen  # the search asked for the CPU's default
