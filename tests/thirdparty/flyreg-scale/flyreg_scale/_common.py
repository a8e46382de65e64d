"""What both ops share: spec helpers."""

from __future__ import annotations

import torch


def bucket(n: int) -> int:
    """``n`` rounded up to a power of two."""
    return 1 << max(n - 1, 0).bit_length()


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")
