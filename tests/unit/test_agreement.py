"""Lookup, ``flyreg show``, ``flyreg check`` and ``flyreg tune``'s planning judge a stored config by one rule.

Each case here is a file or entry on which two of them used to disagree: ``check`` calling ignored
what lookup served, ``show`` naming a cache entry no call would get, ``check`` giving up on one
unreadable directory.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import flyreg
from flyreg import Config, FlyregWarning
from flyreg._artifacts import cache
from flyreg._artifacts.store import emit_artifact
from flyreg._artifacts.validate import check_report
from flyreg._cli.main import cli
from flyreg._core.keys import DeviceIdentity, identity_of
from flyreg._runtime import resolution
from flyreg._runtime.builds import BuildCache

OP = "agree_rows"
CPU = identity_of(None)
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


def accepts(op: str, spec: dict[str, Any], config: Config) -> str | None:
    """What ``flyreg check`` is given: the op's own rule, by name."""
    assert op == OP
    return make_tuner().space.accepts(config, spec)


def quietly(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        value = fn()
    return value, [str(w.message) for w in record if issubclass(w.category, FlyregWarning)]


def test_a_neighbour_whose_own_spec_the_op_rejects_is_an_error_and_never_served(isolated_dirs: dict[str, Path]) -> None:
    configs_dir = isolated_dirs["configs"]
    bad = emit_artifact(OP, {"M": -1}, CPU, Config({"ROWS": 8}), "0", None, None, configs_dir)
    (problem,) = check_report([configs_dir], {OP: "0"}, accepts=accepts).problems
    assert (problem.path, problem.severity) == (bad, "error") and "lookup ignores this file" in problem.message
    res, _ = quietly(lambda: make_tuner().resolve_spec({"M": 8}))
    assert (res.source, res.nearest) == ("default", False)  # the M=-1 neighbour is not served
    good = emit_artifact(OP, {"M": 4}, CPU, Config({"ROWS": 1}), "0", None, None, configs_dir)
    assert check_report([configs_dir], {OP: "0"}, accepts=accepts).problems == [problem]
    res, _ = quietly(lambda: make_tuner().resolve_spec({"M": 16}))
    assert (res.source, res.path, res.nearest) == ("offline", str(good), True)


def test_an_unsanitized_device_name_is_an_error_and_never_served(isolated_dirs: dict[str, Path]) -> None:
    configs_dir = isolated_dirs["configs"]
    sibling = DeviceIdentity("Other CPU 9000", CPU.arch)  # a name no runtime gives: it has spaces
    path = emit_artifact(OP, {"M": 64}, sibling, Config({"ROWS": 64}), "0", None, None, configs_dir)
    (problem,) = check_report([configs_dir], {OP: "0"}, accepts=accepts).problems
    assert (problem.path, problem.severity, problem.kind) == (path, "error", "unsanitized")
    res, said = quietly(lambda: make_tuner().resolve_spec({"M": 64}))
    assert res.source == "default"
    assert any(f"ignoring artifact {path} (unsanitized)" in m for m in said), said
    fixed = emit_artifact(OP, {"M": 64}, DeviceIdentity("Other_CPU_9000", CPU.arch), Config({"ROWS": 64}), "0",
                          None, None, configs_dir)
    assert check_report([configs_dir], {OP: "0"}, accepts=accepts).problems == [problem]
    res, said = quietly(lambda: make_tuner().resolve_spec({"M": 64}))
    assert (res.source, res.path) == ("offline", str(fixed)) and any("same arch" in m for m in said)


def _tune_into_cache(op_version: str) -> tuple[Any, tuple[torch.Tensor, torch.Tensor]]:
    x = torch.ones(64, 4)
    args = (x, torch.empty_like(x))
    tuner = make_tuner(version=op_version)
    tuner.tune(*args, emit=False)
    return tuner, args


def test_show_names_a_cache_entry_only_when_a_call_gets_it(isolated_dirs: dict[str, Path]) -> None:
    _, args = _tune_into_cache("1")
    (key,) = cache.load(OP)
    fresh = make_tuner(version="1")
    shown, offline = resolution.what_serves(fresh, {"M": 64})
    assert (shown.source, offline) == ("cache", None)
    assert fresh.resolve(*args).source == "cache"  # a call gets it too

    # The entry's own fields still say op version 1, but its key is a version-2 call's: no version-1
    # call computes that key, so neither a call nor show may name it.
    entry = cache.load(OP)[key]
    fields = json.loads(key)
    fields["toolchain"]["op"] = "2"
    cache.clear(OP)
    cache.store(OP, json.dumps(fields, sort_keys=True, separators=(",", ":")), entry)
    again = make_tuner(version="1")
    assert again.resolve_spec({"M": 64}).source == "default"
    assert make_tuner(version="1").resolve(*args).source == "default"
    assert make_tuner(version="2").resolve_spec({"M": 64}).source == "cache"  # the version whose call it is


def test_show_of_another_tensor_layout_still_finds_the_spec(isolated_dirs: dict[str, Path]) -> None:
    _tune_into_cache("0")
    strided = torch.ones(64, 8)[:, ::2]  # another stride pattern: another key, the same spec
    assert make_tuner().resolve(strided, torch.empty(64, 4)).source == "default"
    assert make_tuner().resolve_spec({"M": 64}).source == "cache"  # show cannot know the layout


def test_an_unreadable_directory_is_one_problem_and_the_others_are_checked(
        isolated_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = isolated_dirs["configs"]
    emit_artifact(OP, {"M": 8}, CPU, Config({"ROWS": 8}), "0", None, None, good)
    emit_artifact(OP, {"M": 64}, CPU, Config({"ROWS": 64}), "0", None, None, good)
    locked = tmp_path / "locked"
    locked.mkdir()
    real = Path.iterdir

    def iterdir(self: Path) -> Any:
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    report = check_report([locked, good], {OP: "0"}, accepts=accepts)
    assert [(p.path, p.severity) for p in report.problems] == [(locked, "error")]
    assert "not a readable directory" in report.problems[0].message
    assert (report.files, report.dirs) == (2, 2)

    result = CliRunner().invoke(cli, ["check", str(locked), str(good)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert f"{locked}: error: not a readable directory" in result.output
    # the other directory was checked: its files are of an op this process does not register
    assert f"error: unknown op '{OP}'" in result.output
    assert "checked 2 artifact(s) in 2 dir(s): 3 problem(s)" in result.output


def test_check_of_a_directory_lookup_cannot_enter_reports_it(isolated_dirs: dict[str, Path], tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    inner = locked / "configs"
    inner.mkdir()
    os.chmod(locked, 0)
    try:
        if os.access(inner, os.R_OK):
            pytest.skip("running with permission to read anything (root)")
        result = CliRunner().invoke(cli, ["check"], env={"FLYREG_CONFIG_DIR": str(inner)})
    finally:
        os.chmod(locked, 0o755)
    assert result.exit_code == 1, result.output
    assert f"{inner}: error: not a readable directory" in result.output


def test_planning_and_emission_skip_exactly_what_lookup_serves_as_current(isolated_dirs: dict[str, Path]) -> None:
    configs_dir = isolated_dirs["configs"]
    tuner = make_tuner()
    cases = {
        "current": (emit_artifact(OP, {"M": 8}, CPU, Config({"ROWS": 8}), "0", None, None, configs_dir), True),
        "stale": (emit_artifact(OP, {"M": 16}, CPU, Config({"ROWS": 8}), "old", None, None, configs_dir), False),
        "rejected": (emit_artifact(OP, {"M": 4}, CPU, Config({"ROWS": 64}), "0", None, None, configs_dir), False),
    }
    specs = {why: json.loads(path.read_text())["spec"] for why, (path, _) in cases.items()}
    for why, (path, current) in cases.items():
        hit = resolution.current_artifact(tuner, specs[why], CPU, configs_dir)
        served, _ = quietly(lambda: make_tuner().resolve_spec(specs[why]))
        assert (hit is not None) == current, why
        assert (served.source == "offline" and not served.stale and not served.nearest) == current, why
    for why, (path, current) in cases.items():  # an emitting call searches (and rewrites) the others
        spec = specs[why]
        emitting = make_tuner(emit=True)
        x = torch.ones(spec["M"], 4)
        res, _ = quietly(lambda: emitting.resolve(x, torch.empty_like(x)))
        assert (res.source == "offline") == current, why
