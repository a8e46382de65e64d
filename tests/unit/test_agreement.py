"""Lookup, ``flyreg show``, ``flyreg check`` and ``flyreg tune``'s planning judge a stored config by one rule.

Each case here is a file or entry on which two of them used to disagree: ``check`` calling ignored
what lookup served, ``show`` naming a cache entry no call would get, ``check`` giving up on one
unreadable directory.
"""

from __future__ import annotations

import json
import os
import sqlite3
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg import BuildCache, Config, DeviceIdentity, FlyregWarning, check_artifacts, hookimpl
from flyreg.plugin import OpRecord

from on_disk import SCRATCH_CACHE, cache_dir, cache_entries, this_device, write_artifact

OP = "agree_rows"
ROWS = (1, 8, 64)


def build(config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
    return lambda x, out: torch.mul(x, 2, out=out)


def specialize(x: torch.Tensor, out: torch.Tensor) -> dict[str, Any]:
    return {"M": int(x.shape[0])}


def configs(spec: dict[str, Any]) -> list[Config]:
    """The op's space: a row block per M; it has none for a non-positive M, as a real op's hooks may."""
    if spec["M"] < 1:
        raise ValueError(f"M must be >= 1, got {spec['M']}")
    return [Config({"ROWS": r}) for r in ROWS if r <= spec["M"]]


def make_tuner(**options: Any) -> Any:
    return flyreg.autotune_builder(OP, build, specialize, configs, lambda spec: Config({"ROWS": 1}), warmup=0, rep=1,
                                   ordered_axes=["M"], build_cache=BuildCache(), **options)


class AgreeRows:
    """The same op as a plugin, registered in this process so ``flyreg.accepts`` and ``flyreg show`` know it."""

    def __init__(self, version: str = "0") -> None:
        self.version = version

    @hookimpl
    def specialize(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return specialize(*args, **kwargs)

    @hookimpl
    def build(self, config: Config, spec: dict[str, Any]) -> Callable[..., Any]:
        return build(config, spec)

    @hookimpl
    def configs(self, spec: dict[str, Any]) -> list[Config]:
        return configs(spec)

    @hookimpl
    def default(self, spec: dict[str, Any]) -> Config:
        return Config({"ROWS": 1})

    @hookimpl
    def make_inputs(self, spec: dict[str, Any], device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = torch.ones(spec["M"], 4, device=device)
        return (x, torch.empty_like(x)), {}

    @hookimpl
    def describe(self) -> OpRecord:
        return OpRecord(version=self.version, ordered_axes=("M",), arg_names=("x", "out"))


@pytest.fixture
def registered() -> Iterator[Callable[[str], None]]:
    """``register(version)``: the op registered in this process (again, with that version)."""
    def register(version: str) -> None:
        if OP in {i.name for i in flyreg.ops()}:
            flyreg.unregister(OP)
        flyreg.register(AgreeRows(version), name=OP)

    register("0")
    yield register
    flyreg.unregister(OP)


def accepts(op: str, spec: dict[str, Any], config: Config) -> str | None:
    """What ``flyreg check`` is given: the registered op's own rule, by name."""
    assert op == OP
    return flyreg.accepts(op, spec, config)


def artifact(directory: Path, spec: dict[str, Any], config: Config, op_version: str = "0",
             device: DeviceIdentity | None = None, name: str | None = None) -> Path:
    return write_artifact(directory, OP, spec, config, op_version=op_version, device=device, name=name)


def quietly(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        value = fn()
    return value, [str(w.message) for w in record if issubclass(w.category, FlyregWarning)]


def test_a_neighbour_whose_own_spec_the_op_rejects_is_an_error_and_never_served(
        isolated_dirs: dict[str, Path], registered: Any) -> None:
    configs_dir = isolated_dirs["configs"]
    bad = write_artifact(configs_dir, OP, {"M": -1}, Config({"ROWS": 8}), name=f"{OP},M=-1,device_name={this_device().name}.json")
    (problem,) = check_artifacts([configs_dir], {OP: "0"}, accepts=accepts)
    assert (problem.path, problem.severity) == (bad, "error") and "lookup ignores this file" in problem.message
    res, _ = quietly(lambda: make_tuner().resolve_spec({"M": 8}))
    assert (res.source, res.nearest) == ("default", False)  # the M=-1 neighbour is not served
    x = torch.ones(4, 4)  # M=4 offers ROWS=1 alone: a search writes that artifact (and lookup sees it at once)
    good = Path(str(make_tuner().tune(x, torch.empty_like(x), out_dir=configs_dir).artifact))
    assert check_artifacts([configs_dir], {OP: "0"}, accepts=accepts) == [problem]
    res, _ = quietly(lambda: make_tuner().resolve_spec({"M": 16}))
    assert (res.source, res.path, res.nearest) == ("offline-nearest", str(good), True)


def test_an_unsanitized_device_name_is_an_error_and_never_served(isolated_dirs: dict[str, Path], tmp_path: Path,
                                                                 registered: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    configs_dir = isolated_dirs["configs"]
    sibling = DeviceIdentity("Other CPU 9000", this_device().arch)  # a name no runtime gives: it has spaces
    path = artifact(configs_dir, {"M": 64}, Config({"ROWS": 64}), device=sibling,
                    name=f"{OP},M=64,device_name=Other_CPU_9000-{'0' * 8}.json")
    (problem,) = check_artifacts([configs_dir], {OP: "0"}, accepts=accepts)
    assert (problem.path, problem.severity, problem.kind) == (path, "error", "unsanitized")
    res, said = quietly(lambda: make_tuner().resolve_spec({"M": 64}))
    assert res.source == "default"
    assert any(f"ignoring artifact {path} (unsanitized)" in m for m in said), said
    both = tmp_path / "both"  # a directory this process has not listed yet
    path.parent.rename(both)
    monkeypatch.setenv("FLYREG_CONFIG_DIR", str(both))
    fixed = artifact(both, {"M": 64}, Config({"ROWS": 64}), device=DeviceIdentity("Other_CPU_9000", this_device().arch))
    (again,) = check_artifacts([both], {OP: "0"}, accepts=accepts)
    assert (again.path.name, again.severity, again.kind) == (path.name, "error", "unsanitized")
    res, said = quietly(lambda: make_tuner().resolve_spec({"M": 64}))
    assert (res.source, res.path) == ("offline-other-device", str(fixed)) and any("same arch" in m for m in said)


def _tune_into_cache(op_version: str) -> tuple[Any, tuple[torch.Tensor, torch.Tensor]]:
    x = torch.ones(64, 4)
    args = (x, torch.empty_like(x))
    tuner = make_tuner(version=op_version)
    tuner.tune(*args, emit=False)
    return tuner, args


def shown(flyreg_cli: Callable[..., Any], spec: str) -> str:
    """The source ``flyreg show`` names for the registered op at ``spec``."""
    run = flyreg_cli("show", OP, "--spec", spec, "--device", "cpu", "--json")
    assert run.code == 0, run.err
    (row,) = json.loads(run.out)
    return str(row["source"])


def test_show_names_a_cache_entry_only_when_a_call_gets_it(isolated_dirs: dict[str, Path], registered: Any,
                                                           flyreg_cli: Callable[..., Any]) -> None:
    registered("2")
    _, args = _tune_into_cache("2")
    registered("1")
    assert shown(flyreg_cli, "M=64") == "default"  # the entry is a version-2 call's
    assert make_tuner(version="1").resolve(*args).source == "default"

    # Edit the entry's own fields to say op version 1: its key is still a version-2 call's, so no
    # version-1 call computes it, and neither a call nor show may name it.
    with sqlite3.connect(cache_dir() / SCRATCH_CACHE) as conn:
        ((key, text),) = conn.execute("SELECT key, entry FROM entries WHERE op = ?", (OP,)).fetchall()
        entry = json.loads(text)
        entry["toolchain"]["op"] = "1"
        conn.execute("UPDATE entries SET entry = ? WHERE op = ? AND key = ?", (json.dumps(entry), OP, key))
    conn.close()
    assert shown(flyreg_cli, "M=64") == "default"
    assert make_tuner(version="1").resolve_spec({"M": 64}).source == "default"
    assert make_tuner(version="1").resolve(*args).source == "default"
    registered("2")
    assert shown(flyreg_cli, "M=64") == "cache"  # the version whose call it is
    fresh = make_tuner(version="2")
    assert fresh.resolve(*args).source == "cache"  # a call gets it too
    assert len(cache_entries(OP)) == 1


def test_show_of_another_tensor_layout_still_finds_the_spec(isolated_dirs: dict[str, Path]) -> None:
    _tune_into_cache("0")
    strided = torch.ones(64, 8)[:, ::2]  # another stride pattern: another key, the same spec
    assert make_tuner().resolve(strided, torch.empty(64, 4)).source == "default"
    assert make_tuner().resolve_spec({"M": 64}).source == "cache"  # show cannot know the layout


def test_an_unreadable_directory_is_one_problem_and_the_others_are_checked(
        isolated_dirs: dict[str, Path], tmp_path: Path, registered: Any, flyreg_cli: Callable[..., Any]) -> None:
    good = isolated_dirs["configs"]
    artifact(good, {"M": 8}, Config({"ROWS": 8}))
    artifact(good, {"M": 64}, Config({"ROWS": 64}))
    locked = tmp_path / "locked"
    locked.write_text("a file where a directory is named")
    problems = check_artifacts([locked, good], {OP: "0"}, accepts=accepts)
    assert [(p.path, p.severity) for p in problems] == [(locked, "error")]
    assert "not a readable directory" in problems[0].message

    result = flyreg_cli("check", str(locked), str(good))
    assert result.code == 1 and "Traceback" not in result.err
    assert f"{locked}: error: not a readable directory" in result.out
    # the other directory was checked: its files are of an op the command's process does not register
    assert f"error: unknown op '{OP}'" in result.out
    assert "checked 2 artifact(s) in 2 dir(s): 3 problem(s)" in result.out


def test_check_of_a_directory_lookup_cannot_enter_reports_it(isolated_dirs: dict[str, Path], tmp_path: Path,
                                                             flyreg_cli: Callable[..., Any],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    inner = locked / "configs"
    inner.mkdir()
    os.chmod(locked, 0)
    try:
        if os.access(inner, os.R_OK):
            pytest.skip("running with permission to read anything (root)")
        monkeypatch.setenv("FLYREG_CONFIG_DIR", str(inner))
        result = flyreg_cli("check")
    finally:
        os.chmod(locked, 0o755)
    assert result.code == 1, result.out
    assert f"{inner}: error: not a readable directory" in result.out


def test_planning_and_emission_skip_exactly_what_lookup_serves_as_current(
        isolated_dirs: dict[str, Path], registered: Any, flyreg_cli: Callable[..., Any]) -> None:
    configs_dir = isolated_dirs["configs"]
    cases = {
        "current": (artifact(configs_dir, {"M": 8}, Config({"ROWS": 8})), True),
        "stale": (artifact(configs_dir, {"M": 16}, Config({"ROWS": 8}), op_version="old"), False),
        "rejected": (artifact(configs_dir, {"M": 4}, Config({"ROWS": 64})), False),
    }
    specs = {why: json.loads(path.read_text())["spec"] for why, (path, _) in cases.items()}
    for why, (path, current) in cases.items():
        plan = flyreg_cli("tune", OP, "--spec", f"M={specs[why]['M']}", "--device", "cpu", "--out", str(configs_dir),
                          "--dry-run")
        served, _ = quietly(lambda: make_tuner().resolve_spec(specs[why]))
        assert ("skip: current artifact" in plan.out) == current, (why, plan.out)
        assert (served.source == "offline" and not served.stale and not served.nearest) == current, why
    for why, (path, current) in cases.items():  # an emitting call searches (and rewrites) the others
        spec = specs[why]
        emitting = make_tuner(emit=True)
        x = torch.ones(spec["M"], 4)
        res, _ = quietly(lambda: emitting.resolve(x, torch.empty_like(x)))
        assert (res.source == "offline") == current, why
