"""Keys missed during CUDA-graph capture: served the default, kept pending (``flyreg.pending()``, the serving
record's ``capture:<source>``), tuned after capture by ``flyreg.tune_pending()``, so the next capture gets
the tuned config.

On the CPU the capture is simulated through the query flyreg asks (``torch.cuda.is_current_stream_capturing``,
with ``torch.cuda.is_initialized``): a call made while the current CUDA stream captures is in capture,
whatever its device. The kernels, the searches and the record are real. The last test captures a real
CUDA graph (marker ``gpu``).
"""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config, FlyregWarning, GraphCaptureError

CHUNKS = (1, 16, 256)
DEFAULT = Config({"CHUNK": 16})


def double_op(name: str, launches: list[int], default: Config | None = DEFAULT) -> Any:
    """``out = 2 * x`` in row chunks of ``CHUNK``; spec ``{"n": rows}``; ``launches`` gets each launch's chunk."""

    def build(config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
        chunk = int(config.kwargs["CHUNK"])

        def launch(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            launches.append(chunk)
            for i in range(0, x.shape[0], chunk):
                torch.mul(x[i:i + chunk], 2, out=out[i:i + chunk])
            return out

        return launch

    return flyreg.autotune_builder(
        name, build, lambda x, out: {"n": int(x.shape[0])}, [Config({"CHUNK": c}) for c in CHUNKS],
        (lambda spec: default) if default is not None else None, warmup=1, rep=2, build_cache=BuildCache(),
        reference=lambda args, kwargs: args[0].double() * 2)


@pytest.fixture
def capture(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bool], None]]:
    """``capture(True)``: the current CUDA stream answers that it is capturing, as inside ``torch.cuda.graph``."""

    def set_state(on: bool) -> None:
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: on)

    yield set_state
    set_state(False)
    flyreg.tune_pending(on_error=lambda key, e: None)  # nothing pending outlives its test


def mine(name: str) -> list[Any]:
    return [k for k in flyreg.pending() if k.op == name]


def test_a_miss_in_capture_serves_the_default_and_is_tuned_after_it(capture: Callable[[bool], None]) -> None:
    launches: list[int] = []
    tuner = double_op("pend_plain", launches)
    x = torch.randn(64, 8)
    out = torch.empty_like(x)
    capture(True)
    with pytest.warns(FlyregWarning, match="tune_pending"):
        assert torch.equal(tuner(x, out), x * 2)
    assert tuner(x, out) is out and launches == [16, 16] and tuner.stats.searches == 0
    (key,) = mine("pend_plain")
    assert (key.spec, key.served_by) == ({"n": 64}, "default") and key.device.arch.startswith("cpu")
    res = tuner.resolve(x, out)
    assert (res.source, res.origin, res.config) == ("memory", "default", DEFAULT)
    with pytest.raises(GraphCaptureError, match="pend_plain: tune"):  # never a search during capture
        flyreg.tune_pending()
    assert len(mine("pend_plain")) == 1

    capture(False)
    reports = [r for r in flyreg.tune_pending() if r.op == "pend_plain"]
    assert [r.spec for r in reports] == [{"n": 64}] and tuner.stats.searches == 1 and mine("pend_plain") == []
    winner = reports[0].winner
    capture(True)  # the next capture launches the tuned config, with no lookup and no warning
    del launches[:]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlyregWarning)
        assert torch.equal(tuner(x, out), x * 2)
    assert launches == [winner.kwargs["CHUNK"]]
    res = tuner.resolve(x, out)
    assert (res.source, res.origin, res.config) == ("memory", "search", winner)


@pytest.mark.parametrize("forced", [False, True])
def test_an_exact_cache_hit_is_pending_only_where_it_would_have_been_searched(
        capture: Callable[[bool], None], monkeypatch: pytest.MonkeyPatch, forced: bool) -> None:
    name = f"pend_hit_{forced}"
    launches: list[int] = []
    x = torch.randn(32, 4)
    out = torch.empty_like(x)
    report = double_op(name, launches).tune(x, out, emit=False)  # before capture: the scratch cache holds it
    if forced:
        monkeypatch.setenv("FLYREG_AUTOTUNE", "1")  # outside capture, the key would be searched afresh
    capture(True)
    fresh = double_op(name, launches)
    with pytest.warns(FlyregWarning, match="serving the cache config"):
        fresh(x, out)
    assert fresh.resolve(x, out).config == report.winner
    assert [k.served_by for k in mine(name)] == (["cache"] if forced else [])


