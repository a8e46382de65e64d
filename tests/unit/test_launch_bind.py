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
    # The config's hints reach bind, once; the bound launcher gets the call's own arguments only.
    assert [e for e in events if e[0] == "bind"] == [("bind", ((4, 8), {"eps": 0.5, "num_warps": 4}))]
    assert [e for e in events if e[0] != "bind"] == [("bound", None)] * 3  # unbound never runs
    op(torch.randn(2, 8), eps=0.5)  # another shape: another bind
    op(x, eps=0.25)  # another scalar value: another bind
    assert [e[1] for e in events if e[0] == "bind"][1:] == [((2, 8), {"eps": 0.5, "num_warps": 4}),
                                                             ((4, 8), {"eps": 0.25, "num_warps": 4})]


def test_search_binds_every_candidate_before_timing_any_on_a_thread_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    events: list[tuple[str, Any]] = []
    threads: list[str] = []

    def build(config: Config, spec: dict[str, Any]) -> Any:
        def launch(x: torch.Tensor) -> torch.Tensor:
            events.append(("unbound", config.kwargs["S"]))
            return x * config.kwargs["S"]

        def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            threads.append(threading.current_thread().name)
            events.append(("bind", config.kwargs["S"]))

            def bound(x: torch.Tensor) -> torch.Tensor:
                events.append(("run", config.kwargs["S"]))
                return x * config.kwargs["S"]

            return bound

        launch.bind = bind  # type: ignore[attr-defined]
        return launch

    monkeypatch.setenv("FLYREG_COMPILE_THREADS", "4")
    configs = [Config({"S": s}) for s in (1, 2, 3, 4, 5, 6)]
    op = flyreg.autotune_builder("bind_pool", build, lambda x: {"n": x.shape[-1]}, configs, warmup=0, rep=1,
                                 build_cache=BuildCache())
    op.tune(torch.randn(8))
    first_run = next(i for i, e in enumerate(events) if e[0] == "run")
    assert sorted(s for kind, s in events[:first_run] if kind == "bind") == [1, 2, 3, 4, 5, 6]
    # The first bind on the calling thread, alone; the other five on the pool.
    assert threads[0] == threading.current_thread().name
    assert len(threads) == 6 and all(t.startswith("flyreg-bind-bind_pool") for t in threads[1:])


def pool_threads_of_a_search(name: str, candidates: int) -> set[str]:
    """The pool threads that bound the candidates of one search of ``candidates`` configs (binds sleep, so
    the pool starts every thread it may)."""
    import threading
    import time

    threads: list[str] = []

    def build(config: Config, spec: dict[str, Any]) -> Any:
        def launch(x: torch.Tensor) -> torch.Tensor:
            return x * config.kwargs["S"]

        def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            threads.append(threading.current_thread().name)
            time.sleep(0.05)
            return launch

        launch.bind = bind  # type: ignore[attr-defined]
        return launch

    configs = [Config({"S": s}) for s in range(1, candidates + 1)]
    op = flyreg.autotune_builder(name, build, lambda x: {"n": x.shape[-1]}, configs, warmup=0, rep=1,
                                 build_cache=BuildCache())
    op.tune(torch.randn(8))
    return {t for t in threads if t.startswith(f"flyreg-bind-{name}")}


@pytest.mark.parametrize("raw", ["0", "-2", "many"])
def test_a_bad_compile_thread_count_warns_and_the_default_binds(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    import os

    monkeypatch.setenv("FLYREG_COMPILE_THREADS", raw)
    with pytest.warns(flyreg.FlyregWarning, match=f"FLYREG_COMPILE_THREADS={raw!r}: expected an int >= 1"):
        pool = pool_threads_of_a_search(f"bad_threads_{raw}", 20)
    assert len(pool) == min(16, os.cpu_count() or 1)  # the documented default: the CPU count, at most 16


def test_a_good_compile_thread_count_sizes_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYREG_COMPILE_THREADS", "3")
    assert len(pool_threads_of_a_search("three_threads", 20)) == 3


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


def test_a_launch_record_binds_like_the_legacy_attribute_and_checks_its_fields() -> None:
    from flyreg.plugin import Launch

    events: list[tuple[str, Any]] = []

    def build(config: Config, spec: dict[str, Any]) -> Launch:
        def launch(x: torch.Tensor, num_warps: int | None = None) -> torch.Tensor:
            events.append(("unbound", num_warps))
            return x + 1

        def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            events.append(("bind", dict(kwargs)))
            return lambda x: x + 1

        return Launch(launch, bind)

    op = flyreg.autotune_builder("bind_record", build, lambda x: {"n": x.shape[-1]}, [Config({"K": 1}, num_warps=2)],
                                 lambda spec: Config({"K": 1}, num_warps=2), build_cache=BuildCache())
    x = torch.zeros(3)
    for _ in range(2):
        torch.testing.assert_close(op(x), x + 1)
    assert events == [("bind", {"num_warps": 2})]  # bound once; the plain launch never ran
    assert Launch(lambda x: x * 2)(torch.ones(1)).item() == 2.0  # calling the record launches
    with pytest.raises(TypeError, match="Launch bind must be a callable or None"):
        Launch(lambda x: x, bind=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Launch launch must be a callable"):
        Launch(None)  # type: ignore[arg-type]
