"""Offline artifacts: emission, lookup order, device matching, nearest lookup, staleness, bad files.

Every tuner here is a real builder-mode tuner over a small CPU kernel whose cost depends on its
``CHUNK`` knob: the default (``CHUNK=16``) is the slowest config, so the search picks another one
and a served artifact is told apart from the default.
"""

from __future__ import annotations

import errno
import json
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import flyreg
from flyreg import BuildCache, Config, DeviceIdentity, FlyregWarning, check_artifacts

import on_disk
from on_disk import artifact_name, emit, this_device, this_toolchain

#: The artifact schema, and the most bytes of an artifact lookup reads (docs/autotune_guide.md, architecture.md).
SCHEMA, MAX_ARTIFACT_BYTES = 1, 1 << 20

OP = "chunk_sum"
N = 4096
CHUNKS = (16, 256, 4096)
DEFAULT = Config({"CHUNK": 16})
SPEC = {"N": N, "dtype": "float32"}
SAFE_NAME = re.compile(r"[A-Za-z0-9._=,-]+\.json")


def build(config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
    chunk = config.kwargs["CHUNK"]

    def launch(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        out.zero_()
        for i in range(0, x.numel(), chunk):  # N / CHUNK small ops: a small CHUNK is slow
            out += x[i:i + chunk].sum()
        return out

    return launch


def specialize(x: torch.Tensor, out: torch.Tensor) -> dict[str, Any]:
    return {"N": x.numel(), "dtype": str(x.dtype).removeprefix("torch.")}


def make_tuner(name: str = OP, specialize_fn: Callable[..., dict[str, Any]] = specialize, **options: Any) -> Any:
    return flyreg.autotune_builder(
        name, build, specialize_fn, [Config({"CHUNK": c}) for c in CHUNKS], lambda spec: DEFAULT,
        warmup=1, rep=3, build_cache=BuildCache(), **options,
    )


def inputs(n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(n), torch.zeros(())


CPU = this_device()


def write_artifact(directory: Path, config: Config, spec: dict[str, Any] = SPEC, device: DeviceIdentity = CPU,
                   op: str = OP, op_version: str = "0") -> Path:
    """This machine's artifact emitted by a search (which this process's lookups then see at once); another
    device's written in the documented format (write it before this process looks into ``directory``)."""
    if device == CPU:
        return emit(directory, op, spec, config, op_version)
    return on_disk.write_artifact(directory, op, spec, config, device=device, op_version=op_version)


def canonical(spec: dict[str, Any]) -> str:
    """A spec as artifacts compare it (docs/autotune_guide.md): sorted, an integral float as the int it equals."""
    return json.dumps({k: int(v) if isinstance(v, float) and v.is_integer() and abs(v) <= 2**53 else v
                       for k, v in spec.items()}, sort_keys=True)


def fresh_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A new empty scratch cache, as another process on this machine would have."""
    cache = tmp_path / f"cache{len(list(tmp_path.iterdir()))}"
    cache.mkdir()
    monkeypatch.setenv("FLYREG_CACHE_DIR", str(cache))


def fresh_config_dir(monkeypatch: pytest.MonkeyPatch, directory: Path) -> Path:
    """``directory`` (new) as the config dir: one this process has not listed yet."""
    directory.mkdir(parents=True)
    monkeypatch.setenv("FLYREG_CONFIG_DIR", str(directory))
    return directory


def flyreg_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, FlyregWarning)]


# -- emission and serving ----------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["env", "emit_option", "tune"])
def test_emit_then_fresh_tuner_serves_artifact_without_benchmarks(
        how: str, isolated_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    x, out = inputs()
    if how == "env":
        monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
        first = make_tuner()
        assert first.resolve(x, out).source == "search"
    elif how == "emit_option":  # emit=True writes what a search finds; with no default, the first call searches
        first = flyreg.autotune_builder(OP, build, specialize, [Config({"CHUNK": c}) for c in CHUNKS], None,
                                        warmup=1, rep=3, build_cache=BuildCache(), emit=True)
        assert first.resolve(x, out).source == "search"
    else:
        first = make_tuner()
        first.tune(x, out)
    monkeypatch.delenv("FLYREG_AUTOTUNE", raising=False)
    report = next(iter(first.reports.values()))
    assert first.stats.searches == 1 and report.winner != DEFAULT
    if how != "emit_option":
        assert report.default_ms is not None
    path = Path(report.artifact)
    assert path == isolated_dirs["configs"] / artifact_name(OP, SPEC, CPU.name)
    assert os.listdir(isolated_dirs["configs"]) == [path.name]  # no temp file left behind

    data = json.loads(path.read_text())
    assert data["op"] == OP and data["spec"] == SPEC and data["device"] == CPU.to_json()
    assert Config.from_json(data["config"]) == report.winner
    prov = data["provenance"]
    assert data["schema"] == SCHEMA and prov["toolchain"] == this_toolchain("0")
    assert prov["time_ms"] == report.winner_ms and prov["default_ms"] == report.default_ms
    assert prov["date"] and (prov["default_ms"] is None or prov["default_ms"] > prov["time_ms"])

    fresh_cache(monkeypatch, tmp_path)
    second = make_tuner()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        res = second.resolve(x, out)
        y = second(x, out)
    assert flyreg_warnings(record) == []
    assert (res.source, res.origin, res.path) == ("offline", "offline", str(path))
    assert res.config == report.winner != DEFAULT
    assert not res.stale and not res.nearest
    assert float(y) == N
    assert second.stats.benchmarks == 0 and second.stats.searches == 0


def test_without_artifact_a_fresh_tuner_serves_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    tuner = make_tuner()
    res = tuner.resolve(*inputs())
    assert (res.source, res.config) == ("default", DEFAULT)


def test_int_float_round_trip(isolated_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                              tmp_path: Path) -> None:
    """specialize() giving 4096.0 finds its own artifact, and so does one giving 4096 (same value)."""
    def float_spec(x: torch.Tensor, out: torch.Tensor) -> dict[str, Any]:
        return {"N": float(x.numel()), "dtype": "float32", "eps": 1e-6}

    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    make_tuner(specialize_fn=float_spec)(*inputs())
    monkeypatch.delenv("FLYREG_AUTOTUNE")
    (name,) = os.listdir(isolated_dirs["configs"])
    assert name == f"{OP},N=4096,dtype=float32,eps=1e-06,device_name={CPU.name}.json"

    fresh_cache(monkeypatch, tmp_path)
    again = make_tuner(specialize_fn=float_spec)
    res = again.resolve(*inputs())
    assert res.source == "offline" and res.config != DEFAULT and again.stats.benchmarks == 0
    as_int = make_tuner().resolve_spec({"N": N, "dtype": "float32", "eps": 1e-6})
    assert as_int.source == "offline" and as_int.config == res.config
    # but a bool, a string or another float is another value
    for other in ({"N": "4096"}, {"eps": 1e-5}, {"dtype": True}):
        assert make_tuner().resolve_spec({"N": N, "dtype": "float32", "eps": 1e-6, **other}).source == "default"


def test_tuple_spec_values_are_rejected_not_collided(isolated_dirs: dict[str, Path]) -> None:
    """A tuple would read back from JSON as a list: rejected up front, at call, emit and lookup."""
    def tuple_spec(x: torch.Tensor, out: torch.Tensor) -> dict[str, Any]:
        return {"shape": tuple(x.shape)}

    with pytest.raises(TypeError, match="JSON scalar"):
        make_tuner(specialize_fn=tuple_spec, emit=True)(*inputs())
    with pytest.raises(TypeError, match="JSON scalar"):
        write_artifact(isolated_dirs["configs"], DEFAULT, {"shape": (4096,)})
    with pytest.raises(TypeError, match="JSON scalar"):
        make_tuner().resolve_spec({"shape": [4096]})
    assert os.listdir(isolated_dirs["configs"]) == []


# -- malformed files ------------------------------------------------------------------------------------
def _set(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def mutate(data: dict[str, Any]) -> dict[str, Any]:
        data[key] = value
        return data
    return mutate


def _drop(key: str) -> Callable[[dict[str, Any]], Any]:
    def mutate(data: dict[str, Any]) -> dict[str, Any]:
        del data[key]
        return data
    return mutate


MALFORMED: dict[str, Callable[[dict[str, Any]], Any] | bytes] = {
    "unparseable": b'{"op": "chunk_sum", ',
    "empty": b"",
    "not_utf8": b'{"op": "\xff\xfe"}',
    "deeply_nested": b"[" * 200_000,
    "too_large": b" " * (MAX_ARTIFACT_BYTES + 1) + b"{}",
    "top_level_list": lambda d: [d],
    "missing_config": _drop("config"),
    "missing_spec": _drop("spec"),
    "missing_provenance": _drop("provenance"),
    "missing_schema": _drop("schema"),
    "schema_2": _set("schema", 2),
    "schema_true": _set("schema", True),
    "spec_null": _set("spec", None),
    "spec_list_value": _set("spec", {"N": [4096], "dtype": "float32"}),
    "op_null": _set("op", None),
    "device_null": _set("device", None),
    "device_name_int": _set("device", {"name": 1, "arch": CPU.arch}),
    "provenance_null": _set("provenance", None),
    "toolchain_string": _set("provenance", {"toolchain": "torch 2"}),
    "config_null": _set("config", None),
    "config_unknown_field": _set("config", {"kwargs": {"CHUNK": 4096}, "extra": 1}),
    "config_kwargs_list": _set("config", {"kwargs": [4096]}),
    "config_reserved_hint": _set("config", {"kwargs": {"CHUNK": 4096}, "hints": {"pre_hook": 1}}),
    "config_nan": _set("config", {"kwargs": {"CHUNK": float("nan")}}),
    "unknown_knob": _set("config", {"kwargs": {"CHUNK": 4096, "BOGUS": 2}}),
    "renamed_knob": _set("config", {"kwargs": {"BLOCK": 4096}}),
    "no_knobs": _set("config", {"kwargs": {}, "hints": {"num_warps": 4}}),
    # read back fine but not the call's identity
    "other_op": _set("op", "other_op"),
    "other_spec": _set("spec", {"N": 8192, "dtype": "float32"}),
    "spec_bool_for_int": _set("spec", {"N": True, "dtype": "float32"}),
    "spec_string_for_int": _set("spec", {"N": "4096", "dtype": "float32"}),
    "spec_extra_axis": _set("spec", {**SPEC, "M": 1}),
    "other_device_name": _set("device", {"name": "Other_CPU", "arch": CPU.arch}),
    "other_arch_same_name": _set("device", {"name": CPU.name, "arch": "sm_90"}),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_artifact_warns_once_and_serves_default(case: str, isolated_dirs: dict[str, Path],
                                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = write_artifact(isolated_dirs["configs"], Config({"CHUNK": 4096}))
    mutate = MALFORMED[case]
    if isinstance(mutate, bytes):
        path.write_bytes(mutate)
    else:
        path.write_text(json.dumps(mutate(json.loads(path.read_text()))))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):  # a second tuner, a second lookup: no second warning
            fresh_cache(monkeypatch, tmp_path)
            tuner = make_tuner()
            res = tuner.resolve(*inputs())
            assert (res.source, res.config) == ("default", DEFAULT)
            assert float(tuner(*inputs())) == N
    messages = flyreg_warnings(record)
    assert len(messages) == 1, messages
    assert str(path) in messages[0]
    # knobs are the op's to judge and a product name may be reused by another arch: the rest is the file's fault
    if case not in ("unknown_knob", "renamed_knob", "no_knobs", "other_arch_same_name"):
        assert check_artifacts([isolated_dirs["configs"]], {OP: "0"}) != []  # the validator flags it too


def test_malformed_file_falls_through_to_the_next_directory(isolated_dirs: dict[str, Path], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    good = write_artifact(second, Config({"CHUNK": 256}))
    write_artifact(first, Config({"CHUNK": 4096})).write_text("{")
    monkeypatch.setenv("FLYREG_CONFIG_DIR", os.pathsep.join([str(first), str(second)]))
    with pytest.warns(FlyregWarning, match="malformed"):
        res = make_tuner().resolve_spec(SPEC)
    assert (res.source, res.path, res.config) == ("offline", str(good), Config({"CHUNK": 256}))


# -- filenames and path traversal ------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["../../evil", "..", "a/b", "/abs/op", "x\\y", ".hidden", "op,N=1", "spaced op"])
def test_traversal_through_op_names_stays_in_dir(op: str, isolated_dirs: dict[str, Path],
                                                  monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    configs = isolated_dirs["configs"]
    before = {p for p in configs.parent.rglob("*")}
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    make_tuner(name=op)(*inputs())
    monkeypatch.delenv("FLYREG_AUTOTUNE")
    (name,) = os.listdir(configs)
    assert SAFE_NAME.fullmatch(name) and not name.startswith(".")
    assert (configs / name).resolve().parent == configs.resolve()
    created = {p for p in configs.parent.rglob("*")} - before
    assert {p for p in created if p.suffix == ".json" and p.parent != isolated_dirs["cache"]} == {configs / name}
    fresh_cache(monkeypatch, tmp_path)
    res = make_tuner(name=op).resolve(*inputs())
    assert res.source == "offline" and res.config != DEFAULT
    assert make_tuner(name=OP).resolve(*inputs()).source == "default"  # not anyone else's


@pytest.mark.parametrize("value", ["../x", "a/b", "..", ".", "/etc/passwd", "x,device_name=y", "a=b", "", "é"])
def test_traversal_through_spec_values_stays_in_dir(value: str, isolated_dirs: dict[str, Path]) -> None:
    configs = isolated_dirs["configs"]
    spec = {"N": N, "dtype": value}
    path = write_artifact(configs, Config({"CHUNK": 4096}), spec)
    assert path.resolve().parent == configs.resolve() and os.listdir(configs) == [path.name]
    assert SAFE_NAME.fullmatch(path.name)
    res = make_tuner().resolve_spec(spec)
    assert (res.source, res.path) == ("offline", str(path))
    assert make_tuner().resolve_spec({"N": N, "dtype": "x"}).source == "default"


def test_values_that_sanitize_alike_get_distinct_files(isolated_dirs: dict[str, Path]) -> None:
    specs = [{"v": "a/b"}, {"v": "a_b"}, {"v": "a b"}, {"v": "8192"}, {"v": 8192}, {"v": True}, {"v": "true"},
             {"v": None}, {"v": "null"}, {"v": 0.5}, {"v": "0.5"}]
    paths = [write_artifact(isolated_dirs["configs"], Config({"CHUNK": 256}), s) for s in specs]
    assert len(set(paths)) == len(specs) and len(os.listdir(isolated_dirs["configs"])) == len(specs)
    assert all(SAFE_NAME.fullmatch(p.name) for p in paths)
    assert check_artifacts([isolated_dirs["configs"]]) == []  # each one a name lookup reads, and its content's
    for spec, path in zip(specs, paths):
        assert make_tuner().resolve_spec(spec).path == str(path)


# -- lookup order ---------------------------------------------------------------------------------------
def test_two_config_dirs_first_wins_and_emission_goes_to_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    in_second = write_artifact(second, Config({"CHUNK": 256}))
    monkeypatch.setenv("FLYREG_CONFIG_DIR", os.pathsep.join([str(first), str(second)]))
    res = make_tuner().resolve_spec(SPEC)
    assert (res.source, res.path, res.config) == ("offline", str(in_second), Config({"CHUNK": 256}))

    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    make_tuner()(*inputs())
    monkeypatch.delenv("FLYREG_AUTOTUNE")
    (emitted,) = first.iterdir()
    fresh_cache(monkeypatch, tmp_path)
    res = make_tuner().resolve_spec(SPEC)
    assert (res.source, res.path, res.config) == ("offline", str(emitted), Config({"CHUNK": 4096}))


def test_user_dir_when_config_dir_unset(isolated_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    monkeypatch.delenv("FLYREG_CONFIG_DIR")
    user = isolated_dirs["xdg_config"] / "flyreg"  # the user config dir (platformdirs)
    monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
    make_tuner()(*inputs())
    monkeypatch.delenv("FLYREG_AUTOTUNE")
    (path,) = user.iterdir()
    assert os.listdir(isolated_dirs["configs"]) == []
    fresh_cache(monkeypatch, tmp_path)
    tuner = make_tuner()
    res = tuner.resolve(*inputs())
    assert (res.source, res.path) == ("offline", str(path)) and res.config != DEFAULT
    assert tuner.stats.benchmarks == 0


def test_env_dir_beats_user_dir_beats_plugin_dir(isolated_dirs: dict[str, Path], tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    user = isolated_dirs["xdg_config"] / "flyreg"
    in_plugin = write_artifact(plugin, Config({"CHUNK": 16}))
    assert make_tuner(config_dirs=[plugin]).resolve_spec(SPEC).path == str(in_plugin)
    write_artifact(user, Config({"CHUNK": 256}))
    assert make_tuner(config_dirs=[plugin]).resolve_spec(SPEC).config == Config({"CHUNK": 256})
    write_artifact(isolated_dirs["configs"], Config({"CHUNK": 4096}))
    assert make_tuner(config_dirs=[plugin]).resolve_spec(SPEC).config == Config({"CHUNK": 4096})


def test_directories_are_listed_once_per_process(isolated_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    for n in (1024, 2048):
        write_artifact(plugin, Config({"CHUNK": 256}), {"N": n, "dtype": "float32"})
    calls: list[str] = []
    real_listdir, real_scandir = os.listdir, os.scandir

    def listdir(path: Any = ".") -> list[str]:
        calls.append(f"listdir {path}")
        return real_listdir(path)

    def scandir(path: Any = ".") -> Any:
        if not isinstance(path, int):  # by descriptor: this test's helpers removing their temporary dirs
            calls.append(f"scandir {path}")
        return real_scandir(path)

    dirs = [isolated_dirs["configs"], isolated_dirs["xdg_config"] / "flyreg", plugin]  # FLYREG_CONFIG_DIR, user, plugin
    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    for n in (1024, 2048, 3000, 5000, 7, 8192):
        for dtype in ("float32", "float16"):
            make_tuner(config_dirs=[plugin], ordered_axes=["N"]).resolve_spec({"N": n, "dtype": dtype})
    assert sorted(calls) == sorted(f"listdir {d}" for d in dirs)  # each lookup dir once, nothing else
    first = len(calls)
    # an emission updates the listing it wrote into; the directory is listed once more, by the first
    # write into it in this process (which removes killed writers' temp files), and never again
    path = write_artifact(isolated_dirs["configs"], Config({"CHUNK": 4096}))
    res = make_tuner(config_dirs=[plugin]).resolve_spec(SPEC)
    assert (res.source, res.path) == ("offline", str(path))
    assert calls[first:] == [f"listdir {isolated_dirs['configs']}"]
    write_artifact(isolated_dirs["configs"], Config({"CHUNK": 1024}))
    assert len(calls) == first + 1


# -- device matching -----------------------------------------------------------------------------------
def test_same_arch_other_product_served_with_warning(isolated_dirs: dict[str, Path]) -> None:
    sibling = DeviceIdentity("Other_CPU_9000", CPU.arch)
    path = write_artifact(isolated_dirs["configs"], Config({"CHUNK": 256}), device=sibling)
    with pytest.warns(FlyregWarning, match="same arch"):
        res = make_tuner().resolve_spec(SPEC)
    assert (res.source, res.path, res.config) == ("offline-other-device", str(path), Config({"CHUNK": 256}))


def test_exact_product_beats_same_arch(isolated_dirs: dict[str, Path], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write_artifact(first, Config({"CHUNK": 256}), device=DeviceIdentity("Other_CPU", CPU.arch))
    exact = write_artifact(second, Config({"CHUNK": 4096}))
    monkeypatch.setenv("FLYREG_CONFIG_DIR", os.pathsep.join([str(first), str(second)]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlyregWarning)
        res = make_tuner().resolve_spec(SPEC)
    assert (res.path, res.config) == (str(exact), Config({"CHUNK": 4096}))


def test_never_across_architectures(isolated_dirs: dict[str, Path]) -> None:
    for name, arch in (("NVIDIA_H200", "sm_90"), ("AMD_Instinct_MI300X", "gfx942"), ("Other_CPU", "cpu-riscv64")):
        write_artifact(isolated_dirs["configs"], Config({"CHUNK": 4096}), device=DeviceIdentity(name, arch))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlyregWarning)  # sound files of other arches are skipped silently
        res = make_tuner(ordered_axes=["N"]).resolve_spec(SPEC)
        near = make_tuner(ordered_axes=["N"]).resolve_spec({"N": 2048, "dtype": "float32"})
    assert res.source == near.source == "default"
    problems = check_artifacts([isolated_dirs["configs"]], {OP: "0"}, accepts=lambda op, spec, config: None)
    assert {p.severity for p in problems} <= {"stale"}  # sound files, each for its own device


# -- nearest lookup ------------------------------------------------------------------------------------
def test_nearest_lookup_over_ordered_axes(isolated_dirs: dict[str, Path]) -> None:
    configs = isolated_dirs["configs"]
    small = write_artifact(configs, Config({"CHUNK": 256}), {"N": 1024, "dtype": "float32"})
    write_artifact(configs, Config({"CHUNK": 4096}), {"N": 16384, "dtype": "float32"})
    write_artifact(configs, Config({"CHUNK": 4096}), {"N": 2048, "dtype": "float16"})  # other fixed axis
    res = make_tuner(ordered_axes=["N"]).resolve_spec({"N": 2048, "dtype": "float32"})
    assert (res.source, res.path, res.nearest) == ("offline-nearest", str(small), True)
    assert res.config == Config({"CHUNK": 256})
    big = make_tuner(ordered_axes=["N"]).resolve_spec({"N": 10000, "dtype": "float32"})
    assert big.nearest and big.config == Config({"CHUNK": 4096})
    assert make_tuner().resolve_spec({"N": 2048, "dtype": "float32"}).source == "default"  # no ordered axes
    assert make_tuner(ordered_axes=["N"]).resolve_spec({"N": 2048, "dtype": "bfloat16"}).source == "default"
    assert make_tuner(ordered_axes=["N"]).resolve_spec({"N": 2048, "dtype": "float32", "M": 1}).source == "default"

    exact = write_artifact(configs, Config({"CHUNK": 16}), {"N": 2048, "dtype": "float32"})
    res = make_tuner(ordered_axes=["N"]).resolve_spec({"N": 2048, "dtype": "float32"})
    assert (res.path, res.nearest, res.config) == (str(exact), False, Config({"CHUNK": 16}))


def test_nearest_skips_bad_neighbours(isolated_dirs: dict[str, Path]) -> None:
    configs = isolated_dirs["configs"]
    write_artifact(configs, Config({"CHUNK": 256}), {"N": 1024, "dtype": "float32"}).write_text("[")
    far = write_artifact(configs, Config({"CHUNK": 4096}), {"N": 65536, "dtype": "float32"})
    with pytest.warns(FlyregWarning, match="malformed"):
        res = make_tuner(ordered_axes=["N"]).resolve_spec({"N": 2048, "dtype": "float32"})
    assert (res.path, res.nearest) == (str(far), True)


def test_nearest_skips_a_neighbour_the_op_would_not_take_here_silently(isolated_dirs: dict[str, Path]) -> None:
    configs = isolated_dirs["configs"]
    write_artifact(configs, Config({"CHUNK": 8}), {"N": 1024, "dtype": "float32"})  # not in this op's space
    far = write_artifact(configs, Config({"CHUNK": 4096}), {"N": 65536, "dtype": "float32"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlyregWarning)  # a sound neighbour that does not fit is no problem
        res = make_tuner(ordered_axes=["N"]).resolve_spec({"N": 2048, "dtype": "float32"})
    assert (res.path, res.nearest) == (str(far), True)


# -- staleness ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("edit", ["torch", "op_version"])
def test_stale_artifact_served_and_reported(edit: str, isolated_dirs: dict[str, Path]) -> None:
    configs = isolated_dirs["configs"]
    path = write_artifact(configs, Config({"CHUNK": 4096}))
    version = "0"
    if edit == "torch":
        data = json.loads(path.read_text())
        data["provenance"]["toolchain"]["torch"] = "1.0.0"
        path.write_text(json.dumps(data))
    else:
        version = "2"
    with pytest.warns(FlyregWarning, match="stale"):
        res = make_tuner(version=version).resolve_spec(SPEC)
    assert (res.source, res.stale, res.config) == ("offline-other-toolchain", True, Config({"CHUNK": 4096}))
    problems = check_artifacts([configs], {OP: version})
    assert [(p.path, p.severity) for p in problems] == [(path, "stale")]


# -- properties ---------------------------------------------------------------------------------------------
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                    max_leaves=8)
FIELDS = ("schema", "op", "spec", "device", "config", "provenance")
DEVICE_NAMES = st.sampled_from([CPU.name, "Other_CPU", "NVIDIA_H200", "Intel Xeon"])


def _valid(config: int, n: Any, dtype: Any, op: str, device: dict[str, str], toolchain: bool) -> dict[str, Any]:
    return {"schema": 1, "op": op, "spec": {"N": n, "dtype": dtype}, "device": device,
            "config": {"kwargs": {"CHUNK": config}, "hints": {}},
            "provenance": {"toolchain": this_toolchain("0") if toolchain else {"torch": "0"}}}




def _mostly(good: Any, *bad: Any) -> st.SearchStrategy[Any]:
    """``good`` half the time, else one of ``bad``: enough near-misses, and enough files that serve."""
    return st.one_of(st.just(good), st.sampled_from(bad))


VALID = st.builds(
    _valid, st.sampled_from(CHUNKS), _mostly(N, float(N), 2048, "4096", True, 4096.5),
    _mostly("float32", "float16", "Float32"), _mostly(OP, "other", "chunk_sum ", "chunk/sum"),
    st.builds(lambda name, arch: {"name": name, "arch": arch},
              _mostly(CPU.name, "Other_CPU", "NVIDIA_H200", "Intel Xeon"), _mostly(CPU.arch, "sm_90", "gfx942")),
    st.booleans())
#: Artifacts that would serve the call (from this product or a sibling of its arch), stale or not.
SERVING = st.builds(
    _valid, st.sampled_from(CHUNKS), st.sampled_from([N, float(N)]), st.just("float32"), st.just(OP),
    st.builds(lambda name: {"name": name, "arch": CPU.arch}, st.sampled_from([CPU.name, "Other_CPU"])),
    st.booleans())


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any] | Any:
    data = draw(base)
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=2, unique=True)):
        action = draw(st.sampled_from(["delete", "replace", "nest"]))
        if action == "delete":
            del data[field]
        elif action == "replace":
            data[field] = draw(JSON)
        elif isinstance(data[field], dict) and data[field]:
            key = draw(st.sampled_from(sorted(data[field])))
            data[field][key] = draw(JSON)
    return data


def named(op: Any, spec: Any, device_name: Any) -> str:
    """The documented name of ``(op, spec, device)`` where its parts are plain, else the call's own name."""
    try:
        return artifact_name(op, spec, device_name)
    except Exception:
        return artifact_name(OP, SPEC, CPU.name)


@st.composite
def artifact_files(draw: st.DrawFn) -> tuple[str, bytes]:
    content = draw(st.one_of(SERVING, mutated(SERVING), VALID, mutated(VALID), JSON))
    if draw(st.integers(0, 9)) == 0:
        raw = draw(st.binary(max_size=40))
    else:
        raw = json.dumps(content).encode()
    how = draw(st.sampled_from(["call", "content", "random", "sibling"]))
    if how == "call":
        name = named(OP, SPEC, CPU.name)
    elif how == "sibling":
        name = named(OP, SPEC, draw(DEVICE_NAMES))
    elif how == "content":
        try:
            name = named(content["op"], content["spec"], content["device"]["name"])
        except Exception:
            name = named(OP, SPEC, CPU.name)
    else:
        name = draw(st.from_regex(r"[A-Za-z0-9._=,-]{1,40}", fullmatch=True)) + ".json"
    return name, raw


EXAMPLES = iter(range(10**9))
SIBLINGS_SERVED: set[str] = set()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(artifact_files(), min_size=1, max_size=4))
def test_lookup_never_raises_nor_serves_a_foreign_file(files: list[tuple[str, bytes]], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    configs = fresh_config_dir(monkeypatch, tmp_path / f"example{next(EXAMPLES)}")  # listed, warned about, afresh
    for name, raw in files:
        (configs / name).write_bytes(raw)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        res = make_tuner().resolve_spec(SPEC)
    event(f"served from {res.source}")
    if res.source == "default":
        assert res.config == DEFAULT
        return
    assert res.origin == "offline" and not res.nearest and res.source != "offline-nearest"
    art = json.loads(Path(str(res.path)).read_text())
    assert art["op"] == OP
    assert canonical(art["spec"]) == canonical(SPEC)
    assert art["device"]["arch"] == CPU.arch
    assert Config.from_json(art["config"]) == res.config and set(res.config.kwargs) == {"CHUNK"}
    assert Path(str(res.path)).name == artifact_name(OP, SPEC, art["device"]["name"])
    assert (res.source == "offline-other-device") == (art["device"]["name"] != CPU.name)
    if art["device"]["name"] != CPU.name:  # warned once a process (an earlier example may have seen it)
        name = Path(str(res.path)).name
        assert any("same arch" in m for m in flyreg_warnings(record)) or name in SIBLINGS_SERVED
        SIBLINGS_SERVED.add(name)


SPEC_KEYS = st.text(min_size=1, max_size=8)
SPEC_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.text(min_size=1, max_size=12).filter(str.strip), spec=st.dictionaries(SPEC_KEYS, SPEC_VALUES, max_size=4),
       other=st.dictionaries(SPEC_KEYS, SPEC_VALUES, max_size=4))
def test_emitted_specs_find_themselves_and_only_themselves(op: str, spec: dict[str, Any], other: dict[str, Any],
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configs = fresh_config_dir(monkeypatch, tmp_path / f"example{next(EXAMPLES)}")
    path = write_artifact(configs, Config({"CHUNK": 256}), spec, op=op)
    assert path.resolve().parent == configs.resolve() and SAFE_NAME.fullmatch(path.name)

    def lookup(s: dict[str, Any]) -> tuple[str, str | None, Config]:
        res = make_tuner(name=op).resolve_spec(s)
        return res.source, res.path, res.config

    hit = lookup(spec)
    assert hit == ("offline", str(path), Config({"CHUNK": 256}))
    assert lookup(json.loads(json.dumps(spec))) == hit
    other = {**spec, **other}
    same = canonical(other) == canonical(spec)
    event("other spec is the same" if same else "other spec differs")
    elsewhere = tmp_path / f"other{next(EXAMPLES)}"
    try:
        assert (write_artifact(elsewhere, Config({"CHUNK": 256}), other, op=op).name == path.name) == same
    except OSError as e:  # a name (with its writer's temp suffix) past the file system's limit: not this test's
        assert errno.ENAMETOOLONG in (e.errno, getattr(e.__cause__, "errno", None)), e
        event("the other spec's name is too long to write")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlyregWarning)
        assert (lookup(other) == hit) == same


def test_non_regular_and_misnamed_files_warn(isolated_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    configs = isolated_dirs["configs"]
    exact = artifact_name(OP, SPEC, CPU.name)
    os.mkfifo(configs / exact)  # reading it would block forever
    with pytest.warns(FlyregWarning, match="not a regular file"):
        assert make_tuner().resolve_spec(SPEC).source == "default"
    (configs / exact).unlink()
    again = fresh_config_dir(monkeypatch, configs.parent / "again")
    path = on_disk.write_artifact(again, OP, SPEC, Config({"CHUNK": 4096}))
    misordered = again / f"{OP},dtype=float32,N={N},device_name={CPU.name}.json"  # axes not sorted
    path.rename(misordered)
    with pytest.warns(FlyregWarning, match="not what its filename says"):
        assert make_tuner().resolve_spec(SPEC).source == "default"


def test_config_value_outside_the_ops_space_is_not_served(isolated_dirs: dict[str, Path]) -> None:
    write_artifact(isolated_dirs["configs"], Config({"CHUNK": "huge"}))  # right knob, a value no build takes
    with pytest.warns(FlyregWarning, match="rejected"):
        res = make_tuner().resolve_spec(SPEC)
    assert (res.source, res.config) == ("default", DEFAULT)


@pytest.mark.parametrize("name_bytes", [240, 255, 256, 2000])
def test_a_long_artifact_name_is_written_and_served(name_bytes: int, isolated_dirs: dict[str, Path],
                                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The temp file a write goes through carries the target's name plus the pid and a random part:
    # a name near the file-name limit must not make that temp name too long. A longer one has its long
    # value cut to a head and a hash, the same way when tuned and when looked up.
    base = artifact_name(OP, {**SPEC, "tag": "t"}, CPU.name)
    tag = "t" * (name_bytes - len(base.encode()) + 1)

    def tagged(x: torch.Tensor, out: torch.Tensor) -> dict[str, Any]:
        return {**specialize(x, out), "tag": tag}

    tuner = make_tuner(specialize_fn=tagged)
    tuner.tune(*inputs())
    path = Path(next(iter(tuner.reports.values())).artifact)
    assert len(path.name.encode()) == name_bytes if name_bytes <= 255 else len(path.name.encode()) < 255
    assert os.listdir(isolated_dirs["configs"]) == [path.name]  # no temp file left behind
    assert json.loads(path.read_text())["spec"]["tag"] == tag
    assert check_artifacts([isolated_dirs["configs"]]) == []  # named by its content, as lookup reads it
    fresh_cache(monkeypatch, tmp_path)  # served from the artifact, not the tune's scratch cache
    assert make_tuner(specialize_fn=tagged).resolve_spec({**SPEC, "tag": tag}).path == str(path)
