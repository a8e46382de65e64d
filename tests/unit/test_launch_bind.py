"""A launch callable's optional ``bind(args, kwargs)``: called once per call signature, then it launches."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config


def make_op(name: str, events: list[tuple[str, Any]]) -> Any:
    def build(config: Config, spec: dict[str, Any]) -> Any:
        scale = config.kwargs["SCALE"]

        def launch(x: torch.Tensor, eps: float = 0.0, num_warps: int | None = None) -> torch.Tensor:
            events.append(("unbound", num_warps))
            return x * scale + eps

        def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            events.append(("bind", (tuple(args[0].shape), dict(kwargs))))
            offset = kwargs.get("eps", 0.0)

            def bound(x: torch.Tensor, eps: float = offset, num_warps: int | None = None) -> torch.Tensor:
                events.append(("bound", num_warps))
                return x * scale + offset

            return bound

        launch.bind = bind  # type: ignore[attr-defined]
        return launch

    return flyreg.autotune_builder(name, build, lambda x, eps=0.0: {"n": x.shape[-1]},
                                   [Config({"SCALE": 3}, num_warps=4)], lambda spec: Config({"SCALE": 3}, num_warps=4),
                                   build_cache=BuildCache())


def test_bind_once_per_call_signature_then_the_bound_launcher_runs() -> None:
    events: list[tuple[str, Any]] = []
    op = make_op("bind_protocol", events)
    x = torch.randn(4, 8)
    for _ in range(3):
        torch.testing.assert_close(op(x, eps=0.5), x * 3 + 0.5)
    assert [e for e in events if e[0] == "bind"] == [("bind", ((4, 8), {"eps": 0.5}))]
    assert [e for e in events if e[0] != "bind"] == [("bound", 4)] * 3  # hints still reach it; unbound never runs
    op(torch.randn(2, 8), eps=0.5)  # another shape: another bind
    op(x, eps=0.25)  # another scalar value: another bind
    assert [e[1] for e in events if e[0] == "bind"][1:] == [((2, 8), {"eps": 0.5}), ((4, 8), {"eps": 0.25})]


def test_bind_must_return_a_callable() -> None:
    def build(config: Config, spec: dict[str, Any]) -> Any:
        def launch(x: torch.Tensor) -> torch.Tensor:
            return x

        launch.bind = lambda args, kwargs: None  # type: ignore[attr-defined]
        return launch

    op = flyreg.autotune_builder("bind_returns_none", build, lambda x: {"n": x.shape[-1]}, [Config({"A": 1})],
                                 lambda spec: Config({"A": 1}), build_cache=BuildCache())
    with pytest.raises(TypeError, match="bind\\(\\) must return a callable"):
        op(torch.randn(2))
