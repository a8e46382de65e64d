"""Where a call's config comes from: memory, scratch cache, offline artifact, default, search."""

from __future__ import annotations

import builtins
import io
import json
import os
import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config, DeviceIdentity, FlyregWarning, check_artifacts

import on_disk
from cpu_kernels import FAST, double_op, inputs, launches_per_search
from on_disk import SCRATCH_CACHE, cache_dir, cache_entries, emit, read_json, rewrite_cache_entries, this_device

#: Most call signatures a tuner keeps bound launchers for (docs/autotune_guide.md).
MAX_BOUND = 4096

DEFAULT = Config({"CHUNK": 1})


def test_default_skips_the_search() -> None:
    tuner, rec = double_op("by_default", default=DEFAULT)
    x, out = inputs()
    res = tuner.resolve(x, out)
    assert (res.source, res.origin, res.config) == ("default", "default", DEFAULT)
    assert rec.launches == []  # resolve never launches
    assert torch.equal(tuner(x, out), x * 2)
    assert tuner.stats.searches == 0 and tuner.stats.benchmarks == 0
    assert rec.launches == [(1, {"num_warps": None})]
    assert cache_entries("by_default") == {}  # a default is not a tuning result


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
    path = emit(isolated_dirs["configs"], name, spec, offline_cfg)
    tuner, _ = double_op(name, default=DEFAULT)
    res = tuner.resolve(x, out)
    assert (res.source, res.config, res.path) == ("offline", offline_cfg, str(path))

    cached_cfg = Config({"CHUNK": 256})
    narrow, _ = double_op(name, [cached_cfg])  # a search whose only candidate lands in the scratch cache
    narrow.tune(x, out, emit=False)
    tuner, _ = double_op(name, default=DEFAULT)
    res = tuner.resolve(x, out)
    assert (res.source, res.config, res.path) == ("cache", cached_cfg, str(cache_dir() / SCRATCH_CACHE))

    (cache_dir() / SCRATCH_CACHE).unlink()
    path.unlink()
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
    assert Config.from_json(read_json(artifacts[0])["config"]) == report.winner

    # Plant a stale result in both places; a forced search in a fresh tuner must overwrite them.
    rewrite_cache_entries(name, lambda old: json.dumps({**json.loads(old), "time_ms": -1.0,
                                                         "config": Config({"CHUNK": 999}).to_json()}))
    art = json.loads(artifacts[0].read_text())
    art["config"] = Config({"CHUNK": 999}).to_json()
    artifacts[0].write_text(json.dumps(art))

    fresh, _ = double_op(name, default=DEFAULT)
    assert fresh.resolve(x, out).source == "search"
    (report,) = fresh.reports.values()
    (entry,) = cache_entries(name).values()
    assert entry["time_ms"] == report.winner_ms and Config.from_json(entry["config"]) == report.winner
    assert Config.from_json(read_json(artifacts[0])["config"]) == report.winner

    monkeypatch.delenv("FLYREG_AUTOTUNE")
    later, _ = double_op(name, default=DEFAULT)
    assert later.resolve(x, out).source == "cache"
    assert later.stats.searches == 0


@pytest.mark.parametrize("value, forced", [("1", True), ("true", True), ("ON", True), ("0", False), ("", False)])
def test_forced_autotune_values(monkeypatch: pytest.MonkeyPatch, value: str, forced: bool) -> None:
    monkeypatch.setenv("FLYREG_AUTOTUNE", value)
    tuner, _ = double_op(f"forced_{forced}", default=DEFAULT)
    assert tuner.resolve(*inputs()).source == ("search" if forced else "default")


def test_emit_option_writes_an_artifact(isolated_dirs: dict[str, Path], flyreg_cli: Callable[..., Any]) -> None:
    tuner, _ = double_op("emitting", emit=True)
    tuner(*inputs())
    (report,) = tuner.reports.values()
    assert report.artifact is not None and Path(report.artifact).parent == isolated_dirs["configs"]
    fresh, _ = double_op("emitting")
    assert flyreg_cli("cache", "clear", "emitting").out.startswith("removed 1 cache entry")
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


