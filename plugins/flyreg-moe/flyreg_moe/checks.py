"""Checks of a ``fused_moe(x, w1, w2, topk_weights, topk_ids)`` call and its Triton knobs: x [M, K] (unit column
stride), w1 [E, 2N, K] and w2 [E, K, N] of x's dtype (bfloat16 or float16), topk_weights [M, topk] float32, topk_ids
[M, topk] int32 or int64, all on x's device, all but x contiguous. Errors (ValueError, TypeError) name the argument."""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import NamedTuple, cast

import torch

CHECK_IDS_ENV = "FLYREG_MOE_CHECK_IDS"  #: Turns on checking the ids on every call (:func:`check_ids_every_call`).
Launch = Callable[..., torch.Tensor]  #: A bound launcher: ``run(x, w1, w2, topk_weights, topk_ids) -> out``.
#: Each argument's layout, as an error names it.
LAYOUTS = {"x": "[M, K]", "w1": "[E, 2N, K]", "w2": "[E, K, N]", "topk_weights": "[M, topk]", "topk_ids": "[M, topk]"}
#: Validated shape facts of a ``fused_moe`` call.
MoEArgs = NamedTuple("MoEArgs", [("M", int), ("K", int), ("N", int), ("E", int), ("topk", int), ("x_stride", int)])


def check_moe(x: object, w1: object, w2: object, topk_weights: object, topk_ids: object) -> MoEArgs:
    """A call's shape facts, once its types, dtypes, devices, shapes and layouts are valid (ids: :func:`check_ids`)."""
    named = dict(zip(LAYOUTS, (x, w1, w2, topk_weights, topk_ids)))
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fused_moe: {name} must be a torch.Tensor, got {type(t).__name__}")
    args = cast("dict[str, torch.Tensor]", named)
    x, w1, w2, tw, ids = args.values()
    same = ((x.dtype,), f"have x's dtype {x.dtype}")
    dtypes = {"x": ((torch.bfloat16, torch.float16), "be bfloat16 or float16"), "w1": same, "w2": same,
              "topk_weights": ((torch.float32,), "be float32"),
              "topk_ids": ((torch.int32, torch.int64), "be int32 or int64")}
    for name, (allowed, what) in dtypes.items():
        if args[name].dtype not in allowed:
            raise TypeError(f"fused_moe: {name} must {what}, got {args[name].dtype}")
    for name, t in args.items():
        if t.device != x.device:
            raise ValueError(f"fused_moe: {name} must be on x's device {x.device}, got {t.device}")
        if t.dim() != (dims := LAYOUTS[name].count(",") + 1):
            raise ValueError(f"fused_moe: {name} must be {dims}-D {LAYOUTS[name]}, got shape {tuple(t.shape)}")
    (M, K), (E, two_n, k1) = x.shape, w1.shape
    N = two_n // 2
    if K == 0:
        raise ValueError(f"fused_moe: x must have K >= 1 columns, got shape {tuple(x.shape)}")
    if k1 != K or E == 0 or two_n == 0 or two_n % 2:
        raise ValueError(f"fused_moe: w1 must be [E, 2N, K] with E >= 1, N >= 1 and x's K={K}, "
                         f"got shape {tuple(w1.shape)}")
    if tuple(w2.shape) != (E, K, N):
        raise ValueError(f"fused_moe: w2 must be [E, K, N] = {(E, K, N)} (from w1 and x), got {tuple(w2.shape)}")
    if ids.shape[0] != M or ids.shape[1] == 0:
        raise ValueError(f"fused_moe: topk_ids must be [M={M}, topk >= 1], got shape {tuple(ids.shape)}")
    if tw.shape != ids.shape:
        raise ValueError(f"fused_moe: topk_weights must be [M, topk] = {tuple(ids.shape)} like topk_ids, "
                         f"got {tuple(tw.shape)}")
    if K > 1 and M > 1 and x.stride(1) != 1:
        raise ValueError(f"fused_moe: x must have unit stride along K, got strides {tuple(x.stride())}")
    for name, t in list(args.items())[1:]:
        if not t.is_contiguous():
            raise ValueError(f"fused_moe: {name} must be contiguous; pass {name}.contiguous()")
    return MoEArgs(M, K, N, E, ids.shape[1], x.stride(0) if M > 1 else K)


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_knobs(BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, GROUP_M: int, SPLIT_K: int, TMA: bool = False,
                TAILS: int = 0, BLOCK_N_DOWN: int | None = None, DECODE: bool = False, PAIR_MLP: bool = False,
                ONE_DOT: bool = False, MASK_PAD: bool = False) -> None:
    """ValueError naming the first knob that breaks its rule (16: tl.dot's least tile; None: BLOCK_N); ``DECODE``
    and ``PAIR_MLP`` are two paths, at most one on; ``ONE_DOT`` and ``MASK_PAD`` belong to the grouped path, so they
    need both off."""
    tile = ("a power of two >= 16", lambda v: _int(v) and v >= 16 and not v & (v - 1))
    count, flag = ("an int >= 1", lambda v: _int(v) and v >= 1), ("a bool", lambda v: isinstance(v, bool))
    for name, value, (what, ok) in (("BLOCK_M", BLOCK_M, tile), ("BLOCK_N", BLOCK_N, tile), ("BLOCK_K", BLOCK_K, tile),
                                    ("BLOCK_N_DOWN", BLOCK_N if BLOCK_N_DOWN is None else BLOCK_N_DOWN, tile),
                                    ("GROUP_M", GROUP_M, count), ("SPLIT_K", SPLIT_K, count), ("TMA", TMA, flag),
                                    ("DECODE", DECODE, flag), ("PAIR_MLP", PAIR_MLP, flag), ("ONE_DOT", ONE_DOT, flag),
                                    ("MASK_PAD", MASK_PAD, flag)):
        if not ok(value):
            raise ValueError(f"fused_moe: {name} must be {what}, got {value!r}")
    if DECODE and PAIR_MLP:
        raise ValueError("fused_moe: DECODE and PAIR_MLP choose two paths; at most one may be True")
    if (ONE_DOT or MASK_PAD) and (DECODE or PAIR_MLP):
        raise ValueError("fused_moe: ONE_DOT and MASK_PAD are knobs of the grouped path; they need DECODE and "
                         "PAIR_MLP False")
    if not _int(TAILS) or TAILS not in (0, 1, 2) or BLOCK_M >> TAILS < 16:
        raise ValueError("fused_moe: TAILS must be 0, 1 or 2 with BLOCK_M >> TAILS >= 16, "
                         f"got TAILS={TAILS!r} with BLOCK_M={BLOCK_M}")


