"""The op ``scale``: ``out = x * alpha``, computed ``ROWS`` rows per step (fewer rows, more steps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from flyreg.plugin import Axis, Config, OpRecord, hookimpl

from ._common import bucket, dtype_name

ROWS = (1, 8, 64, 512)


@hookimpl
def specialize(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    x = args[0]
    return {"M": x.shape[0], "N": x.shape[1], "dtype": dtype_name(x)}  # the record rounds M up to its bucket


@hookimpl
def build(config: Config, spec: dict[str, Any]) -> Callable[..., torch.Tensor]:
    rows = config.kwargs["ROWS"]

    def launch(x: torch.Tensor, out: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
        for i in range(0, x.shape[0], rows):
            torch.mul(x[i:i + rows], alpha, out=out[i:i + rows])
        return out

    return launch


@hookimpl
def configs(spec: dict[str, Any]) -> list[Config]:
    return [Config({"ROWS": r}) for r in ROWS]


@hookimpl
def default(spec: dict[str, Any]) -> Config:
    return Config({"ROWS": 1})  # a deliberately poor default: tuning must beat it


@hookimpl
def workloads(device: str) -> list[dict[str, Any]]:
    return [{"M": 256, "N": 64, "dtype": "float32"}]


@hookimpl
def make_inputs(spec: dict[str, Any], device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = torch.randn(spec["M"], spec["N"], dtype=getattr(torch, spec["dtype"]), device=device)
    return (x, torch.empty_like(x)), {"alpha": 3.0}


@hookimpl
def reference(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    return args[0] * kwargs.get("alpha", 2.0)


@hookimpl
def describe() -> OpRecord:
    return OpRecord(description="out = x * alpha, ROWS rows per step", version="1", structural=["ROWS"],
                    arg_names=["x", "out"],
                    axes=[Axis("M", int, ordered=True, buckets=bucket), Axis("N", int),
                          Axis("dtype", str, values=("float32", "float64"))])
