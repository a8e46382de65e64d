"""The docs' examples cannot rot: docs/plugin_authoring.md's example plugin is executed, discovered,
called and tuned, and the README's "Using an op" example runs as written (on the CPU; its lines
marked ``# on a GPU:`` on a GPU)."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

import flyreg

from fresh_process import fake_distribution
from installed import new_tuner, plugin as installed_plugin
from on_disk import artifact_name, this_device

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugin_authoring.md"
README = DOC.parents[1] / "README.md"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
GPU_MARK = "# on a GPU:"


#: Where the page's second example (run by tests/kernels/test_docs_triton_example.py) begins.
SECOND = "## A second example"


def blocks(lang: str) -> list[str]:
    """The page's ``lang`` blocks before its second example."""
    page = DOC.read_text(encoding="utf-8").split(SECOND, 1)[0]
    return [code for tag, code in FENCE.findall(page) if tag == lang]


def page_project() -> dict[str, Any]:
    """The page's whole pyproject.toml."""
    (toml,) = blocks("toml")
    project = tomllib.loads(toml)
    assert project["build-system"]["build-backend"] and project["project"]["name"]
    assert project["tool"]["setuptools"]["packages"] == ["my_kernels"]
    return project


@pytest.fixture
def example_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The page's first python block, imported as the module ``my_kernels.scale_rows``."""
    source = blocks("python")[0]
    package = types.ModuleType("my_kernels")
    package.__path__ = []
    module = types.ModuleType("my_kernels.scale_rows")
    module.__file__ = str(DOC)
    monkeypatch.setitem(sys.modules, "my_kernels", package)
    monkeypatch.setitem(sys.modules, "my_kernels.scale_rows", module)
    exec(compile(source, f"{DOC}:example", "exec"), module.__dict__)
    package.scale_rows = module  # type: ignore[attr-defined]
    return module


def test_page_has_the_expected_blocks() -> None:
    assert len(blocks("python")) >= 4
    assert len(blocks("toml")) == 1
    assert 'scale_rows = "my_kernels.scale_rows"' in blocks("toml")[0]


def test_fragments_compile() -> None:
    for i, code in enumerate(blocks("py")):
        compile(code, f"{DOC}:fragment{i}", "exec")


#: Run in a fresh process that has the page's distribution installed: every python block of the page after
#: the plugin itself, then what they left, as JSON.
RUN_THE_PAGE = """
import json, sys
import flyreg
from test_docs_example import DOC, blocks

namespace = {"__name__": "plugin_authoring_doc"}
discovered = {i.name: [i.status, i.distribution] for i in flyreg.ops() if i.name == "scale_rows"}
for i, code in enumerate(blocks("python")[1:], 1):
    exec(compile(code, f"{DOC}:block{i}", "exec"), namespace)
info = {i.name: i for i in flyreg.ops()}["scale_rows"]
report, x = namespace["report"], namespace["x"]
print(json.dumps({"discovered": discovered, "after": [info.status, info.distribution, list(info.structural)],
                  "spec": report.spec, "artifact": report.artifact, "x": list(x.shape)}))
"""


def test_every_python_block_runs(fresh_process: Any, isolated_dirs: dict[str, Path], tmp_path: Path) -> None:
    project = page_project()
    entry_points = project["project"]["entry-points"]["flyreg.ops"]
    assert entry_points == {"scale_rows": "my_kernels.scale_rows"}
    site = fake_distribution(tmp_path / "site", project["project"]["name"],
                             "[flyreg.ops]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()),
                             {"my_kernels/__init__.py": "", "my_kernels/scale_rows.py": blocks("python")[0]})
    got = fresh_process.run(RUN_THE_PAGE, sites={project["project"]["name"]: site}, path=[Path(__file__).parent],
                            dirs=isolated_dirs).one()

    # The op came from the page's entry point first, then was re-registered in-process by the last block.
    assert got["discovered"] == {"scale_rows": ["ok", project["project"]["name"]]}
    assert got["after"] == ["ok", "<in-process>", ["ROWS"]]

    # The tune block wrote its artifact where the page says, under the name it says.
    spec = {"M": 512, "N": 512, "dtype": "float32"}
    assert got["spec"] == spec
    expected = isolated_dirs["configs"] / artifact_name("scale_rows", spec, this_device().name)
    assert got["artifact"] == str(expected) and expected.is_file()
    assert got["x"] == [300, 512]


