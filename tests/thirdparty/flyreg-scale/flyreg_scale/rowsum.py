"""The op ``rowsum``: ``out[i] = x[i, :].sum()``, accumulated ``BLOCK`` columns at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from flyreg import Config, hookimpl

from ._common import bucket, dtype_name

BLOCKS = (4, 32, 256)


@hookimpl
def specialize(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    x = args[0]
    return {"M": bucket(x.shape[0]), "N": x.shape[1], "dtype": dtype_name(x)}


@hookimpl
def build(config: Config, spec: dict[str, Any]) -> Callable[..., torch.Tensor]:
    block = config.kwargs["BLOCK"]

    def launch(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        out.zero_()
        for j in range(0, x.shape[1], block):
            out += x[:, j:j + block].sum(dim=1)
        return out

    return launch


@hookimpl
def configs(spec: dict[str, Any]) -> list[Config]:
    return [Config({"BLOCK": b}) for b in BLOCKS if b < 2 * spec["N"]]


@hookimpl
def default(spec: dict[str, Any]) -> Config:
    return Config({"BLOCK": 32})


@hookimpl
def workloads() -> list[dict[str, Any]]:
    return [{"M": 64, "N": 512, "dtype": "float32"}]


@hookimpl
def make_inputs(spec: dict[str, Any], device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = torch.randn(spec["M"], spec["N"], dtype=getattr(torch, spec["dtype"]), device=device)
    return (x, torch.empty(spec["M"], dtype=x.dtype, device=device)), {}


@hookimpl
def reference(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    return args[0].double().sum(dim=1)


@hookimpl
def describe() -> dict[str, Any]:
    return {"description": "out[i] = sum of row i, BLOCK columns at a time", "version": "1",
            "structural": ["BLOCK"], "ordered_axes": ["M", "N"], "arg_names": ["x", "out"]}
