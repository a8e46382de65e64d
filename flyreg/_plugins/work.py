"""What one call of a spec moves and computes: the ``work`` hook's answer, which ``flyreg report`` puts
against the device's peak bandwidth and FLOP/s."""

from __future__ import annotations

import math
from typing import Any

import attrs


def _amount(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"Work {attribute.name} must be a finite number >= 0 (or None), got {value!r}")


@attrs.frozen
class Work:
    """What one call of a spec does: ``bytes`` read plus written in device memory and ``flops`` (floating-point
    operations); either may be None (not stated), not both.

    A report's bound for the spec is the longer of ``bytes`` / peak bandwidth and ``flops`` / peak
    FLOP/s, and the winner's throughput is shown as a fraction of it. A memory-bound op states
    ``bytes`` (RMSNorm: the rows read and written, the weight once), a compute-bound one ``flops``
    (a GEMM: ``2 * M * N * K``).
    """

    bytes: float | None = attrs.field(default=None, validator=_amount)
    flops: float | None = attrs.field(default=None, validator=_amount)

    def __attrs_post_init__(self) -> None:
        if self.bytes is None and self.flops is None:
            raise ValueError("Work needs bytes or flops (or both)")
