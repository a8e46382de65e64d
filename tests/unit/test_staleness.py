"""Staleness per backend: an artifact is stale only when something its spec's backend depends on changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import flyreg._plugins.registry
from flyreg import Config
from flyreg._artifacts.store import emit_artifact, load_artifact
from flyreg._artifacts.validate import SHOWN, check_report, summary
from flyreg._core import toolchain
from flyreg._core.keys import DeviceIdentity, identity_of

CPU = identity_of(None)
H200 = DeviceIdentity("NVIDIA_H200", "sm_90")
SHIPPED = Path(__file__).resolve().parents[2] / "plugins" / "flyreg-rmsnorm" / "flyreg_rmsnorm" / "configs"


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``machine(**parts)`` makes this process's toolchain exactly ``parts`` (flyreg kept)."""

    def set_parts(**parts: str) -> None:
        monkeypatch.setattr(toolchain, "toolchain", lambda: tuple({"flyreg": "0.1.0", **parts}.items()))

    return set_parts


def recorded(**parts: str) -> dict[str, str]:
    return {"flyreg": "0.1.0", **parts}


@pytest.mark.parametrize("backend", [None, "cpu", "torch"])
def test_installing_triton_makes_no_torch_artifact_stale(machine: Any, backend: str | None) -> None:
    spec: dict[str, Any] = {"N": 64} if backend is None else {"N": 64, "backend": backend}
    machine(torch="2.13.0", triton="3.9.0")
    s = toolchain.staleness(recorded(torch="2.13.0", op="1"), spec, CPU.arch, "1")
    assert not s.stale and s.unknown == ()
    machine(torch="2.14.0", triton="3.9.0")
    s = toolchain.staleness(recorded(torch="2.13.0", op="1"), spec, CPU.arch, "1")
    assert s.changed == (("torch", "2.13.0", "2.14.0"),) and s.reason() == "torch 2.13.0 -> 2.14.0"


def test_a_triton_kernel_depends_on_triton_and_cuda_not_torch(machine: Any) -> None:
    spec = {"N": 64, "backend": "triton"}
    tuned = recorded(torch="2.11.0", triton="3.6.0", cuda="13.0", op="3")
    machine(torch="2.13.0", triton="3.6.0", cuda="13.0")
    assert not toolchain.staleness(tuned, spec, H200.arch, "3").stale  # another torch, another flyreg: current
    machine(torch="2.11.0", triton="3.7.0", cuda="13.0")
    assert toolchain.staleness(tuned, spec, H200.arch, "3").changed == (("triton", "3.6.0", "3.7.0"),)
    machine(torch="2.11.0", triton="3.6.0", cuda="12.8")
    assert toolchain.staleness(tuned, spec, H200.arch, "3").changed == (("cuda", "13.0", "12.8"),)
    assert toolchain.staleness(tuned, spec, H200.arch, "4").changed[-1] == ("op", "3", "4")


def test_without_the_devices_platform_only_the_op_version_is_compared(machine: Any) -> None:
    spec = {"N": 64, "backend": "triton"}
    tuned = recorded(torch="2.11.0", triton="3.6.0", cuda="13.0", op="3")
    machine(torch="2.13.0+cpu", triton="3.9.0")  # no CUDA: this machine's Triton says nothing about an sm_90 build
    s = toolchain.staleness(tuned, spec, H200.arch, "3")
    assert (s.stale, s.unknown) == (False, ("triton", "cuda"))
    assert toolchain.staleness(tuned, spec, H200.arch, "4").changed == (("op", "3", "4"),)


def test_an_unknown_backend_depends_on_every_library(machine: Any) -> None:
    machine(torch="2.13.0", triton="3.9.0")
    tuned = recorded(torch="2.13.0", op="1")
    assert toolchain.depends_on({"backend": "cutlass"}, CPU.arch) == ("torch", "triton")
    assert toolchain.staleness(tuned, {"backend": "cutlass"}, CPU.arch, "1").changed == (("triton", None, "3.9.0"),)


def test_artifacts_keep_recording_the_whole_toolchain(isolated_dirs: dict[str, Path]) -> None:
    path = emit_artifact("rec", {"N": 64}, CPU, Config({"A": 1}), "2", None, None)
    assert load_artifact(path).provenance["toolchain"] == toolchain.fingerprint("2")


