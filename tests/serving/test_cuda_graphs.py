"""Calls made while a CUDA graph is being captured: a new key is served from the scratch cache, an
offline artifact or the default, never searched; a resolved key just launches.

All on a GPU (marker ``gpu``). The first tests fake only the capture state, through torch's own query
(``torch.cuda.is_current_stream_capturing``, which flyreg asks for a CUDA call), so each can say what a
call does while capturing without CUDA's limits on what a capture may run; the kernels, the lookups and
the counters are real. The last tests capture real graphs and replay them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config, FlyregWarning, GraphCaptureError

from installed import new_tuner, plugin as installed_plugin
from on_disk import cache_entries, emit

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CHUNKS = (1, 16, 256)
DEFAULT = Config({"CHUNK": 16})


class Probe:
    """Counts the capture queries and the launches of a test op."""

    def __init__(self) -> None:
        self.queries = 0
        self.launches: list[int] = []


def double_op(name: str, probe: Probe, default: Config | None = DEFAULT, **options: Any) -> Any:
    """``out = 2 * x`` in row chunks of ``CHUNK`` (a real knob: smaller chunks are slower); spec ``{"n": rows}``."""

    def build(config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
        chunk = int(config.kwargs["CHUNK"])

        def launch(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            probe.launches.append(chunk)
            for i in range(0, x.shape[0], chunk):
                torch.mul(x[i:i + chunk], 2, out=out[i:i + chunk])
            return out

        return launch

    def specialize(x: torch.Tensor, out: torch.Tensor) -> dict[str, Any]:
        return {"n": int(x.shape[0])}

    return flyreg.autotune_builder(
        name, build, specialize, [Config({"CHUNK": c}) for c in CHUNKS],
        (lambda spec: default) if default is not None else None,
        warmup=1, rep=2, build_cache=BuildCache(), **options,
    )


@pytest.fixture
def probe() -> Probe:
    return Probe()


@pytest.fixture
def in_capture(monkeypatch: pytest.MonkeyPatch, probe: Probe) -> Probe:
    """Every capture query answers True (as inside ``torch.cuda.graph``) and is counted."""

    def fake() -> bool:
        probe.queries += 1
        return True

    capture_state(monkeypatch, fake)
    return probe


def capture_state(monkeypatch: pytest.MonkeyPatch, query: Callable[[], bool]) -> None:
    """Answer torch's query of the current stream's capture state with ``query()``."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", query)


def xy(rows: int = 64, cols: int = 8, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(rows, cols, dtype=dtype, device="cuda")
    return x, torch.empty_like(x)


def capture_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, FlyregWarning) and "captured" in str(w.message)]


@pytest.mark.parametrize("forced", [False, True])
def test_miss_in_capture_serves_the_default_without_a_search(
    monkeypatch: pytest.MonkeyPatch, in_capture: Probe, forced: bool
) -> None:
    if forced:
        monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    tuner = double_op("cap_default", in_capture)
    x, out = xy()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert torch.equal(tuner(x, out), x * 2)
        assert torch.equal(tuner(x, out), x * 2)  # steady state: no second warning
        x64, out64 = xy(dtype=torch.float64)  # a new key of the same spec: no second warning either
        assert torch.equal(tuner(x64, out64), x64 * 2)
    msgs = capture_warnings(record)
    assert len(msgs) == 1
    assert "cap_default" in msgs[0] and "{'n': 64}" in msgs[0] and "default config" in msgs[0]
    assert ("FLYREG_AUTOTUNE=1 ignored" in msgs[0]) == forced
    assert tuner.stats.searches == 0 and tuner.stats.benchmarks == 0
    assert in_capture.launches == [16, 16, 16]  # the real calls only: nothing was timed
    res = tuner.resolve(x, out)
    assert (res.source, res.origin, res.config) == ("memory", "default", DEFAULT)
    assert cache_entries("cap_default") == {}  # nothing written during capture
    assert in_capture.queries == 2  # once per new key, never on the steady-state call


