"""The README's Quick start installs what a plugin written from the plugin guide imports: flyreg and each
in-tree plugin depend on Triton wherever Triton publishes wheels (Linux on x86-64 and aarch64), so a Triton
op from the guide is listed ``ok`` on a CPU machine too, running its CPU fallback, or its kernel under
Triton's interpreter (tests/integration/test_docs_triton_op.py runs it so)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parents[2]
PYPROJECTS = [ROOT / "pyproject.toml", *sorted((ROOT / "plugins").glob("*/pyproject.toml"))]
#: (platform_system, platform_machine) -> whether Triton publishes wheels there.
PLATFORMS = {("Linux", "x86_64"): True, ("Linux", "aarch64"): True, ("Darwin", "arm64"): False,
             ("Windows", "AMD64"): False}


def _triton_requirement(pyproject: Path) -> Requirement:
    project = tomllib.loads(pyproject.read_text())["project"]
    (triton,) = [r for r in map(Requirement, project["dependencies"]) if r.name == "triton"]
    return triton


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: p.parent.name)
def test_triton_is_a_dependency_exactly_where_it_has_wheels(pyproject: Path) -> None:
    triton = _triton_requirement(pyproject)
    assert triton.marker is not None
    for (system, machine), has_wheels in PLATFORMS.items():
        env = {"platform_system": system, "platform_machine": machine, "sys_platform": system.lower()}
        assert triton.marker.evaluate(env) == has_wheels, f"{pyproject}: triton on {system} {machine}"


def test_the_quick_start_installs_flyreg_and_the_plugins_with_their_dependencies() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    install = next(line for line in re.findall(r"^```bash\n(.*?)^```", quick_start, re.S | re.M)[0].splitlines()
                   if "pip install" in line)
    assert "--no-deps" not in install
    assert re.search(r"-e \.(\s|$)", install), install  # flyreg itself, so its dependencies, Triton included
    for pyproject in PYPROJECTS[1:]:
        assert f"-e plugins/{pyproject.parent.name}" in install
