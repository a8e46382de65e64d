"""Where a call's config comes from: memory, scratch cache, offline artifact, default, search."""

from __future__ import annotations

import builtins
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from flyreg import Config, cache, offline
from flyreg.keys import identity_of
from flyreg.offline import emit_artifact, load_artifact

from cpu_kernels import FAST, double_op, inputs

DEFAULT = Config({"CHUNK": 1})


def launches_per_search(tuner: Any) -> int:
    return tuner.stats.benchmarks * (FAST["warmup"] + FAST["rep"])


def test_default_skips_the_search() -> None:
    tuner, rec = double_op("by_default", default=DEFAULT)
    x, out = inputs()
    res = tuner.resolve(x, out)
    assert (res.source, res.origin, res.config) == ("default", "default", DEFAULT)
    assert rec.launches == []  # resolve never launches
    assert torch.equal(tuner(x, out), x * 2)
    assert tuner.stats.searches == 0 and tuner.stats.benchmarks == 0
    assert rec.launches == [(1, {"num_warps": None})]
    assert cache.load("by_default") == {}  # a default is not a tuning result


def test_no_default_searches() -> None:
    tuner, rec = double_op("no_default")
    x, out = inputs()
    res = tuner.resolve(x, out)
    assert res.source == "search" and tuner.stats.searches == 1
    assert len(rec.launches) == launches_per_search(tuner)  # the search's launches, no real call
    assert tuner.resolve(x, out).source == "memory"
    assert len(rec.launches) == launches_per_search(tuner)
    tuner(x, out)
    assert len(rec.launches) == launches_per_search(tuner) + 1
    assert res.config == tuner.resolve(x, out).config and res.config in [Config({"CHUNK": c}) for c in (1, 16, 256)]


def test_lookup_order(isolated_dirs: dict[str, Path]) -> None:
    x, out = inputs()
    spec = {"n": int(x.shape[0])}
    name = "ordered"

    tuner, _ = double_op(name, default=DEFAULT)
    assert (tuner.resolve(x, out).source, tuner.resolve(x, out).config) == ("default", DEFAULT)

    offline_cfg = Config({"CHUNK": 16})
    path = emit_artifact(name, spec, identity_of(None), offline_cfg, "0", None, None)
    assert path.parent == isolated_dirs["configs"]
    offline._index.clear()
    tuner, _ = double_op(name, default=DEFAULT)
    res = tuner.resolve(x, out)
    assert (res.source, res.config, res.path) == ("offline", offline_cfg, str(path))

    cached_cfg = Config({"CHUNK": 256})
    narrow, _ = double_op(name, [cached_cfg])  # a search whose only candidate lands in the scratch cache
    narrow.tune(x, out, emit=False)
    tuner, _ = double_op(name, default=DEFAULT)
    res = tuner.resolve(x, out)
    assert (res.source, res.config, res.path) == ("cache", cached_cfg, str(cache.cache_file(name)))

    cache.clear(name)
    path.unlink()
    offline._index.clear()
    res = tuner.resolve(x, out)
    assert (res.source, res.origin, res.config) == ("memory", "cache", cached_cfg)
    assert tuner.stats.searches == 0


def test_forced_autotune_searches_and_rewrites(monkeypatch: pytest.MonkeyPatch,
                                               isolated_dirs: dict[str, Path]) -> None:
    x, out = inputs()
    name = "forced"
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    tuner, _ = double_op(name, default=DEFAULT)
    assert torch.equal(tuner(x, out), x * 2)
    assert tuner.stats.searches == 1 and tuner.stats.benchmarks == 3
    (report,) = tuner.reports.values()
    artifacts = list(isolated_dirs["configs"].glob(f"{name},*.json"))
    assert [str(p) for p in artifacts] == [report.artifact]
    assert load_artifact(artifacts[0]).config == report.winner

    # Plant a stale result in both places; a forced search in a fresh tuner must overwrite them.
    path = cache.cache_file(name)
    data = json.loads(path.read_text())
    (key,) = data["entries"]
    data["entries"][key].update(time_ms=-1.0, config=Config({"CHUNK": 999}).to_json())
    path.write_text(json.dumps(data))
    art = json.loads(artifacts[0].read_text())
    art["config"] = Config({"CHUNK": 999}).to_json()
    artifacts[0].write_text(json.dumps(art))

    fresh, _ = double_op(name, default=DEFAULT)
    assert fresh.resolve(x, out).source == "search"
    (report,) = fresh.reports.values()
    entry = cache.load(name)[key]
    assert entry["time_ms"] == report.winner_ms and Config.from_json(entry["config"]) == report.winner
    assert load_artifact(artifacts[0]).config == report.winner

    monkeypatch.delenv("FLYREG_AUTOTUNE")
    offline._index.clear()
    later, _ = double_op(name, default=DEFAULT)
    assert later.resolve(x, out).source == "cache"
    assert later.stats.searches == 0