def test_capture_serves_the_scratch_cache_then_an_offline_artifact(probe: Probe, monkeypatch: pytest.MonkeyPatch,
                                                                   isolated_dirs: dict[str, Any]) -> None:
    x, out = xy()
    # another spec's artifact:
    art = emit(isolated_dirs["configs"], "cap_sources", {"n": 32}, Config({"CHUNK": 256}), device="cuda")
    capture_state(monkeypatch, lambda: False)
    searched = double_op("cap_sources", Probe(), default=None)
    report = searched.tune(x, out, emit=False)  # outside capture: a real search fills the scratch cache
    capture_state(monkeypatch, lambda: True)

    fresh = double_op("cap_sources", probe)
    with pytest.warns(FlyregWarning, match="serving the cache config"):
        assert torch.equal(fresh(x, out), x * 2)
    res = fresh.resolve(x, out)
    assert (res.origin, res.config) == ("cache", report.winner)

    fresh = double_op("cap_sources", probe)
    x2, out2 = xy(rows=32)  # another spec: nothing in the scratch cache, an artifact
    with pytest.warns(FlyregWarning, match="serving the offline config"):
        assert torch.equal(fresh(x2, out2), x2 * 2)
    res = fresh.resolve(x2, out2)
    assert (res.origin, res.config, res.path) == ("offline", Config({"CHUNK": 256}), str(art))
    assert fresh.stats.searches == 0 and fresh.stats.benchmarks == 0
    assert probe.launches == [report.winner.kwargs["CHUNK"], 256]


