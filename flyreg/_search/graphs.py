"""Capturing a call in a CUDA graph, for the timings that replay one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class CaptureError(RuntimeError):
    """The call runs eagerly but cannot be captured in a CUDA graph (it synchronizes, say)."""


def capture(body: Callable[[], Any], prepare: Callable[[], None] | None = None) -> torch.cuda.CUDAGraph:
    """``body()`` captured as a CUDA graph, after one run on a side stream (as capture requires; its
    errors are the body's own). ``prepare()``, when given, runs before that run and before capture.

    Raises :class:`CaptureError` when capture fails, leaving torch as a successful capture would:
    the caller's stream current again, and the random generators out of capture mode (a failed
    capture never runs their epilogue, and every later random op would fail; a trivial capture runs
    it).
    """
    caller = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(caller)
    if prepare is not None:
        prepare()
    with torch.cuda.stream(side):
        body()
    caller.wait_stream(side)
    if prepare is not None:
        prepare()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            body()
    except Exception as e:
        torch.cuda.set_stream(caller)
        try:
            torch.cuda.synchronize()
            scratch = torch.zeros(1, device="cuda")
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                scratch.add_(1.0)
        except Exception:  # the caller falls back either way; a broken context shows on its next call
            pass
        raise CaptureError(f"{type(e).__name__}: {e}") from e
    return graph