@pytest.mark.parametrize("value, forced", [("1", True), ("true", True), ("ON", True), ("0", False), ("", False)])
def test_forced_autotune_values(monkeypatch: pytest.MonkeyPatch, value: str, forced: bool) -> None:
    monkeypatch.setenv("FLYREG_AUTOTUNE", value)
    tuner, _ = double_op(f"forced_{forced}", default=DEFAULT)
    assert tuner.resolve(*inputs()).source == ("search" if forced else "default")


def test_emit_option_writes_an_artifact(isolated_dirs: dict[str, Path]) -> None:
    tuner, _ = double_op("emitting", emit=True)
    tuner(*inputs())
    (report,) = tuner.reports.values()
    assert report.artifact is not None and Path(report.artifact).parent == isolated_dirs["configs"]
    fresh, _ = double_op("emitting")
    cache.clear("emitting")
    assert fresh.resolve(*inputs()).source == "offline"


def test_resolve_spec() -> None:
    tuner, _ = double_op("by_spec", default=DEFAULT)
    assert tuner.resolve_spec({"n": 256}).source == "default"
    bare, _ = double_op("by_spec_bare")
    with pytest.raises(LookupError, match="by_spec_bare"):
        bare.resolve_spec({"n": 256})
    bare(*inputs())
    assert bare.resolve_spec({"n": 256}).source == "memory"
    assert double_op("by_spec_bare")[0].resolve_spec({"n": 256}).source == "cache"


def test_resolve_after_tune_serves_the_new_winner() -> None:
    tuner, rec = double_op("retuned", default=DEFAULT)
    x, out = inputs()
    tuner(x, out)
    report = tuner.tune(x, out, emit=False)
    rec.launches.clear()
    tuner(x, out)
    assert rec.launches == [(report.winner.kwargs["CHUNK"], {"num_warps": None})]


# -- the steady state ---------------------------------------------------------------------------


def _no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*a: Any, **kw: Any) -> Any:
        raise AssertionError("file I/O on the steady-state path")

    for module, attr in ((cache, "load"), (cache, "store"), (offline, "index"), (offline, "load_artifact"),
                         (builtins, "open"), (io, "open")):
        monkeypatch.setattr(module, attr, forbidden)


@pytest.mark.parametrize("with_default", [False, True])
def test_steady_state_calls_no_hooks_and_no_io(monkeypatch: pytest.MonkeyPatch, with_default: bool) -> None:
    tuner, rec = double_op("steady", default=Config({"CHUNK": 64}) if with_default else None, configs_fn=True)
    x, out = inputs()
    for _ in range(3):
        tuner(x, out)
    tuner(x=x, out=out)
    counts = (rec.specialize, rec.configs, rec.default, len(rec.builds))
    assert rec.specialize >= 1 and (rec.default >= 1) == with_default and (rec.configs >= 1) != with_default
    launched = len(rec.launches)
    _no_io(monkeypatch)
    for i in range(100):
        out.zero_()
        assert tuner(x, out) is out if i % 2 else tuner(x=x, out=out) is out
    monkeypatch.undo()
    assert (rec.specialize, rec.configs, rec.default, len(rec.builds)) == counts
    assert len(rec.launches) == launched + 100
    assert torch.equal(out, x * 2)


def test_emit_option_searches_a_miss_even_with_a_default(isolated_dirs: dict[str, Path]) -> None:
    tuner, _ = double_op("emitting_default", default=DEFAULT, emit=True)
    assert tuner.resolve(*inputs()).source == "search"
    (report,) = tuner.reports.values()
    assert report.artifact is not None and Path(report.artifact).is_file()
    again, _ = double_op("emitting_default", default=DEFAULT, emit=True)
    assert again.resolve(*inputs()).source == "cache"  # a hit is no miss: nothing searched
    assert again.stats.searches == 0