def test_no_default_and_nothing_cached_raises_naming_op_and_spec(
    in_capture: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    tuner = double_op("cap_nodefault", in_capture, default=None)
    x, out = xy(rows=48)
    with pytest.raises(GraphCaptureError, match=r"cap_nodefault: spec \{'n': 48\}.*CUDA graph"):
        tuner(x, out)
    assert tuner.stats.searches == 0 and tuner.stats.benchmarks == 0 and in_capture.launches == []
    # Nothing was remembered: outside capture the same call searches, as FLYREG_AUTOTUNE asks.
    capture_state(monkeypatch, lambda: False)
    assert torch.equal(tuner(x, out), x * 2)
    assert tuner.stats.searches == 1 and tuner.resolve(x, out).origin == "search"


def test_emit_mode_does_not_search_during_capture(in_capture: Probe, isolated_dirs) -> None:
    tuner = double_op("cap_emit", in_capture, emit=True)
    x, out = xy()
    with pytest.warns(FlyregWarning, match="emission skipped"):
        assert torch.equal(tuner(x, out), x * 2)
    assert tuner.stats.searches == 0 and list(isolated_dirs["configs"].iterdir()) == []


def test_a_resolved_key_never_asks_about_capture(monkeypatch: pytest.MonkeyPatch, probe: Probe) -> None:
    asked: list[int] = []
    capture_state(monkeypatch, lambda: asked.append(torch.cuda.current_device()) or False)
    tuner = double_op("cap_hot", probe)
    x, out = xy()
    tuner(x, out)
    assert asked == [x.device.index]
    capture_state(monkeypatch, lambda: pytest.fail("asked on a resolved key"))
    for _ in range(3):
        tuner(x, out)
    big = torch.randn(64, 16, device="cuda")
    x2, out2 = big[:, :8], torch.empty(64, 16, device="cuda")[:, :8]  # a new call key, the same persistent key
    assert torch.equal(tuner(x2, out2), x2 * 2)
    assert probe.launches == [16] * 5


def test_tune_during_capture_raises(in_capture: Probe) -> None:
    tuner = double_op("cap_tune", in_capture)
    with pytest.raises(GraphCaptureError, match="cap_tune: tune"):
        tuner.tune(*xy())
    assert tuner.stats.searches == 0


def test_rmsnorm_plugin_in_capture_serves_what_lookup_gives_without_a_search(
    monkeypatch: pytest.MonkeyPatch, in_capture: Probe
) -> None:
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    tuner = new_tuner("rmsnorm")
    plugin = installed_plugin("rmsnorm")
    x, w = torch.randn(300, 512, device="cuda"), torch.rand(512, device="cuda") + 0.5
    spec = plugin.specialize((x, w), {})
    expected = flyreg.resolve_spec("rmsnorm", spec, "cuda")  # a shipped artifact, else the default
    assert expected.origin in ("offline", "default")  # the exact artifact, a fallback of it, or the default
    with pytest.warns(FlyregWarning, match=f"rmsnorm: spec .* serving the {expected.source} config"):
        y = tuner(x, w)
    ref = plugin.reference((x, w), {})
    assert ((y.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-5
    assert tuner.stats.searches == 0 and tuner.stats.benchmarks == 0
    assert tuner.resolve(x, w).config == expected.config
    if expected.source == "default":
        assert expected.config == plugin.default(spec)


# -- real captures and replays ------------------------------------------------------------------
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _static_inputs(op: str, M: int, N: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    x = torch.randn(M, N, device="cuda", dtype=dtype)
    w = torch.rand(N, device="cuda", dtype=dtype) + 0.5
    if op == "fused_add_rmsnorm":
        return (x, torch.randn(M, N, device="cuda", dtype=dtype), w)
    return (x, w)


def _replay_and_check(graph: Any, op: str, static: tuple[torch.Tensor, ...], y: torch.Tensor) -> None:
    """Copy fresh random data into the static inputs, replay, compare with the float64 reference."""
    plugin = installed_plugin(op)
    for _ in range(3):
        fresh = [torch.randn_like(t) for t in static[:-1]]
        ref = plugin.reference((*[f.clone() for f in fresh], static[-1]), {})
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        assert _rel_err(y, ref) < TOL[y.dtype]
        if op == "fused_add_rmsnorm":
            x_new, r_new = fresh
            assert torch.equal(static[1], (r_new.float() + x_new.float()).to(r_new.dtype))


@pytest.mark.parametrize("op", ["rmsnorm", "fused_add_rmsnorm"])
@pytest.mark.parametrize("M,N", [(8, 4096), (300, 2880)])
def test_gpu_unresolved_key_in_capture_serves_default_and_replays(
    monkeypatch: pytest.MonkeyPatch, op: str, M: int, N: int
) -> None:
    static = _static_inputs(op, M, N, torch.bfloat16)
    # Triton loads a kernel binary on its first launch, which CUDA forbids during capture: load the
    # binary this key will get through another tuner first, so the capturing tuner's key is still new.
    warm = new_tuner(op)
    expected = warm.resolve(*static)
    warm(*[t.clone() for t in static])
    torch.cuda.synchronize()
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")  # must not trigger a search during capture
    tuner = new_tuner(op)
    graph = torch.cuda.CUDAGraph()
    with pytest.warns(FlyregWarning, match="being captured"):
        with torch.cuda.graph(graph):
            y = tuner(*static)
    assert tuner.stats.searches == 0 and tuner.stats.benchmarks == 0
    res = tuner.resolve(*static)
    assert res.source == "memory" and res.origin == expected.origin and res.config == expected.config
    assert expected.origin in ("offline", "default")
    _replay_and_check(graph, op, static, y)


@pytest.mark.parametrize("op", ["rmsnorm", "fused_add_rmsnorm"])
def test_gpu_resolved_key_in_capture_launches_and_replays(monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    static = _static_inputs(op, 256, 4096, torch.bfloat16)
    tuner = new_tuner(op)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up before capture: resolves the key and loads the kernel
        tuner(*[t.clone() for t in static])
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    resolved = tuner.resolve(*static)
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")  # a resolved key is not searched again, in capture or not
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlyregWarning)  # no capture warning: nothing new is resolved
        with torch.cuda.graph(graph):
            y = tuner(*static)
    assert tuner.stats.searches == 0 and tuner.stats.benchmarks == 0
    res = tuner.resolve(*static)
    assert res.source == "memory" and res.config == resolved.config
    _replay_and_check(graph, op, static, y)


def test_gpu_capturing_sees_the_capture_and_a_miss_without_default_raises() -> None:
    probe = Probe()
    tuner = double_op("cap_gpu_nodefault", probe, default=None)
    x = torch.randn(64, 8, device="cuda")
    out = torch.empty_like(x)
    assert torch.cuda.is_current_stream_capturing() is False
    seen: list[bool] = []
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(GraphCaptureError, match="cap_gpu_nodefault"):
        with torch.cuda.graph(graph):
            seen.append(torch.cuda.is_current_stream_capturing())
            tuner(x, out)
    assert seen == [True] and torch.cuda.is_current_stream_capturing() is False
    assert tuner.stats.searches == 0 and probe.launches == []
