"""Input validation shared by the Triton and CPU fused-MoE backends.

A call is ``fused_moe(x, w1, w2, topk_weights, topk_ids)`` with x [M, K] (unit column stride),
w1 [E, 2N, K] and w2 [E, K, N] contiguous, topk_weights [M, topk] float32 and topk_ids
[M, topk] int32 or int64, both contiguous, every tensor on x's device, x, w1 and w2 of one
dtype (bfloat16 or float16). Each failure is a ValueError or TypeError naming the argument.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import NamedTuple

import torch

#: Dtypes of x, w1 and w2.
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
ID_DTYPES = (torch.int32, torch.int64)
#: The setting that turns on checking the ids' values on every call (see :func:`check_ids_every_call`).
CHECK_IDS_ENV = "FLYREG_MOE_CHECK_IDS"


class MoEArgs(NamedTuple):
    """Validated shape facts of a ``fused_moe`` call."""

    M: int
    K: int
    N: int
    E: int
    topk: int
    x_stride: int


def _tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"fused_moe: {name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _dims(t: torch.Tensor, name: str, want: int, what: str) -> None:
    if t.dim() != want:
        raise ValueError(f"fused_moe: {name} must be {want}-D {what}, got shape {tuple(t.shape)}")


def check_moe(x: object, w1: object, w2: object, topk_weights: object, topk_ids: object) -> MoEArgs:
    """Validate a ``fused_moe`` call (shapes, dtypes, devices, layouts) and return its shape facts.

    The values of ``topk_ids`` are checked by :func:`check_ids`, which reads them.
    """
    x, w1, w2 = _tensor(x, "x"), _tensor(w1, "w1"), _tensor(w2, "w2")
    tw, ids = _tensor(topk_weights, "topk_weights"), _tensor(topk_ids, "topk_ids")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"fused_moe: x must be bfloat16 or float16, got {x.dtype}")
    for t, name in ((w1, "w1"), (w2, "w2")):
        if t.dtype != x.dtype:
            raise TypeError(f"fused_moe: {name} must have x's dtype {x.dtype}, got {t.dtype}")
    if tw.dtype != torch.float32:
        raise TypeError(f"fused_moe: topk_weights must be float32, got {tw.dtype}")
    if ids.dtype not in ID_DTYPES:
        raise TypeError(f"fused_moe: topk_ids must be int32 or int64, got {ids.dtype}")
    for t, name in ((w1, "w1"), (w2, "w2"), (tw, "topk_weights"), (ids, "topk_ids")):
        if t.device != x.device:
            raise ValueError(f"fused_moe: {name} must be on x's device {x.device}, got {t.device}")
    _dims(x, "x", 2, "[M, K]")
    _dims(w1, "w1", 3, "[E, 2N, K]")
    _dims(w2, "w2", 3, "[E, K, N]")
    _dims(tw, "topk_weights", 2, "[M, topk]")
    _dims(ids, "topk_ids", 2, "[M, topk]")
    M, K = x.shape
    E, two_n, k1 = w1.shape
    if K == 0:
        raise ValueError(f"fused_moe: x must have K >= 1 columns, got shape {tuple(x.shape)}")
    if k1 != K:
        raise ValueError(f"fused_moe: w1 [E, 2N, K] must have x's K={K} in its last dim, got shape {tuple(w1.shape)}")
    if E == 0 or two_n == 0 or two_n % 2:
        raise ValueError(f"fused_moe: w1 must be [E, 2N, K] with E >= 1 and N >= 1, got shape {tuple(w1.shape)}")
    N = two_n // 2
    if tuple(w2.shape) != (E, K, N):
        raise ValueError(f"fused_moe: w2 must be [E, K, N] = {(E, K, N)} (from w1 and x), got {tuple(w2.shape)}")
    if ids.shape[0] != M or ids.shape[1] == 0:
        raise ValueError(f"fused_moe: topk_ids must be [M={M}, topk >= 1], got shape {tuple(ids.shape)}")
    if tuple(tw.shape) != tuple(ids.shape):
        raise ValueError(f"fused_moe: topk_weights must be [M, topk] = {tuple(ids.shape)} like topk_ids, "
                         f"got {tuple(tw.shape)}")
    if K > 1 and M > 1 and x.stride(1) != 1:
        raise ValueError(f"fused_moe: x must have unit stride along K, got strides {tuple(x.stride())}")
    for t, name in ((w1, "w1"), (w2, "w2"), (tw, "topk_weights"), (ids, "topk_ids")):
        if not t.is_contiguous():
            raise ValueError(f"fused_moe: {name} must be contiguous; pass {name}.contiguous()")
    return MoEArgs(M, K, N, E, ids.shape[1], x.stride(0) if M > 1 else K)


def check_ids(topk_ids: torch.Tensor, E: int) -> None:
    """ValueError naming topk_ids when a value is outside [0, E) (reads the values: a sync on a GPU)."""
    if topk_ids.numel() == 0:
        return
    lo, hi = int(topk_ids.min()), int(topk_ids.max())
    if lo < 0 or hi >= E:
        raise ValueError(f"fused_moe: topk_ids must be expert indices in [0, {E}) (w1 has E={E}), "
                         f"got values from {lo} to {hi}")


def check_ids_every_call() -> bool:
    """Whether :data:`CHECK_IDS_ENV` asks for the ids' values to be checked on every call outside CUDA-graph
    capture (``1``, ``true``, ``on`` or ``yes``), not only on a call signature's first; read when a call
    signature is bound. Any other value than those or ``0``, ``false``, ``off``, ``no`` and empty is off,
    with one warning naming the setting (a bad setting never breaks a call)."""
    return _check_ids_setting(os.environ.get(CHECK_IDS_ENV, "").strip().lower())


@functools.lru_cache(maxsize=8)
def _check_ids_setting(value: str) -> bool:
    if value in ("1", "true", "on", "yes"):
        return True
    if value not in ("", "0", "false", "off", "no"):
        warnings.warn(f"{CHECK_IDS_ENV}={value!r} is not 1 or 0 (or true/false, on/off, yes/no); ids are checked "
                      "on a call signature's first call only", RuntimeWarning, stacklevel=3)
    return False
