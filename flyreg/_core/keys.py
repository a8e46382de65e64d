"""Cache-key axes: tensor layouts, device identity, the toolchain the spec depends on, environment.

A spec itself is checked, keyed and named by :mod:`flyreg._core.spec`.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from flyreg._core.config import JSONScalar
from flyreg._core.spec import sanitize
from flyreg._core.toolchain import current


@attrs.frozen
class DeviceIdentity:
    """The product a config was tuned on (``name``) and its architecture (``arch``)."""

    name: str
    arch: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "arch": self.arch}


#: The architecture of known GPU products, by a model word of the device name (``NVIDIA_H200``,
#: ``AMD_Instinct_MI300X``): lookup skips another architecture's artifacts by their filename alone.
PRODUCT_ARCHS = {
    "V100": "sm_70", "T4": "sm_75", "A100": "sm_80", "A800": "sm_80", "A10": "sm_86", "A10G": "sm_86",
    "A40": "sm_86", "L4": "sm_89", "L40": "sm_89", "L40S": "sm_89", "H100": "sm_90", "H800": "sm_90",
    "H200": "sm_90", "H20": "sm_90", "GH200": "sm_90", "B200": "sm_100", "GB200": "sm_100",
    "MI210": "gfx90a", "MI250": "gfx90a", "MI250X": "gfx90a", "MI300A": "gfx942", "MI300X": "gfx942",
    "MI325X": "gfx942",
}
#: The first word of a GPU's device name whose model word :data:`PRODUCT_ARCHS` may know.
_GPU_VENDORS = {"NVIDIA": "sm_", "AMD": "gfx"}


def known_arch(name: str) -> str | None:
    """The architecture of the GPU product ``name`` (a device identity's name) when known, else None."""
    words = re.split(r"[^A-Z0-9]+", name.upper())
    prefix = _GPU_VENDORS.get(words[0])
    archs = {PRODUCT_ARCHS[w] for w in words[1:] if w in PRODUCT_ARCHS}
    if prefix is None or len(archs) != 1:
        return None
    (arch,) = archs
    return arch if arch.startswith(prefix) else None


def stride_pattern(shape: Iterable[int], strides: Iterable[int]) -> tuple[int, ...]:
    """Per dimension: 0 broadcast, 1 contiguous (unit stride), 2 strided."""
    return tuple(0 if s == 0 else 1 if s == 1 else 2 for _, s in zip(shape, strides))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def device_identity(device_type: str, index: int | None = None) -> DeviceIdentity:
    """The identity of a torch device (``"cuda"``, index) or the CPU; cached per process.

    ``("cuda", None)`` means the current CUDA device, read on every call (only the identity of an
    explicit index is cached), so a later ``torch.cuda.set_device`` is honoured.
    """
    if device_type == "cuda":
        import torch

        if not torch.cuda.is_available():
            asked = "cuda" if index is None else f"cuda:{index}"
            raise ValueError(f"device {asked!r} was asked for, but CUDA is not available here")
        if index is None:
            index = torch.cuda.current_device()
    elif device_type != "cpu":
        raise ValueError(f"device type {device_type!r} is not supported: flyreg tunes on 'cpu' or 'cuda[:N]' only")
    return _device_identity(device_type, index)


@functools.lru_cache(maxsize=None)
def _device_identity(device_type: str, index: int | None) -> DeviceIdentity:
    if device_type == "cpu":
        return DeviceIdentity(sanitize(_cpu_name()), f"cpu-{platform.machine() or 'unknown'}")
    import torch

    if index is None or not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"device 'cuda:{index}' does not exist: {torch.cuda.device_count()} CUDA device(s) here")
    props = torch.cuda.get_device_properties(index)
    if getattr(torch.version, "hip", None):
        arch = str(getattr(props, "gcnArchName", "gfx")).split(":", 1)[0]
    else:
        arch = f"sm_{props.major}{props.minor}"
    return DeviceIdentity(sanitize(props.name), arch)


def parse_device(device: Any) -> tuple[str, int | None]:
    """``(type, CUDA index or None)`` of ``None`` (the CPU), a ``torch.device``, a device string (``"cpu"``,
    ``"cuda"``, ``"cuda:1"``) or a CUDA index (``1`` is ``"cuda:1"``, as in torch).

    Only CPU and CUDA devices are tuned on; anything else (``"gpu"``, ``"meta"``, ``"cuda:x"``,
    ``"mps"``) is a ValueError naming the device.
    """
    if device is None:
        return "cpu", None
    import torch

    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"device {device!r} is not a device: a CUDA index must be >= 0")
        parsed = torch.device("cuda", device)
    elif isinstance(device, (str, torch.device)):
        try:
            parsed = torch.device(device)
        except (RuntimeError, ValueError, TypeError):
            raise ValueError(f"device {device!r} is not a device string; use 'cpu', 'cuda' or 'cuda:N'") from None
    else:
        raise ValueError(f"device must be None, a torch.device, a device string or a CUDA index, "
                         f"got {type(device).__name__} {device!r}")
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} is not supported: flyreg tunes on 'cpu' or 'cuda[:N]' devices only")
    return parsed.type, parsed.index if parsed.type == "cuda" else None


def identity_of(device: Any) -> DeviceIdentity:
    """Identity of a device as :func:`parse_device` reads it (``None`` is the CPU)."""
    return device_identity(*parse_device(device))


def env_values(names: Iterable[str]) -> tuple[tuple[str, str | None], ...]:
    """Current values of the declared cache-invalidating environment variables."""
    return tuple((n, os.environ.get(n)) for n in names)


class SpecError(ValueError):
    """A spec that does not fit its op's declared axes; the one-line message names the op, every
    offending axis, and the axes and values the op allows."""


def tensor_axes(named: Iterable[tuple[str, Any]]) -> list[list[Any]]:
    """``[name, dtype, stride pattern]`` of each tensor among ``named``, ordered by name."""
    out = []
    for name, value in named:
        dtype = getattr(value, "dtype", None)
        stride = getattr(value, "stride", None)
        if dtype is None or stride is None or not hasattr(value, "shape"):
            continue
        out.append([name, str(dtype).removeprefix("torch."), list(stride_pattern(value.shape, stride()))])
    return sorted(out)


def cache_key(
    op: str,
    spec: Mapping[str, JSONScalar],
    tensors: list[list[Any]],
    device: DeviceIdentity,
    op_version: str,
    env: tuple[tuple[str, str | None], ...],
) -> str:
    """The scratch-cache key of one resolved call, as a canonical JSON string.

    Its ``toolchain`` is what a config of ``spec`` on ``device`` depends on
    (:func:`flyreg._core.toolchain.current`), so installing a library the spec's backend does not
    use keeps every entry.
    """
    return json.dumps(
        {
            "op": op,
            "spec": dict(spec),
            "tensors": tensors,
            "device": device.to_json(),
            "toolchain": current(spec, device.arch, op_version),
            "env": dict(env),
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def cache_key_prefix(op: str, spec: Mapping[str, JSONScalar], device: DeviceIdentity,
                     env: tuple[tuple[str, str | None], ...]) -> str:
    """The start every :func:`cache_key` of ``spec`` on ``device`` has, whatever its tensors and toolchain: the
    fields that sort before ``tensors``, up to its value (a spec-only lookup reads the keys with this prefix)."""
    head = json.dumps({"device": device.to_json(), "env": dict(env), "op": op, "spec": dict(spec)},
                      sort_keys=True, separators=(",", ":"))
    return head[:-1] + ',"tensors":'