def test_a_cpu_call_never_asks_about_capture_where_cuda_was_never_initialized(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: pytest.fail("asked about capture"))
    launches: list[int] = []
    tuner = double_op("pend_never_asked", launches)
    x = torch.randn(16, 4)
    assert torch.equal(tuner(x, torch.empty_like(x)), x * 2)
    assert mine("pend_never_asked") == []


def test_a_miss_without_default_raises_stays_pending_and_is_tuned_after(capture: Callable[[bool], None]) -> None:
    launches: list[int] = []
    tuner = double_op("pend_nodefault", launches, default=None)
    x = torch.randn(48, 4)
    out = torch.empty_like(x)
    capture(True)
    with pytest.raises(GraphCaptureError, match="pend_nodefault"):
        tuner(x, out)
    (key,) = mine("pend_nodefault")
    assert key.served_by == "nothing" and launches == []
    capture(False)
    (report,) = [r for r in flyreg.tune_pending() if r.op == "pend_nodefault"]
    capture(True)
    assert torch.equal(tuner(x, out), x * 2)  # the capture that raised now gets the tuned config
    assert launches[-1] == report.winner.kwargs["CHUNK"]


def test_a_plugin_op_is_tuned_on_inputs_it_makes_and_the_record_names_the_capture_miss(
        capture: Callable[[bool], None], tmp_path: Path) -> None:
    op = flyreg.op("rmsnorm")
    x, w = torch.randn(40, 160), torch.rand(160) + 0.5
    record = tmp_path / "serving.sqlite3"
    capture(True)
    with flyreg.record(record), pytest.warns(FlyregWarning, match="being captured"):
        op(x, w)
        op(x, w)
    (key,) = mine("rmsnorm")
    assert key.served_by == "default"
    check = subprocess.run([sys.executable, "-m", "flyreg", "check", "--against-record", str(record)],
                           capture_output=True, text=True, timeout=180)
    assert re.search(r"^missing: rmsnorm \S*N=160\S* on .*: 2 call\(s\) served by capture:default$", check.stdout,
                     re.M), check.stdout + check.stderr
    plan = subprocess.run([sys.executable, "-m", "flyreg", "tune", "--from-record", str(record), "--device", "cpu",
                           "--dry-run", "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=180)
    assert plan.returncode == 0 and "1 spec(s) served by a default, a fallback artifact or a capture miss" in plan.stdout

    capture(False)
    (report,) = [r for r in flyreg.tune_pending(emit=True, out_dir=tmp_path / "out") if r.op == "rmsnorm"]
    assert report.spec == key.spec and report.artifact is not None and Path(report.artifact).is_file()
    res = op.resolve(x, w)
    assert (res.source, res.origin, res.config) == ("memory", "search", report.winner)
    xd = x.double()
    ref = xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + 1e-6) * w.double()
    assert torch.allclose(op(x, w).double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_a_real_capture_miss_is_tuned_and_the_next_capture_launches_the_winner() -> None:
    launches: list[int] = []
    tuner = double_op("pend_gpu", launches)
    x = torch.randn(256, 64, device="cuda")
    out = torch.empty_like(x)
    torch.mul(x, 2)  # torch's own kernels loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.warns(FlyregWarning, match="being captured"):
        with torch.cuda.graph(graph):
            tuner(x, out)
    assert launches == [16] and tuner.stats.searches == 0 and [k.spec for k in mine("pend_gpu")] == [{"n": 256}]
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x * 2)

    (report,) = [r for r in flyreg.tune_pending() if r.op == "pend_gpu"]
    assert mine("pend_gpu") == [] and tuner.stats.searches == 1
    winner = report.winner.kwargs["CHUNK"]
    del launches[:]
    again = torch.cuda.CUDAGraph()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlyregWarning)  # nothing new to resolve: no capture warning
        with torch.cuda.graph(again):
            tuner(x, out)
    assert launches == [winner]
    x.copy_(torch.randn_like(x))
    out.zero_()
    again.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x * 2)
