"""docs/plugin_authoring.md's declared Triton op, installed as the page writes it (its python block as
``my_kernels/scale.py``, its toml block as the entry point) and run through ``flyreg list``, ``tune``,
``show`` and ``check`` on the CPU (its fallback), and its kernel through Triton's interpreter."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "plugin_authoring.md"
SECTION = "## Declare a Triton op"
ONLY_PLUGINS = ROOT / "tests" / "cli" / "only_plugins"  # its sitecustomize.py limits op discovery
PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "my-kernels"
version = "0.1.0"
dependencies = ["flyreg", "torch", "triton"]

[tool.setuptools]
packages = ["my_kernels"]

"""


def page_blocks() -> tuple[str, str]:
    """The section's python block and its toml block."""
    section = DOC.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)
    (toml,) = re.findall(r"^```toml\n(.*?)^```", section, re.S | re.M)
    return code, toml


def test_the_op_is_complete_in_at_most_30_lines() -> None:
    code, toml = page_blocks()
    assert len(code.splitlines()) + len(toml.splitlines()) <= 30
    for part in ("@triton.jit", "configs=", "default=", "cpu=", "triton_op("):
        assert part in code
    assert "hookimpl" not in code and "flyreg.triton" not in code  # every hook derived; authors import flyreg.plugin
    assert 'scale = "my_kernels.scale:scale"' in toml


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page's plugin, installed by pip into a fresh target directory."""
    root = tmp_path_factory.mktemp("docs-triton-op")
    code, toml = page_blocks()
    src = root / "src"
    (src / "my_kernels").mkdir(parents=True)
    (src / "my_kernels" / "__init__.py").write_text("", encoding="utf-8")
    (src / "my_kernels" / "scale.py").write_text(code, encoding="utf-8")
    (src / "pyproject.toml").write_text(PYPROJECT + toml, encoding="utf-8")
    target = root / "site"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1", "PIP_NO_INPUT": "1"}
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--target", str(target), str(src)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"
    return target


@pytest.fixture(scope="module")
def env(site: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A command environment seeing only the installed page's op, with empty flyreg dirs."""
    root = tmp_path_factory.mktemp("docs-triton-op-dirs")
    out = {k: v for k, v in os.environ.items() if not k.startswith(("FLYREG_", "_FLYREG_", "XDG_", "TRITON_"))}
    out.update({"FLYREG_CACHE_DIR": str(root / "cache"), "FLYREG_CONFIG_DIR": str(root / "configs"),
                "XDG_CONFIG_HOME": str(root / "xdg_config"), "XDG_CACHE_HOME": str(root / "xdg_cache"),
                "PYTHONPATH": os.pathsep.join([str(ONLY_PLUGINS), str(site)]),
                "_FLYREG_TEST_DISTRIBUTIONS": "my-kernels", "PYTHONWARNINGS": "ignore", "CUDA_VISIBLE_DEVICES": "",
                "COLUMNS": "200"})
    return out


def flyreg(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flyreg", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_listed_tuned_shown_and_checked_on_the_cpu(env: dict[str, str]) -> None:
    listed = flyreg(env, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)["ops"]
    assert (row["op"], row["distribution"], row["status"], row["artifacts"]) == ("scale", "my-kernels", "ok", 0)

    tuned = flyreg(env, "tune", "scale")
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    configs = Path(env["FLYREG_CONFIG_DIR"])
    (artifact,) = configs.glob("scale,*.json")
    stored = json.loads(artifact.read_text(encoding="utf-8"))
    assert stored["spec"] == {"backend": "cpu", "dtype": "float32", "n": 4096}  # the cpu workload, backend added

    shown = flyreg(env, "show", "scale", "--spec", "n=4096,dtype=float32", "--json")  # the backend from the device
    assert shown.returncode == 0, shown.stderr
    (served,) = json.loads(shown.stdout)
    assert served["spec"] == stored["spec"] and served["config"] == stored["config"] == {"kwargs": {}, "hints": {}}
    assert served["offline"] == str(artifact)
    wrong = flyreg(env, "show", "scale", "--spec", "n=4096,dtyp=float32")
    assert wrong.returncode != 0 and "dtyp" in wrong.stderr

    checked = flyreg(env, "check", str(configs))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "checked 1 artifact(s) in 1 dir(s): 0 problem(s)" in checked.stdout


def test_served_by_the_fallback_and_the_kernel_agrees_in_the_interpreter(env: dict[str, str]) -> None:
    code = """
        import json, torch, flyreg
        from flyreg.plugin import Config
        from my_kernels.scale import scale
        x = torch.randn(3000)
        served = flyreg.op("scale")
        out = {"fallback": torch.equal(served(x, 0.5), x * 0.5), "keyword": torch.equal(served(x, alpha=3.0), x * 3),
               "spec": flyreg.resolve("scale", x).spec}
        try:
            served(x, 1.0, 2)
        except TypeError as e:
            out["bad_call"] = str(e)
        spec = {"n": 3000, "dtype": "float32", "backend": "triton"}
        for c in scale.configs(spec):  # the kernel, on CPU tensors in Triton's interpreter
            launch = scale.build(c, spec)
            out[str(c.kwargs["BLOCK"])] = torch.allclose(launch(x, 1.5), 1.5 * x) and torch.allclose(launch(x), 2 * x)
        print(json.dumps(out))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**env, "TRITON_INTERPRET": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.pop("fallback") and out.pop("keyword")
    assert out.pop("spec") == {"backend": "cpu", "dtype": "float32", "n": 3000}
    assert "too many positional arguments" in out.pop("bad_call")
    assert out == {"256": True, "1024": True, "4096": True}
