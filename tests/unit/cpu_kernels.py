"""Real CPU kernels for the engine's unit tests, and a recording builder-mode op around them.

Every kernel walks the rows of its input in chunks of ``CHUNK`` with a Python loop, so its
cost falls as ``CHUNK`` grows: the knob really changes the time a search measures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

import flyreg
from flyreg import BuildCache, Config

#: Small counts keep every search in the suite fast.
FAST = {"warmup": 1, "rep": 3}
#: How many times the work of the first round a search's final round times (docs/autotune_guide.md).
FINAL_SCALE = 8


def launches_per_search(tuner: Any) -> int:
    """Launches the searches of ``tuner`` made (with FAST counts): every candidate's reps, then the
    final round's longer ones."""
    warmup, rep = FAST["warmup"], FAST["rep"]
    return tuner.stats.benchmarks * (warmup + rep) + tuner.stats.retimed * (warmup + rep * FINAL_SCALE)


def chunked_double(x: torch.Tensor, out: torch.Tensor, chunk: int) -> torch.Tensor:
    """``out = 2 * x``, ``chunk`` rows at a time."""
    for i in range(0, x.shape[0], chunk):
        torch.mul(x[i : i + chunk], 2, out=out[i : i + chunk])
    return out


def chunked_accumulate(acc: torch.Tensor, x: torch.Tensor, k: float, chunk: int, rows: int | None = None) -> torch.Tensor:
    """``acc += x * k`` in place, ``chunk`` rows at a time; ``rows`` (a bug) stops early."""
    n = acc.shape[0] if rows is None else rows
    for i in range(0, n, chunk):
        acc[i : i + chunk] += x[i : i + chunk] * k
    return acc


def loop_iterations(rows: int, config: Config) -> int:
    """How many Python-loop iterations a chunked kernel runs for ``config`` on ``rows`` rows."""
    return -(-rows // int(config.kwargs["CHUNK"]))  # type: ignore[arg-type]


@attrs.define
class Recorder:
    """What the hooks and the launch callables of a test op saw."""

    specialize: int = 0
    configs: int = 0
    default: int = 0
    builds: list[tuple[dict[str, Any], dict[str, Any]]] = attrs.field(factory=list)
    #: (CHUNK, hints the launch received) per launch.
    launches: list[tuple[Any, dict[str, Any]]] = attrs.field(factory=list)


def double_op(
    name: str,
    configs: Sequence[Config] | None = None,
    default: Config | None = None,
    *,
    chunks: Sequence[int] = (1, 16, 256),
    configs_fn: bool = False,
    build_cache: BuildCache | None = None,
    **options: Any,
) -> tuple[Any, Recorder]:
    """A builder-mode op computing ``out = 2 * x``; spec ``{"n": rows}``; its launch takes ``num_warps``."""
    rec = Recorder()
    cands = list(configs) if configs is not None else [Config({"CHUNK": c}) for c in chunks]

    def specialize(x: torch.Tensor, out: torch.Tensor) -> dict[str, Any]:
        rec.specialize += 1
        return {"n": int(x.shape[0])}

    def build(config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
        rec.builds.append((config.kwargs, dict(spec)))
        chunk = int(config.kwargs["CHUNK"])  # type: ignore[arg-type]

        def launch(x: torch.Tensor, out: torch.Tensor, num_warps: int | None = None) -> torch.Tensor:
            rec.launches.append((chunk, {"num_warps": num_warps}))
            return chunked_double(x, out, chunk)

        return launch

    def configs_of(spec: dict[str, Any]) -> list[Config]:
        rec.configs += 1
        return list(cands)

    def default_of(spec: dict[str, Any]) -> Config:
        rec.default += 1
        assert default is not None
        return default

    tuner = flyreg.autotune_builder(
        name, build, specialize, configs_of if configs_fn else cands, default_of if default is not None else None,
        build_cache=build_cache if build_cache is not None else BuildCache(), **{**FAST, **options},
    )
    return tuner, rec


def inputs(rows: int = 256, cols: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A random ``x`` and an ``out`` of its shape."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    return x, torch.empty_like(x)
