"""Test plugins, public API only: ``RowScale``, a real CPU kernel with a tunable knob that counts its hook
calls, and plugins broken in each way a plugin can be. Importable by fresh processes too."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch

from flyreg import Config, hookimpl

ROWS = (1, 16, 256)


class RowScale:
    """out[i, :] = x[i, :] * s[i], ROWS rows per step; with ``buggy``, ROWS=7 is offered and computes x * (s + 1)."""

    def __init__(self, tag: str = "scale", default_rows: int = 16, buggy: bool = False) -> None:
        self.tag = tag
        self.default_rows = default_rows
        self.buggy = buggy
        self.calls: collections.Counter[str] = collections.Counter()

    @hookimpl
    def specialize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        self.calls["specialize"] += 1
        x = args[0]
        return {"M": x.shape[0], "N": x.shape[1], "op": self.tag}

    @hookimpl
    def build(self, config: Config, spec: dict[str, Any]) -> Callable[..., torch.Tensor]:
        self.calls["build"] += 1
        rows = config.kwargs["ROWS"]
        bias = 1 if rows == 7 else 0  # the bug of the buggy config

        def launch(x: torch.Tensor, s: torch.Tensor, out: torch.Tensor, num_warps: int | None = None) -> torch.Tensor:
            for i in range(0, x.shape[0], rows):
                torch.mul(x[i:i + rows], s[i:i + rows, None] + bias, out=out[i:i + rows])
            return out

        return launch

    @hookimpl
    def configs(self, spec: dict[str, Any]) -> list[Config]:
        self.calls["configs"] += 1
        return [Config({"ROWS": r}) for r in ROWS] + ([Config({"ROWS": 7})] if self.buggy else [])

    @hookimpl
    def default(self, spec: dict[str, Any]) -> Config:
        self.calls["default"] += 1
        return Config({"ROWS": self.default_rows})

    @hookimpl
    def workloads(self) -> list[dict[str, Any]]:
        return [{"M": 256, "N": 32, "op": self.tag}]

    @hookimpl
    def make_inputs(self, spec: dict[str, Any], device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = torch.randn(spec["M"], spec["N"], device=device)
        return (x, torch.rand(spec["M"], device=device), torch.empty_like(x)), {}

    @hookimpl
    def reference(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        self.calls["reference"] += 1
        return args[0] * args[1][:, None]

    @hookimpl
    def describe(self) -> dict[str, Any]:
        self.calls["describe"] += 1
        return {"description": f"row scale ({self.tag})", "version": "2", "structural": ["ROWS"],
                "ordered_axes": ["M"], "arg_names": ["x", "s", "out"]}


def inputs(m: int = 64, n: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(m, n)
    return x, torch.rand(m), torch.empty_like(x)


class MissingBuild:
    @hookimpl
    def specialize(self, args, kwargs):  # type: ignore[no-untyped-def]
        return {"N": 1}

    @hookimpl
    def configs(self, spec):  # type: ignore[no-untyped-def]
        return [Config({"B": 1})]

    @hookimpl
    def default(self, spec):  # type: ignore[no-untyped-def]
        return Config({"B": 1})


class UnmarkedBuild(MissingBuild):
    def build(self, config, spec):  # type: ignore[no-untyped-def]  # forgot @hookimpl
        return lambda x: x


class WrongArgNames(MissingBuild):
    @hookimpl
    def build(self, cfg, spec):  # type: ignore[no-untyped-def]
        return lambda x: x


class WithoutOptional(MissingBuild):
    @hookimpl
    def build(self, config, spec):  # type: ignore[no-untyped-def]
        return lambda x: x


class UnknownHook(WithoutOptional):
    @hookimpl
    def buidl(self, config, spec):  # type: ignore[no-untyped-def]
        return lambda x: x


class BadDescribeKeys(RowScale):
    @hookimpl
    def describe(self) -> dict[str, Any]:
        return {"description": "typo", "structual": ["ROWS"]}


class BadDescribeTypes(RowScale):
    @hookimpl
    def describe(self) -> dict[str, Any]:
        return {"structural": "ROWS"}


class BadDescribeTiming(RowScale):
    @hookimpl
    def describe(self) -> dict[str, Any]:
        return {"timing": "fastest"}


class DescribeRaises(RowScale):
    @hookimpl
    def describe(self) -> dict[str, Any]:
        raise RuntimeError("boom in describe")


class ResetWithoutArgNames(RowScale):
    @hookimpl
    def describe(self) -> dict[str, Any]:
        return {"reset_to_zero": ["out"]}


class RestoreNotAnArgument(RowScale):
    @hookimpl
    def describe(self) -> dict[str, Any]:
        return {"restore_value": ["x", "acc", "res"], "arg_names": ["x", "s", "out"]}

