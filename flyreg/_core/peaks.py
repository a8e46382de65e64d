"""A device's peak memory bandwidth and dense BF16 FLOP/s: known by product name, or the bandwidth measured.

The known peaks are the vendors' datasheet figures (dense, without sparsity). A device not in the
table gets its copy bandwidth measured when this machine has it (a large device-to-device copy,
read plus written bytes over the median time), and no FLOP/s peak.
"""

from __future__ import annotations

import re
import statistics
import time

import attrs

from flyreg._core.keys import DeviceIdentity, identity_of

#: (words all in the device name, peak bytes/s, peak dense BF16 FLOP/s, product); the first match wins.
KNOWN: tuple[tuple[tuple[str, ...], float, float, str], ...] = (
    (("H200", "NVL"), 4.8e12, 835e12, "H200 NVL"),
    (("H200",), 4.8e12, 989e12, "H200 SXM"),
    (("H100", "PCIE"), 2.0e12, 756e12, "H100 PCIe"),
    (("H100", "NVL"), 3.9e12, 835e12, "H100 NVL"),
    (("H100",), 3.35e12, 989e12, "H100 SXM"),
    (("A100", "PCIE", "80GB"), 1.935e12, 312e12, "A100 80GB PCIe"),
    (("A100", "80GB"), 2.039e12, 312e12, "A100 80GB SXM"),
    (("A100",), 1.555e12, 312e12, "A100 40GB"),
)
#: Bytes copied per timed copy when measuring: far past any L2 or last-level cache.
COPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 26}


@attrs.frozen
class Peak:
    """``bandwidth`` (bytes/s) and ``flops`` (dense BF16 FLOP/s) of a device, None where unknown; ``how``
    says where they come from."""

    bandwidth: float | None
    flops: float | None
    how: str


def known_peak(name: str) -> Peak | None:
    """The datasheet peak of the product ``name`` (a device identity's name), or None."""
    words = set(re.split(r"[^A-Z0-9]+", name.upper()))
    for wanted, bandwidth, flops, product in KNOWN:
        if words.issuperset(wanted):
            return Peak(bandwidth, flops, f"known: {product} datasheet, {bandwidth / 1e12:g} TB/s and "
                                          f"{flops / 1e12:g} dense BF16 TFLOP/s")
    return None


def peak_of(ident: DeviceIdentity) -> Peak:
    """The peak of the device ``ident``: known, else measured on a device of this machine with that
    identity, else unknown."""
    known = known_peak(ident.name)
    if known is not None:
        return known
    device = _local_device(ident)
    if device is None:
        return Peak(None, None, "unknown: not in the known-peaks table, and no such device here to measure")
    bandwidth = copy_bandwidth(device)
    return Peak(bandwidth, None, f"measured: copy bandwidth {bandwidth / 1e9:.1f} GB/s on {device} "
                                 f"(read plus written bytes of a {COPY_BYTES[device.partition(':')[0]] >> 20} MiB "
                                 f"copy); no FLOP/s peak known")


def _local_device(ident: DeviceIdentity) -> str | None:
    """A device of this machine with identity ``ident`` (``"cpu"``, ``"cuda:N"``), or None."""
    if ident.arch.startswith("cpu-"):
        return "cpu" if identity_of("cpu") == ident else None
    import torch

    if not torch.cuda.is_available():
        return None
    return next((f"cuda:{i}" for i in range(torch.cuda.device_count()) if identity_of(f"cuda:{i}") == ident), None)


def copy_bandwidth(device: str, repeats: int = 5) -> float:
    """Bytes read plus written per second by a large copy on ``device``, the median of ``repeats``."""
    import torch

    kind = device.partition(":")[0]
    n = COPY_BYTES[kind] // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = []
    for _ in range(repeats):
        if kind == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds.append(time.perf_counter() - t0)
    return 2 * n * 4 / statistics.median(seconds)