def test_example_registered_in_process_is_tuned_and_served_offline(
        example_module: types.ModuleType, isolated_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    flyreg.register(example_module, name="scale_rows")
    try:
        # The optional hooks give a tuning tool everything it needs without a real call.
        (spec, *_) = example_module.workloads("cpu")
        args, kwargs = example_module.make_inputs(spec, "cpu")
        assert flyreg.op("scale_rows").specialize(*args, **kwargs) == spec
        monkeypatch.setenv("FLYREG_AUTOTUNE", "1")
        res = flyreg.resolve("scale_rows", *args, **kwargs)
        assert res.source == "search" and res.path is not None
        torch.testing.assert_close(flyreg.op("scale_rows")(*args, **kwargs), args[0] * args[1][:, None])

        # A new tuner and scratch cache: the artifact alone serves the spec.
        monkeypatch.delenv("FLYREG_AUTOTUNE")
        monkeypatch.setenv("FLYREG_CACHE_DIR", str(isolated_dirs["cache"] / "fresh"))
        flyreg.unregister("scale_rows")
        flyreg.register(example_module, name="scale_rows")
        again = flyreg.resolve_spec("scale_rows", spec)
        assert (again.source, again.config, again.path) == ("offline", res.config, res.path)
    finally:
        flyreg.unregister("scale_rows")


# -- the README's "Using an op" ------------------------------------------------------------------------------
def readme_example() -> str:
    section = README.read_text(encoding="utf-8").split("## Using an op\n", 1)[1].split("\n## ", 1)[0]
    (code,) = [code for tag, code in FENCE.findall(section) if tag == "python"]
    return code


def gpu_version(code: str) -> str:
    """The example as run on a GPU: ``CODE  # on a GPU: OTHER`` becomes ``OTHER``, and the commented-out
    lines under a ``# on a GPU: ...`` line are uncommented."""
    out, uncomment = [], False
    for line in code.splitlines():
        if line.startswith(GPU_MARK):
            uncomment = True
            continue
        if uncomment and line.startswith("# "):
            out.append(line[2:])
            continue
        uncomment = False
        _, mark, other = line.partition(GPU_MARK)
        out.append(other.strip() if mark else line)
    return "\n".join(out) + "\n"


@pytest.fixture
def installed_registry() -> None:
    """New tuners of the installed RMSNorm ops: no state of an earlier test serves the example."""
    new_tuner("rmsnorm")
    new_tuner("fused_add_rmsnorm")


def rms_norm(x: object, w: object) -> torch.Tensor:
    assert isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()


def test_readme_example_runs_on_the_cpu_as_written(installed_registry: None,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = readme_example()
    assert all("cuda" not in line.partition("#")[0] for line in code.splitlines())  # GPU parts are comments
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(code, f"{README}:Using an op", "exec"), namespace)
    x, w, y = namespace["x"], namespace["w"], namespace["y"]
    assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.device.type == y.device.type == "cpu"
    torch.testing.assert_close(y.float(), rms_norm(x, w), atol=2e-2, rtol=2e-2)
    by_call, by_spec = capsys.readouterr().out.splitlines()
    spec = {"M": 256, "N": 4096, "backend": "cpu", "dtype": "bfloat16"}
    default = installed_plugin("rmsnorm").default(spec)  # nothing is tuned for this CPU here
    for printed in (by_call, by_spec):
        assert printed.startswith(f"Resolution(config={default!r}, ") and "origin='default'" in printed
        assert f"spec={spec!r}" in printed


def test_readme_example_gpu_version_is_the_cpu_one_on_cuda() -> None:
    cpu, gpu = readme_example(), gpu_version(readme_example())
    compile(gpu, f"{README}:Using an op (GPU)", "exec")
    assert 'device = "cuda"' in gpu and 'device = "cpu"' not in gpu
    assert len(gpu.splitlines()) == len(cpu.splitlines()) - 1  # the marker line goes, the GPU line is uncommented
    assert gpu.count("print(") == cpu.count("print(") == 3


@pytest.mark.gpu
def test_readme_example_runs_on_a_gpu(installed_registry: None, capsys: pytest.CaptureFixture[str]) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(gpu_version(readme_example()), f"{README}:Using an op (GPU)", "exec"), namespace)
    x, w, y = namespace["x"], namespace["w"], namespace["y"]
    assert isinstance(y, torch.Tensor) and y.device.type == "cuda"
    torch.testing.assert_close(y.float(), rms_norm(x, w), atol=2e-2, rtol=2e-2)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3 and "'backend': 'triton'" in printed[0] and "'backend': 'triton'" in printed[2]
