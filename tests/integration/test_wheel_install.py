"""A non-editable install of flyreg serves the offline configs shipped inside the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import flyreg._artifacts.store as offline
from flyreg._core.keys import DeviceIdentity
from flyreg._plugins.registry import REGISTRY

shipped = offline.shipped_config_dir()
spec = json.loads(sys.argv[1])
tuner = REGISTRY.tuner("rmsnorm")
hit = tuner.offline.lookup(spec, DeviceIdentity("NVIDIA_H200", "sm_90"), accepts=tuner.space.accepts)
print(json.dumps({"flyreg": offline.__file__, "shipped": str(shipped), "path": str(hit.path) if hit else None,
                  "config": repr(hit.config) if hit else None}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(REPO)], check=True, capture_output=True, text=True)
    return target


def test_wheel_install_serves_shipped_artifacts(installed: Path, tmp_path: Path) -> None:
    shipped = sorted((REPO / "offline_configs").glob("rmsnorm,*.json"))
    assert shipped, "the repo ships RMSNorm artifacts"
    artifact = json.loads(shipped[0].read_text())
    env = {**os.environ, "PYTHONPATH": str(installed), "FLYREG_CONFIG_DIR": str(tmp_path / "none"),
           "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(artifact["spec"])], cwd=tmp_path, env=env,
                         check=True, capture_output=True, text=True).stdout
    probe = json.loads(out)
    assert Path(probe["flyreg"]).is_relative_to(installed)  # the installed copy, not the source tree
    assert Path(probe["shipped"]).is_relative_to(installed)
    assert probe["path"] is not None and Path(probe["path"]).parent == Path(probe["shipped"])
    assert Path(probe["path"]).name == shipped[0].name
    kwargs, hints = artifact["config"]["kwargs"], artifact["config"]["hints"]
    assert all(f"{k}={v!r}" in probe["config"] for k, v in {**kwargs, **hints}.items())
