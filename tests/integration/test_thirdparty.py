"""A third-party distribution (tests/thirdparty/flyreg-scale) installed the way a user installs it.

It is built and installed once with pip into a temporary target directory; every check then
runs in a fresh interpreter with that directory on PYTHONPATH, so its ops are found through
its installed dist-info entry points, exactly as for any other installed plugin.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from on_disk import artifact_name, this_device

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "thirdparty" / "flyreg-scale"
SCALE_SPEC = {"M": 256, "N": 64, "dtype": "float32"}
ROWSUM_SPEC = {"M": 64, "N": 512, "dtype": "float32"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """flyreg-scale installed by pip into a fresh target directory (built from a copy of its source)."""
    root = tmp_path_factory.mktemp("thirdparty")
    src = root / "src"
    shutil.copytree(SOURCE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = root / "site"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1", "PIP_NO_INPUT": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(src)],
        capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"
    return target


def run_python(site: Path, code: str, dirs: dict[str, Path], **env: str) -> Any:
    """Run ``code`` in a fresh interpreter that sees ``site``; returns the JSON it prints last."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLYREG_")}
    full_env.update({
        "PYTHONPATH": str(site),
        "FLYREG_CACHE_DIR": str(dirs["cache"]),
        "FLYREG_CONFIG_DIR": str(dirs["configs"]),
        "XDG_CONFIG_HOME": str(dirs["xdg_config"]),
        "XDG_CACHE_HOME": str(dirs["xdg_cache"]),
        "PYTHONWARNINGS": "ignore",
        **env,
    })
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, cwd=site.parent, timeout=120)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_installed_with_its_entry_points(site: Path) -> None:
    (dist_info,) = site.glob("flyreg_scale-0.3.0.dist-info")
    entry_points = (dist_info / "entry_points.txt").read_text(encoding="utf-8")
    assert "[flyreg.ops]" in entry_points
    assert re.search(r"^scale = flyreg_scale.scale$", entry_points, re.M)
    assert re.search(r"^rowsum = flyreg_scale.rowsum$", entry_points, re.M)
    assert (site / "flyreg_scale" / "scale.py").is_file()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("thirdparty-dirs")
    made = {name: root / name for name in ("cache", "configs", "xdg_config", "xdg_cache")}
    for d in made.values():
        d.mkdir()
    return made


@pytest.fixture(scope="module")
def first_process(site: Path, dirs: dict[str, Path]) -> Any:
    """One fresh interpreter that lists the ops, then tunes both (with FLYREG_AUTOTUNE=1).

    ``scale`` is tuned on a real call; ``rowsum`` through its own ``workloads()`` and
    ``make_inputs()`` hooks and the tuner's ``tune()``.
    """
    return run_python(site, """
        import importlib.metadata, json, os, sys, torch
        import flyreg

        assert "flyreg_scale" not in sys.modules  # nothing is imported before an op is used
        listed = [[i.name, i.distribution, i.version, i.status, i.error, list(i.structural or ())]
                  for i in flyreg.ops()]
        os.environ["FLYREG_DISABLE_OPS"] = "rowsum"
        disabled = {i.name: i.status for i in flyreg.ops()}
        del os.environ["FLYREG_DISABLE_OPS"]

        x = torch.randn(200, 64)
        out = torch.empty_like(x)
        scale = flyreg.op("scale")
        torch.testing.assert_close(scale(x, out, alpha=3.0), x * 3.0)
        res = flyreg.resolve("scale", x, out, alpha=3.0)
        (scale_report,) = scale.reports.values()

        (entry,) = [ep for ep in importlib.metadata.entry_points(group="flyreg.ops") if ep.name == "rowsum"]
        plugin = entry.load()  # the plugin object its distribution names: its hooks, called directly
        (spec,) = plugin.workloads()  # its hook takes none of the arguments flyreg would pass
        args, kwargs = plugin.make_inputs(spec, "cpu")
        report = flyreg.op("rowsum").tune(*args, **kwargs)
        print(json.dumps({
            "ops": listed, "disabled": disabled,
            "scale": [scale_report.artifact, res.source, res.config.to_json(), scale.stats.searches],
            "rowsum": [report.artifact, report.spec, report.winner.to_json(), len(report.timings)],
        }))
    """, dirs, FLYREG_AUTOTUNE="1")


