"""What a device reports about itself (L2 size, SM count), and the timing buffer sizes it implies."""

from __future__ import annotations

import functools
import os
from typing import Any

import attrs

#: L2 bytes assumed where the device reports none (off CUDA, where no timing flushes an L2).
ASSUMED_L2_BYTES = 64 * 1024 * 1024


@attrs.frozen
class DeviceFacts:
    """``l2_bytes`` of L2 cache and ``sm_count`` streaming multiprocessors (off CUDA: the CPU count);
    ``reported`` is False when these are assumed, not read from a CUDA device."""

    l2_bytes: int
    sm_count: int
    reported: bool


def device_facts(device: Any = "cuda") -> DeviceFacts:
    """The facts of ``device`` (a ``torch.device`` or a string; ``"cuda"`` is the current CUDA device),
    read once per CUDA device index; assumed ones off CUDA or where CUDA is not available."""
    kind = getattr(device, "type", None) or str(device).partition(":")[0]
    if kind == "cuda":
        import torch

        if torch.cuda.is_available():
            index = torch.device(device).index
            return _cuda_facts(torch.cuda.current_device() if index is None else index)
    return DeviceFacts(ASSUMED_L2_BYTES, os.cpu_count() or 1, reported=False)


@functools.lru_cache(maxsize=None)
def _cuda_facts(index: int) -> DeviceFacts:
    import torch

    props = torch.cuda.get_device_properties(index)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    return DeviceFacts(l2 if l2 > 0 else ASSUMED_L2_BYTES, int(props.multi_processor_count), reported=l2 > 0)


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def flush_bytes(device: Any = "cuda") -> int:
    """Bytes written between timed runs to evict the L2 of ``device``: four times its L2, rounded up to
    a power of two (256 MiB for an L2 of 33 to 64 MiB)."""
    return _pow2_at_least(4 * device_facts(device).l2_bytes)


def rotate_bytes(device: Any = "cuda") -> int:
    """Bytes of inputs (and outputs) a steady-state replay cycles through before reusing any: twice the
    L2 of ``device``, rounded up to a power of two (128 MiB for an L2 of 33 to 64 MiB), so a reused
    buffer has left the L2."""
    return _pow2_at_least(2 * device_facts(device).l2_bytes)
