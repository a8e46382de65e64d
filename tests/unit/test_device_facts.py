"""Device facts read from the device (its L2 size), seen in the L2 flush buffer ``do_bench`` takes on a GPU.

Off a GPU, each case runs ``do_bench`` in a fresh process on CUDA devices faked in torch (their
properties set by the test; what flyreg read of a device is kept for the process, so every case
starts from none): the buffer it allocates before the timed reps is four times the device's L2,
rounded up to a power of two.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

MIB = 1 << 20

#: A process with fake CUDA devices (``PROPS``: index -> properties, or None for a device reporting no L2)
#: that runs ``do_bench`` on each device of ``DEVICES`` and prints, as JSON, the flush buffer bytes of each
#: and the device indices whose properties were read, in order.
FAKE_GPUS = """
import contextlib, json, sys, types
import torch
import flyreg

props, devices = json.loads(sys.argv[1]), json.loads(sys.argv[2])
reads, sizes = [], []
real_empty = torch.empty


def properties(index):
    reads.append(index)
    l2 = props[str(index)]
    return types.SimpleNamespace(multi_processor_count=132, name="NVIDIA H200", major=9, minor=0,
                                 **({} if l2 is None else {"L2_cache_size": l2}))


def empty(*size, dtype=None, device=None, **kw):
    if device is not None and torch.device(device).type == "cuda":
        sizes.append(int(size[0]))
        return types.SimpleNamespace(zero_=lambda: None)
    return real_empty(*size, dtype=dtype, device=device, **kw)


class Event:
    def __init__(self, enable_timing):
        pass

    def record(self):
        pass

    def elapsed_time(self, end):
        return 1.0


torch.cuda.is_available = lambda: True
torch.cuda.current_device = lambda: 1
torch.cuda.device_count = lambda: len(props)
torch.cuda.get_device_properties = properties
torch.cuda.device = lambda device: contextlib.nullcontext()
torch.cuda.Event = Event
torch.cuda.synchronize = lambda: None
torch.empty = empty
for device in devices:
    flyreg.do_bench(lambda: None, 0, 1, device=device)
print(json.dumps([sizes, reads]))
"""


def flushes(fresh_process: Any, props: dict[int, int | None], devices: list[str]) -> tuple[list[int], list[int]]:
    """(flush buffer bytes per ``do_bench`` on each of ``devices``, device indices read) on fake GPUs with these L2s."""
    import json

    argv = [json.dumps({str(k): v for k, v in props.items()}), json.dumps(devices)]
    sizes, reads = fresh_process.run(f"import sys\nsys.argv[1:] = {argv!r}\n" + FAKE_GPUS).one()
    return sizes, reads


def pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def test_facts_are_read_from_each_device_once(fresh_process: Any) -> None:
    sizes, reads = flushes(fresh_process, {0: 60 * MIB, 1: 40 * MIB}, ["cuda:0", "cuda:0", "cuda", "cuda:1"])
    assert sizes == [256 * MIB, 256 * MIB, 256 * MIB, 256 * MIB]
    assert reads == [0, 1]  # "cuda" is the current device, cuda:1: read once


def test_buffers_follow_the_l2(fresh_process: Any) -> None:
    sizes, _ = flushes(fresh_process, {0: 60 * MIB, 1: 126 * MIB}, ["cuda:0", "cuda:1"])  # an H200's, a larger one
    assert sizes == [256 * MIB, 512 * MIB]


def test_a_device_reporting_no_l2_gets_the_assumed_size(fresh_process: Any) -> None:
    sizes, _ = flushes(fresh_process, {0: None, 1: 0}, ["cuda:0", "cuda:1"])  # an older torch; a zero
    assert sizes == [256 * MIB, 256 * MIB]  # the assumed 64 MiB L2, flushed like any other


def test_flush_exceeds_four_times_the_l2_by_less_than_a_power_of_two(fresh_process: Any) -> None:
    rng = random.Random(0)
    l2s = [1, 2, 3, 60 * MIB, 64 * MIB, 64 * MIB + 1, 1 << 34, *(rng.randint(1, 1 << 34) for _ in range(60))]
    sizes, _ = flushes(fresh_process, dict(enumerate(l2s)), [f"cuda:{i}" for i in range(len(l2s))])
    for l2, f in zip(l2s, sizes):
        assert 4 * l2 <= f < 8 * l2 and f & (f - 1) == 0 and f == pow2_at_least(4 * l2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_real_device_flushes_past_its_reported_l2() -> None:
    import flyreg

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    torch.cuda.reset_peak_memory_stats(0)
    flyreg.do_bench(lambda: None, 1, 2, device="cuda:0")
    assert torch.cuda.max_memory_allocated(0) - before == pow2_at_least(4 * l2)