def check_ids(topk_ids: torch.Tensor, E: int) -> None:
    """ValueError naming topk_ids when a value is outside [0, E); a sync on a GPU, so skipped in a graph capture."""
    if topk_ids.numel() == 0 or (topk_ids.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    lo, hi = int(topk_ids.min()), int(topk_ids.max())
    if lo < 0 or hi >= E:
        raise ValueError(f"fused_moe: topk_ids must be expert indices in [0, {E}) (w1 has E={E}), "
                         f"got values from {lo} to {hi}")


def check_ids_every_call() -> bool:
    """Whether :data:`CHECK_IDS_ENV` (read when a signature is bound) is ``1``, ``true``, ``on`` or ``yes``, to check
    the ids on every call; other values are off, all but ``0``, ``false``, ``off``, ``no`` and empty with a warning."""
    return _check_ids_setting(os.environ.get(CHECK_IDS_ENV, "").strip().lower())


@functools.lru_cache(maxsize=8)
def _check_ids_setting(value: str) -> bool:
    if value not in ("1", "true", "on", "yes", "", "0", "false", "off", "no"):
        warnings.warn(f"{CHECK_IDS_ENV}={value!r} is not 1 or 0 (or true/false, on/off, yes/no); ids are checked "
                      "on a call signature's first call only", RuntimeWarning, stacklevel=3)
    return value in ("1", "true", "on", "yes")


def ids_checked(run: Launch, E: int) -> Launch:
    """``run`` checking the ids' values (:func:`check_ids`) on every call where :func:`check_ids_every_call`."""

    def checked(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
        check_ids(topk_ids, E)
        return run(x, w1, w2, topk_weights, topk_ids)

    return checked if check_ids_every_call() else run
