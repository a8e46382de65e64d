"""The device a heuristic default is chosen for: its name and architecture, and the peaks flyreg knows of it."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import attrs

from flyreg._core.keys import DeviceIdentity, identity_of
from flyreg._core.peaks import known_peak


@attrs.frozen
class Device:
    """A device as an op's ``default`` hook sees it: ``name`` and ``arch`` as its artifacts name them
    (``"NVIDIA_H200"``, ``"sm_90"``), and the datasheet ``bandwidth`` (bytes/s) and dense BF16 ``flops``
    (FLOP/s) of a product flyreg knows, None for another. Told from the name alone, never measured, so a
    default is the same wherever it is asked for."""

    name: str
    arch: str
    bandwidth: float | None = None
    flops: float | None = None

    @classmethod
    def named(cls, name: str, arch: str) -> Device:
        """The device ``name`` of architecture ``arch``, with the datasheet peaks flyreg knows of that product
        (``Device.named("NVIDIA_H200", "sm_90").bandwidth`` is 4.8e12)."""
        peak = known_peak(name)
        if peak is None:
            return cls(name, arch)
        return cls(name, arch, peak.bandwidth, peak.flops)

    @classmethod
    def of(cls, device: Any = "cuda") -> Device:
        """The device ``device`` of this machine (``"cuda"``: the current CUDA device, ``"cuda:1"``, ``"cpu"``, a
        ``torch.device``) as a ``default`` hook is given it there."""
        return device_of(identity_of(device))


@functools.lru_cache(maxsize=None)
def device_of(ident: DeviceIdentity) -> Device:
    """The :class:`Device` of the device identity ``ident``."""
    return Device.named(ident.name, ident.arch)


def takes_device(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` (a default) takes a ``device`` argument by that name (one it can be passed by keyword)."""
    try:
        param = inspect.signature(fn).parameters.get("device")
    except (TypeError, ValueError):  # a callable without a signature (a builtin) takes the spec alone
        return False
    return param is not None and param.kind is not param.POSITIONAL_ONLY