def _no_io(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """From now on any file opened, any directory listed, any database connected to fails the test; the cache
    and config dirs point at new ones, so a cache read or an artifact lookup would have to connect or list."""
    def forbidden(*a: Any, **kw: Any) -> Any:
        raise AssertionError("file I/O on the steady-state path")

    monkeypatch.setenv("FLYREG_CACHE_DIR", str(tmp_path / "other_cache"))
    monkeypatch.setenv("FLYREG_CONFIG_DIR", str(tmp_path / "other_configs"))
    for module, attr in ((builtins, "open"), (io, "open"), (os, "listdir"), (os, "scandir"), (sqlite3, "connect")):
        monkeypatch.setattr(module, attr, forbidden)


@pytest.mark.parametrize("with_default", [False, True])
def test_steady_state_calls_no_hooks_and_no_io(monkeypatch: pytest.MonkeyPatch, with_default: bool,
                                               tmp_path: Path) -> None:
    tuner, rec = double_op("steady", default=Config({"CHUNK": 64}) if with_default else None, configs_fn=True)
    x, out = inputs()
    for _ in range(3):
        tuner(x, out)
    tuner(x=x, out=out)
    counts = (rec.specialize, rec.configs, rec.default, len(rec.builds))
    assert rec.specialize >= 1 and (rec.default >= 1) == with_default and (rec.configs >= 1) != with_default
    launched = len(rec.launches)
    with pytest.MonkeyPatch.context() as no_io:
        _no_io(no_io, tmp_path)
        for i in range(100):
            out.zero_()
            assert tuner(x, out) is out if i % 2 else tuner(x=x, out=out) is out
    assert (rec.specialize, rec.configs, rec.default, len(rec.builds)) == counts
    assert len(rec.launches) == launched + 100
    assert torch.equal(out, x * 2)


def test_emit_option_searches_a_miss_even_with_a_default(isolated_dirs: dict[str, Path]) -> None:
    tuner, _ = double_op("emitting_default", default=DEFAULT, emit=True)
    assert tuner.resolve(*inputs()).source == "search"
    (report,) = tuner.reports.values()
    assert report.artifact is not None and Path(report.artifact).is_file()
    again, _ = double_op("emitting_default", default=DEFAULT, emit=True)
    res = again.resolve(*inputs())  # its own current artifact is a hit: nothing searched
    assert (res.source, res.path) == ("offline", report.artifact)
    assert again.stats.searches == 0


# -- the in-memory call key ----------------------------------------------------------------------


def _list_op(name: str) -> tuple[Any, list[dict[str, Any]]]:
    """``out = 2 * x``, ``x`` a tensor or the first of a list of them; launches record the spec they were built for."""
    built_for: list[dict[str, Any]] = []

    def first(xs: Any) -> torch.Tensor:
        return xs[0] if isinstance(xs, list) else xs

    def specialize(xs: Any, out: torch.Tensor, flag: Any = None) -> dict[str, Any]:
        return {"n": int(first(xs).shape[0]), "flag": flag}

    def build(config: Config, spec: dict[str, Any]) -> Any:
        def launch(xs: Any, out: torch.Tensor, flag: Any = None) -> torch.Tensor:
            built_for.append(dict(spec))
            return torch.mul(first(xs), 2, out=out)

        return launch

    tuner = flyreg.autotune_builder(name, build, specialize, [Config({"CHUNK": 8})],
                                    lambda spec: Config({"CHUNK": 8}), build_cache=BuildCache(), **FAST)
    return tuner, built_for


def test_lists_of_tensors_are_keyed_by_layout_not_repr() -> None:
    tuner, built_for = _list_op("listed")
    small, big = torch.zeros(1000, 8), torch.zeros(2000, 8)
    assert repr([small]) == repr([big])  # torch summarizes both the same way
    tuner([small], torch.empty_like(small))
    out = torch.empty_like(big)
    assert torch.equal(tuner([big], out), big * 2)
    assert [s["n"] for s in built_for] == [1000, 2000]  # the second call got the launch built for its spec
    tuner([torch.ones(2000, 8)], out)  # another list of the same layout: the same key
    assert tuner.bound_count() == 2 and built_for[-1]["n"] == 2000


@pytest.mark.parametrize("flags", [(1, True, 1.0), (True, 1, 1.0), (1.0, 1, True)])
def test_equal_scalars_of_other_types_are_other_keys(flags: tuple[Any, ...]) -> None:
    tuner, built_for = _list_op("flagged")
    x = torch.randn(16, 8)
    for flag in flags:
        for _ in range(2):
            tuner(x, torch.empty_like(x), flag)
            assert type(built_for[-1]["flag"]) is type(flag)
        tuner(x, torch.empty_like(x), flag=flag)
        assert type(built_for[-1]["flag"]) is type(flag)
    assert [s["flag"] for s in built_for[::3]] == list(flags) and tuner.bound_count() == 6


def test_ever_new_scalars_keep_the_bound_table_bounded() -> None:
    tuner, built_for = _list_op("bounded")
    x = torch.randn(16, 8)
    out = torch.empty_like(x)
    for i in range(MAX_BOUND + 20):  # a new scalar value on every call: a new key each time
        tuner(x, out, float(i))
        assert tuner.bound_count() <= MAX_BOUND
    assert torch.equal(out, x * 2) and tuner.bound_count() == MAX_BOUND
    assert not tuner.is_bound(x, torch.empty_like(x), 0.0)  # the oldest went first
    assert torch.equal(tuner(x, torch.empty_like(x), 0.0), x * 2)  # and is bound again when called again
    assert tuner.stats.searches == 0


def test_unhashable_arguments_are_resolved_but_not_remembered() -> None:
    def specialize(x: torch.Tensor, out: torch.Tensor, opts: dict[str, Any]) -> dict[str, Any]:
        return {"n": int(x.shape[0]), "scale": opts["scale"]}

    def build(config: Config, spec: dict[str, Any]) -> Any:
        return lambda x, out, opts: torch.mul(x, opts["scale"], out=out)

    tuner = flyreg.autotune_builder("unhashable", build, specialize, [Config({"CHUNK": 8})],
                                    lambda spec: Config({"CHUNK": 8}), build_cache=BuildCache(), **FAST)
    x = torch.randn(16, 8)
    for scale in (2.0, 3.0, 2.0):
        out = torch.empty_like(x)
        assert torch.equal(tuner(x, out, {"scale": scale}), x * scale)
    assert tuner.bound_count() == 0 and tuner.resolve(x, out, {"scale": 2.0}).source == "memory"


# -- emission --------------------------------------------------------------------------------------


def _only_artifact(directory: Path, name: str) -> Path:
    (path,) = directory.glob(f"{name},*.json")
    return path


@pytest.mark.parametrize("planted", ["scratch cache", "sibling product", "stale artifact", "nearest spec", "default"])
def test_emit_searches_and_writes_whatever_else_would_serve(planted: str, isolated_dirs: dict[str, Path]) -> None:
    name = f"emit_{planted.replace(' ', '_')}"
    x, out = inputs()
    spec = {"n": int(x.shape[0])}
    cpu = this_device()
    configs = isolated_dirs["configs"]
    planted_cfg = Config({"CHUNK": 16})
    options: dict[str, Any] = {"ordered_axes": ["n"]}
    if planted == "scratch cache":
        double_op(name, [planted_cfg])[0].tune(x, out, emit=False)
    elif planted == "sibling product":
        on_disk.write_artifact(configs, name, spec, planted_cfg, device=DeviceIdentity("Other_CPU", cpu.arch))
    elif planted == "stale artifact":
        emit(configs, name, spec, planted_cfg)
        options["version"] = "1"  # the artifact is from op version 0
    elif planted == "nearest spec":
        emit(configs, name, {"n": 128}, planted_cfg)
    else:
        options["default"] = DEFAULT
    plain, _ = double_op(name, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlyregWarning)  # serving a sibling's or a stale artifact warns
        assert plain.resolve(x, out).source != "search"  # without emission, it serves the planted config

    tuner, _ = double_op(name, emit=True, **options)
    res = tuner.resolve(x, out)
    assert res.source == "search" and tuner.stats.searches == 1
    (report,) = tuner.reports.values()
    art = read_json(str(report.artifact))
    assert (art["spec"], art["device"], Config.from_json(art["config"])) == \
        (spec, {"name": cpu.name, "arch": cpu.arch}, report.winner)
    problems = check_artifacts([Path(str(report.artifact)).parent], {name: options.get("version", "0")})
    assert str(report.artifact) not in {str(p.path) for p in problems}  # current

    again, _ = double_op(name, emit=True, **options)  # now the key has its own artifact: a hit
    assert again.resolve(x, out).source == "offline" and again.stats.searches == 0


def test_emit_failure_on_a_call_warns_once_and_serves_from_memory(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    not_a_dir = tmp_path / "configs_file"
    not_a_dir.write_text("")
    monkeypatch.setenv("FLYREG_CONFIG_DIR", str(not_a_dir))
    tuner, _ = double_op("emit_broken", emit=True)
    x, out = inputs()
    with pytest.warns(FlyregWarning, match=r"emit_broken: could not write the artifact.*configs_file.*from memory"):
        assert torch.equal(tuner(x, out), x * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            assert torch.equal(tuner(x, out), x * 2)
    assert tuner.stats.searches == 1 and tuner.resolve(x, out).source == "memory"
    (report,) = tuner.reports.values()
    assert report.artifact is None
    assert len(cache_entries("emit_broken")) == 1  # the scratch cache still has it

    with pytest.raises(OSError, match=r"emit_broken: could not write the artifact.*configs_file"):
        tuner.tune(x, out)
    assert tuner.stats.searches == 2 and tuner.resolve(x, out).source == "memory"
    with pytest.raises(OSError, match="emit_broken"):
        tuner.tune(x, out, out_dir=not_a_dir)