def test_an_artifact_from_another_flyreg_or_with_triton_installed_since_is_current(
        isolated_dirs: dict[str, Path], machine: Any) -> None:
    path = emit_artifact("rec", {"N": 64}, CPU, Config({"A": 1}), "2", None, None)
    data = json.loads(path.read_text())
    data["provenance"]["toolchain"] = recorded(torch=dict(toolchain.toolchain())["torch"], op="2") | {"flyreg": "0.0.1"}
    path.write_text(json.dumps(data))
    machine(torch=data["provenance"]["toolchain"]["torch"], triton="3.9.0")
    assert not load_artifact(path).stale("2")
    assert check_report([path.parent], {"rec": "2"}).problems == []


def _checked_shipped(tmp_path: Path, versions: dict[str, str]) -> Any:
    return check_report([tmp_path], versions, accepts=flyreg._plugins.registry.accepts)


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    for p in SHIPPED.glob("*.json"):
        shutil.copy(p, tmp_path / p.name)
    return tmp_path


def test_shipped_h200_artifacts_checked_without_cuda_are_one_line_not_450(shipped: Path, machine: Any) -> None:
    machine(torch="2.13.0+cpu", triton="3.9.0")
    versions = {op: flyreg._plugins.registry.REGISTRY.plugin(op).description.version
                for op in ("rmsnorm", "fused_add_rmsnorm")}
    report = _checked_shipped(shipped, versions)
    assert report.problems == [] and report.files == 450
    assert {why for _, why in report.unchecked} == {"sm_90 artifacts: no CUDA here to compare with"}
    lines = summary(report)
    assert lines[0] == "staleness not compared (sm_90 artifacts: no CUDA here to compare with): 450 file(s)"
    assert len(lines) == 1 + SHOWN + 2 and lines[-2] == f"  ... and {450 - SHOWN} more (--verbose lists every file)"
    assert lines[-1] == "checked 450 artifact(s) in 1 dir(s): 0 problem(s)"
    assert len(summary(report, verbose=True)) == 1 + 450 + 1


def test_shipped_artifacts_on_the_tuning_toolchain_are_current_and_grouped_by_what_changed(
        shipped: Path, machine: Any) -> None:
    machine(torch="2.13.0", triton="3.6.0", cuda="13.0")  # the H200's Triton and CUDA; torch does not matter
    versions = {"rmsnorm": "3", "fused_add_rmsnorm": "3"}
    assert _checked_shipped(shipped, versions).problems == []
    machine(torch="2.11.0", triton="3.7.0", cuda="13.0")
    report = _checked_shipped(shipped, {"rmsnorm": "3", "fused_add_rmsnorm": "4"})
    reasons: dict[str, int] = {}
    for p in report.problems:
        assert p.severity == "stale"
        reasons[p.kind] = reasons.get(p.kind, 0) + 1
    assert reasons == {"triton 3.6.0 -> 3.7.0": 225, "triton 3.6.0 -> 3.7.0, op 3 -> 4": 225}
    lines = summary(report)
    assert "stale: triton 3.6.0 -> 3.7.0: 225 file(s)" in lines
    assert "stale: triton 3.6.0 -> 3.7.0, op 3 -> 4: 225 file(s)" in lines
    assert lines[-1] == "checked 450 artifact(s) in 1 dir(s): 0 problem(s), 450 stale (not an error without --strict)"
    assert summary(report, strict=True)[-1] == "checked 450 artifact(s) in 1 dir(s): 450 problem(s)"


def test_check_lists_the_first_files_of_each_finding_and_every_file_with_verbose(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from flyreg._cli.main import cli

    names = [f"rmsnorm,M={m},N=1024,backend=cpu,dtype=float32,device_name=X.json" for m in (1, 32, 256, 4096, 32768)]
    for name in names:
        (tmp_path / name).write_text("{", encoding="utf-8")
    short = CliRunner().invoke(cli, ["check", str(tmp_path)])
    full = CliRunner().invoke(cli, ["check", "--verbose", str(tmp_path)])
    assert short.exit_code == full.exit_code == 1
    lines = short.output.splitlines()
    assert lines[0] == "error: malformed: 5 file(s)"
    assert sum(": error: unreadable JSON" in line for line in lines) == SHOWN
    assert f"  ... and {5 - SHOWN} more (--verbose lists every file)" in lines
    assert lines[-1] == "checked 5 artifact(s) in 1 dir(s): 5 problem(s)"
    assert all(f"{tmp_path / n}: error: unreadable JSON" in full.output for n in names)
    assert "more (--verbose" not in full.output
