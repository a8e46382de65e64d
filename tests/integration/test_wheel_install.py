"""Non-editable wheels of flyreg and flyreg-rmsnorm, installed in a fresh venv, serve the artifacts shipped
inside the plugin's package; the core wheel ships no kernel and no artifact."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "plugins" / "flyreg-rmsnorm"
ARTIFACTS = PLUGIN / "flyreg_rmsnorm" / "configs"

#: In the fresh venv, on an H200 faked in torch (the shipped artifacts are the H200's): where the installed
#: plugin's artifact of SPEC is served from, and every lookup dir ``flyreg check`` reads.
PROBE = """
import importlib.metadata, io, json, sys, types
from contextlib import redirect_stdout
import torch
import flyreg, flyreg_rmsnorm

torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.current_device = lambda: 0
torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0,
                                                                   L2_cache_size=60 << 20, multi_processor_count=132)
torch.version.hip = None
spec = json.loads(sys.argv[1])
hit = flyreg.resolve_spec("rmsnorm", spec, "cuda")
info = {i.name: i for i in flyreg.ops()}["rmsnorm"]
print(json.dumps({"flyreg": flyreg.__file__, "plugin": flyreg_rmsnorm.__file__, "source": hit.source,
                  "path": hit.path, "config": repr(hit.config), "distribution": info.distribution}))
"""
_SKIP = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")


def _wheel(source: Path, copy: Path, out: Path) -> Path:
    """The wheel of ``source``, built from a copy (setuptools writes build/ and *.egg-info into the tree)."""
    shutil.copytree(source, copy, ignore=_SKIP)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(copy)], check=True, capture_output=True, text=True)
    name = "flyreg_rmsnorm" if source == PLUGIN else "flyreg"
    (wheel,) = out.glob(f"{name}-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the fresh venv's python, the core wheel, the plugin wheel); the outer venv's packages give the dependencies."""
    root = tmp_path_factory.mktemp("wheels")
    core = _wheel(REPO, root / "src" / "core", root / "core")
    plugin = _wheel(PLUGIN, root / "src" / "plugin", root / "plugin")
    fresh = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True)
    python = fresh / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(core), str(plugin)], check=True, capture_output=True, text=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # Dependencies (torch, pluggy, ...) from this venv, after the fresh venv's own packages.
    Path(site, "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, core, plugin


def test_the_core_wheel_ships_no_kernel_and_no_artifact(venv: tuple[Path, Path, Path]) -> None:
    _, core, plugin = venv
    core_files = zipfile.ZipFile(core).namelist()
    assert any(n.startswith("flyreg/_runtime/") for n in core_files)
    assert not [n for n in core_files if n.endswith(".json") or n.startswith("flyreg_rmsnorm/")]
    entry_points = [n for n in core_files if n.endswith("entry_points.txt")]
    assert all("flyreg.ops" not in zipfile.ZipFile(core).read(n).decode() for n in entry_points)
    plugin_files = zipfile.ZipFile(plugin).namelist()
    shipped = sorted(p.name for p in ARTIFACTS.glob("*.json"))
    assert shipped and sorted(n.rsplit("/", 1)[1] for n in plugin_files if n.startswith("flyreg_rmsnorm/configs/")) \
        == shipped


def test_a_fresh_venv_serves_the_plugins_shipped_artifacts(venv: tuple[Path, Path, Path], tmp_path: Path) -> None:
    python, _, _ = venv
    shipped = sorted(ARTIFACTS.glob("rmsnorm,*.json"))
    artifact = json.loads(shipped[0].read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"FLYREG_CONFIG_DIR": str(tmp_path / "none"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
                "FLYREG_CACHE_DIR": str(tmp_path / "cache")})
    out = subprocess.run([str(python), "-c", PROBE, json.dumps(artifact["spec"])], cwd=tmp_path, env=env,
                         check=True, capture_output=True, text=True).stdout
    probe = json.loads(out)
    venv_dir = python.parent.parent
    # The installed copies, not the source tree.
    assert Path(probe["flyreg"]).is_relative_to(venv_dir) and Path(probe["plugin"]).is_relative_to(venv_dir)
    assert probe["distribution"] == "flyreg-rmsnorm"
    configs = Path(probe["plugin"]).parent / "configs"
    assert probe["source"] == "offline" and Path(probe["path"]) == configs / shipped[0].name  # the plugin's config_dir
    check = subprocess.run([str(python), "-m", "flyreg", "check", "--verbose"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    listed = {line.strip().split(": ")[0] for line in check.stdout.splitlines() if line.startswith("  ")}
    assert str(configs / shipped[0].name) in listed  # the plugin's config_dir is a lookup dir of the installed copy
    kwargs, hints = artifact["config"]["kwargs"], artifact["config"]["hints"]
    assert all(f"{k}={v!r}" in probe["config"] for k, v in {**kwargs, **hints}.items())