def test_listed_by_ops(first_process: Any) -> None:
    ops = {name: rest for name, *rest in first_process["ops"]}
    assert ops["scale"] == ["flyreg-scale", "0.3.0", "ok", None, ["ROWS"]]
    assert ops["rowsum"] == ["flyreg-scale", "0.3.0", "ok", None, ["BLOCK"]]
    assert {"rmsnorm", "fused_add_rmsnorm"} <= set(ops)  # flyreg's own entry points are found alongside
    assert first_process["disabled"]["rowsum"] == "disabled" and first_process["disabled"]["scale"] == "ok"


def test_tuned_and_emitted_into_the_config_dir(first_process: Any, dirs: dict[str, Path]) -> None:
    device = this_device().name
    scale_file = dirs["configs"] / artifact_name("scale", SCALE_SPEC, device)
    rowsum_file = dirs["configs"] / artifact_name("rowsum", ROWSUM_SPEC, device)
    assert scale_file.name == f"scale,M=256,N=64,dtype=float32,device_name={device}.json"
    assert sorted(p.name for p in dirs["configs"].glob("*.json")) == sorted([scale_file.name, rowsum_file.name])
    artifact, source, scale_config, searches = first_process["scale"]
    assert (artifact, source, searches) == (str(scale_file), "memory", 1)
    assert scale_config != {"kwargs": {"ROWS": 1}, "hints": {}}  # it beat the deliberately slow default
    artifact, spec, _, timed = first_process["rowsum"]
    assert (artifact, spec, timed) == (str(rowsum_file), ROWSUM_SPEC, 3)
    content = json.loads(scale_file.read_text(encoding="utf-8"))
    assert (content["op"], content["spec"], content["config"]) == ("scale", SCALE_SPEC, scale_config)


def test_served_offline_by_name_in_a_fresh_process(site: Path, first_process: Any, dirs: dict[str, Path]) -> None:
    """A fresh interpreter with an empty scratch cache resolves both ops from the artifacts alone."""
    scale_config, rowsum_config = first_process["scale"][2], first_process["rowsum"][2]
    served = run_python(site, """
        import json, torch
        import flyreg

        x = torch.randn(130, 64)
        out = torch.empty_like(x)
        by_call = flyreg.resolve("scale", x, out)
        torch.testing.assert_close(flyreg.op("scale")(x, out), x * 2.0)
        by_spec = flyreg.resolve_spec("rowsum", {"M": 64, "N": 512, "dtype": "float32"})
        near = flyreg.resolve_spec("rowsum", {"M": 100, "N": 512, "dtype": "float32"})
        rows = flyreg.resolve_spec("scale", {"M": 200, "N": 64, "dtype": "float32"})  # M is rounded up to 256
        try:
            flyreg.resolve_spec("scale", {"M": 256, "N": 64, "dtyp": "float32"})
            typo = None
        except flyreg.SpecError as e:
            typo = str(e)
        print(json.dumps({
            "rows": [rows.spec, rows.config.to_json()], "typo": typo,
            "scale": [by_call.source, by_call.config.to_json(), by_call.path, flyreg.op("scale").stats.searches],
            "rowsum": [by_spec.source, by_spec.config.to_json(), by_spec.path],
            "near": [near.source, near.nearest, near.config.to_json()],
        }))
    """, {**dirs, "cache": dirs["cache"] / "fresh"})
    device = this_device().name
    assert served["scale"] == ["offline", scale_config,
                               str(dirs["configs"] / artifact_name("scale", SCALE_SPEC, device)), 0]
    assert served["rowsum"] == ["offline", rowsum_config,
                                str(dirs["configs"] / artifact_name("rowsum", ROWSUM_SPEC, device))]
    assert served["near"] == ["offline-nearest", True, rowsum_config]
    assert served["rows"] == [SCALE_SPEC, scale_config]
    assert served["typo"].startswith("scale: spec {'M': 256, 'N': 64, 'dtyp': 'float32'} does not fit the op's axes: "
                                     "missing dtype; unknown axis dtyp (did you mean dtype?). Axes: ")


def test_nothing_in_flyreg_special_cases_it() -> None:
    needle = re.compile(r"flyreg[-_]scale|rowsum")
    for path in [*(ROOT / "flyreg").rglob("*.py"), ROOT / "pyproject.toml"]:
        text = path.read_text(encoding="utf-8")
        assert not needle.search(text), f"{path} mentions the third-party plugin"
