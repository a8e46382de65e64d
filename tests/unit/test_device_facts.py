"""Device facts read from the device (L2 size, SM count), and the timing buffers sized from them."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flyreg._core import device_facts as facts
from flyreg._core.device_facts import ASSUMED_L2_BYTES, DeviceFacts, device_facts, flush_bytes, rotate_bytes

MIB = 1 << 20


class FakeGPUs:
    """CUDA devices whose properties a test sets (``props``: index -> properties); ``reads`` lists each read."""

    def __init__(self) -> None:
        self.props: dict[int, Any] = {}
        self.reads: list[int] = []

    def get_device_properties(self, index: int) -> Any:
        self.reads.append(index)
        return self.props[index]


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGPUs]:
    """Two fake CUDA devices, the current one cuda:1."""
    gpus = FakeGPUs()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", gpus.get_device_properties)
    facts._cuda_facts.cache_clear()
    yield gpus
    facts._cuda_facts.cache_clear()


def test_facts_are_read_from_each_device_once(fake_gpus: FakeGPUs) -> None:
    fake_gpus.props[0] = types.SimpleNamespace(L2_cache_size=60 * MIB, multi_processor_count=132)
    fake_gpus.props[1] = types.SimpleNamespace(L2_cache_size=40 * MIB, multi_processor_count=108)
    assert device_facts("cuda:0") == DeviceFacts(60 * MIB, 132, reported=True)
    assert device_facts(torch.device("cuda", 0)) == device_facts("cuda:0")
    assert device_facts("cuda") == DeviceFacts(40 * MIB, 108, reported=True)  # the current device
    assert device_facts("cuda:1") == device_facts("cuda")
    assert fake_gpus.reads == [0, 1]


def test_buffers_follow_the_l2(fake_gpus: FakeGPUs) -> None:
    fake_gpus.props[0] = types.SimpleNamespace(L2_cache_size=60 * MIB, multi_processor_count=132)  # an H200's
    fake_gpus.props[1] = types.SimpleNamespace(L2_cache_size=126 * MIB, multi_processor_count=148)
    assert (flush_bytes("cuda:0"), rotate_bytes("cuda:0")) == (256 * MIB, 128 * MIB)
    assert (flush_bytes("cuda:1"), rotate_bytes("cuda:1")) == (512 * MIB, 256 * MIB)


def test_a_device_reporting_no_l2_gets_the_assumed_size(fake_gpus: FakeGPUs) -> None:
    fake_gpus.props[0] = types.SimpleNamespace(multi_processor_count=80)  # an older torch: no L2_cache_size
    fake_gpus.props[1] = types.SimpleNamespace(L2_cache_size=0, multi_processor_count=60)
    assert device_facts("cuda:0") == DeviceFacts(ASSUMED_L2_BYTES, 80, reported=False)
    assert device_facts("cuda:1") == DeviceFacts(ASSUMED_L2_BYTES, 60, reported=False)


def test_off_cuda_the_facts_are_assumed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = device_facts("cpu")
    assert cpu.reported is False and cpu.l2_bytes == ASSUMED_L2_BYTES and cpu.sm_count >= 1
    assert device_facts("cuda:3") == cpu  # CUDA asked for, but not available here
    assert flush_bytes("cpu") >= 2 * ASSUMED_L2_BYTES


@given(l2=st.integers(1, 1 << 34))
def test_flush_and_rotation_exceed_twice_the_l2(l2: int) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(facts, "device_facts", lambda device="cuda": DeviceFacts(l2, 1, reported=True))
        f, r = flush_bytes(), rotate_bytes()
    assert f >= 4 * l2 and r >= 2 * l2
    assert f < 8 * l2 and r < 4 * l2  # the next power of two, no more
    assert f & (f - 1) == 0 and r & (r - 1) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_real_device_reports_its_facts() -> None:
    props = torch.cuda.get_device_properties(0)
    found = device_facts("cuda:0")
    assert found.reported and found.l2_bytes == props.L2_cache_size
    assert found.sm_count == props.multi_processor_count
    assert flush_bytes("cuda:0") >= 2 * props.L2_cache_size
