"""Staleness per backend: an artifact is stale only when something its spec's backend depends on changed.

Each other machine is a fresh process that sees exactly the given torch, Triton and CUDA versions
installed (what flyreg reads of them is read once a process) and checks a directory of artifacts with
``flyreg.check_artifacts``.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import flyreg
from flyreg import Config, DeviceIdentity

from on_disk import read_json, this_device, write_artifact

H200 = DeviceIdentity("NVIDIA_H200", "sm_90")
SHIPPED = Path(__file__).resolve().parents[2] / "plugins" / "flyreg-rmsnorm" / "flyreg_rmsnorm" / "configs"
SHOWN = 3  # the files listed under each finding without --verbose (docs/cli.md)

#: A process on a machine with exactly the torch, Triton and CUDA of PARTS (JSON) that checks the artifacts in
#: DIR against the op versions of KNOWN (JSON; null: none given) and prints each problem's
#: [file name, severity, kind].
CHECK_ON = """
import importlib.metadata, json, sys
import torch
import flyreg

parts, directory, known = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
real = importlib.metadata.version


def version(name):
    key = {"torch": "torch", "triton": "triton", "pytorch-triton": "triton"}.get(name)
    if key is None:
        return real(name)
    if key not in parts:
        raise importlib.metadata.PackageNotFoundError(name)
    return parts[key]


importlib.metadata.version = version
torch.version.cuda = parts.get("cuda")
torch.version.hip = None
accepts = flyreg.accepts if known and set(known) <= {"rmsnorm", "fused_add_rmsnorm"} else None
problems = flyreg.check_artifacts([directory], known, accepts=accepts)
print(json.dumps([[p.path.name, p.severity, p.kind] for p in problems]))
"""


@pytest.fixture
def check_on(fresh_process: Any) -> Callable[..., list[list[str]]]:
    """``check_on(directory, known, **parts)``: the problems a machine with exactly ``parts`` finds there."""

    def check(directory: Path, known: dict[str, str] | None, **parts: str) -> list[list[str]]:
        argv = [json.dumps(parts), str(directory), json.dumps(known)]
        return fresh_process.run(f"import sys\nsys.argv[1:] = {argv!r}\n" + CHECK_ON).one()  # type: ignore[no-any-return]

    return check


def recorded(**parts: str) -> dict[str, str]:
    return {"flyreg": "0.1.0", **parts}


def one_artifact(directory: Path, spec: dict[str, Any], tuned: dict[str, str], device: DeviceIdentity | None = None) -> Path:
    return write_artifact(directory, "rec", spec, Config({"A": 1}), device=device, toolchain=tuned)


@pytest.mark.parametrize("backend", [None, "cpu", "torch"])
def test_installing_triton_makes_no_torch_artifact_stale(check_on: Any, tmp_path: Path, backend: str | None) -> None:
    spec: dict[str, Any] = {"N": 64} if backend is None else {"N": 64, "backend": backend}
    path = one_artifact(tmp_path, spec, recorded(torch="2.13.0", op="1"))
    assert check_on(tmp_path, {"rec": "1"}, torch="2.13.0", triton="3.9.0") == []
    assert check_on(tmp_path, {"rec": "1"}, torch="2.14.0", triton="3.9.0") == \
        [[path.name, "stale", "torch 2.13.0 -> 2.14.0"]]


def test_a_triton_kernel_depends_on_triton_and_cuda_not_torch(check_on: Any, tmp_path: Path) -> None:
    path = one_artifact(tmp_path, {"N": 64, "backend": "triton"},
                        recorded(torch="2.11.0", triton="3.6.0", cuda="13.0", op="3"), H200)
    assert check_on(tmp_path, {"rec": "3"}, torch="2.13.0", triton="3.6.0", cuda="13.0") == []  # another torch
    assert check_on(tmp_path, {"rec": "3"}, torch="2.11.0", triton="3.7.0", cuda="13.0") == \
        [[path.name, "stale", "triton 3.6.0 -> 3.7.0"]]
    assert check_on(tmp_path, {"rec": "3"}, torch="2.11.0", triton="3.6.0", cuda="12.8") == \
        [[path.name, "stale", "cuda 13.0 -> 12.8"]]
    assert check_on(tmp_path, {"rec": "4"}, torch="2.11.0", triton="3.6.0", cuda="12.8") == \
        [[path.name, "stale", "cuda 13.0 -> 12.8, op 3 -> 4"]]


def test_without_the_devices_platform_only_the_op_version_is_compared(check_on: Any, tmp_path: Path) -> None:
    path = one_artifact(tmp_path, {"N": 64, "backend": "triton"},
                        recorded(torch="2.11.0", triton="3.6.0", cuda="13.0", op="3"), H200)
    # no CUDA: this machine's Triton says nothing about an sm_90 build
    assert check_on(tmp_path, {"rec": "3"}, torch="2.13.0+cpu", triton="3.9.0") == []
    assert check_on(tmp_path, {"rec": "4"}, torch="2.13.0+cpu", triton="3.9.0") == [[path.name, "stale", "op 3 -> 4"]]


def test_an_unknown_backend_depends_on_every_library(check_on: Any, tmp_path: Path) -> None:
    path = one_artifact(tmp_path, {"backend": "cutlass"}, recorded(torch="2.13.0", op="1"))
    assert check_on(tmp_path, {"rec": "1"}, torch="2.13.0", triton="3.9.0") == \
        [[path.name, "stale", "triton none -> 3.9.0"]]
    assert check_on(tmp_path, {"rec": "1"}, torch="2.13.0") == []


def test_artifacts_keep_recording_the_whole_toolchain(tmp_path: Path) -> None:
    tuner = flyreg.autotune_builder("rec", lambda c, s: (lambda x: x), lambda x: {"N": 64}, [Config({"A": 1})],
                                    version="2", build_cache=flyreg.BuildCache(), warmup=0, rep=1)
    tuned = read_json(str(tuner.tune(torch.zeros(1), out_dir=tmp_path).artifact))["provenance"]["toolchain"]
    want = {"flyreg": flyreg.__version__, "torch": importlib.metadata.version("torch"), "op": "2"}
    try:
        want["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pass
    if torch.version.cuda:
        want["cuda"] = torch.version.cuda
    assert tuned == want  # a torch kernel's artifact records Triton too: a later check may need it


def test_an_artifact_from_another_flyreg_or_with_triton_installed_since_is_current(check_on: Any,
                                                                                   tmp_path: Path) -> None:
    one_artifact(tmp_path, {"N": 64}, recorded(torch="2.13.0", op="2") | {"flyreg": "0.0.1"})
    assert check_on(tmp_path, {"rec": "2"}, torch="2.13.0", triton="3.9.0") == []


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    for p in SHIPPED.glob("*.json"):
        shutil.copy(p, tmp_path / p.name)
    return tmp_path


@pytest.mark.skipif(bool(torch.version.cuda), reason="checks the H200's artifacts where there is no CUDA")
def test_shipped_h200_artifacts_checked_without_cuda_are_one_line_not_450(
        shipped: Path, flyreg_cli: Callable[..., Any]) -> None:
    lines = flyreg_cli("check", str(shipped)).out.splitlines()
    per_op = Counter(p.name.split(",")[0] for p in shipped.glob("*.json"))
    assert lines == [  # one line, counted per op and device, then the totals
        "staleness not compared (sm_90 artifacts: no CUDA here to compare with): 450 file(s) ("
        + ", ".join(f"{op} on NVIDIA_H200: {n}" for op, n in sorted(per_op.items())) + "); --verbose lists them",
        "checked 450 artifact(s) in 1 dir(s): 0 problem(s)"]
    verbose = flyreg_cli("check", "--verbose", str(shipped)).out.splitlines()
    assert len(verbose) == 1 + 450 + 1 and all(line.startswith(f"  {shipped}") for line in verbose[1:-1])


def test_shipped_artifacts_on_the_tuning_toolchain_are_current_and_grouped_by_what_changed(
        shipped: Path, check_on: Any) -> None:
    # the H200's Triton and CUDA; torch does not matter
    assert check_on(shipped, {"rmsnorm": "3", "fused_add_rmsnorm": "3"}, torch="2.13.0", triton="3.6.0",
                    cuda="13.0") == []
    problems = check_on(shipped, {"rmsnorm": "3", "fused_add_rmsnorm": "4"}, torch="2.11.0", triton="3.7.0",
                        cuda="13.0")
    assert {severity for _, severity, _ in problems} == {"stale"}
    assert Counter(kind for _, _, kind in problems) == {"triton 3.6.0 -> 3.7.0": 225,
                                                        "triton 3.6.0 -> 3.7.0, op 3 -> 4": 225}


def test_check_groups_stale_artifacts_by_what_changed(tmp_path: Path, flyreg_cli: Callable[..., Any]) -> None:
    torch_now = importlib.metadata.version("torch")
    here = {"torch": torch_now}
    for m in (1, 32, 256, 4096, 32768):
        write_artifact(tmp_path, "rmsnorm", {"M": m, "N": 1024, "backend": "cpu", "dtype": "float32"},
                       Config({"ROW_BLOCK": 1}), toolchain={**here, "torch": "1.0.0", "op": flyreg.op("rmsnorm").version})
    write_artifact(tmp_path, "rmsnorm", {"M": 32, "N": 4096, "backend": "cpu", "dtype": "float32"},
                   Config({"ROW_BLOCK": 1}), toolchain={**here, "op": "0"})
    run = flyreg_cli("check", str(tmp_path))
    lines = run.out.splitlines()
    assert run.code == 0  # stale is not an error without --strict
    assert f"stale: torch 1.0.0 -> {torch_now}: 5 file(s)" in lines
    assert f"stale: op 0 -> {flyreg.op('rmsnorm').version}: 1 file(s)" in lines
    assert f"  ... and {5 - SHOWN} more (--verbose lists every file)" in lines
    assert lines[-1] == "checked 6 artifact(s) in 1 dir(s): 0 problem(s), 6 stale (not an error without --strict)"
    strict = flyreg_cli("check", "--strict", str(tmp_path))
    assert strict.code == 1 and strict.out.splitlines()[-1] == "checked 6 artifact(s) in 1 dir(s): 6 problem(s)"


def test_check_lists_the_first_files_of_each_finding_and_every_file_with_verbose(
        tmp_path: Path, flyreg_cli: Callable[..., Any]) -> None:
    names = [f"rmsnorm,M={m},N=1024,backend=cpu,dtype=float32,device_name=X.json" for m in (1, 32, 256, 4096, 32768)]
    for name in names:
        (tmp_path / name).write_text("{", encoding="utf-8")
    short = flyreg_cli("check", str(tmp_path))
    full = flyreg_cli("check", "--verbose", str(tmp_path))
    assert short.code == full.code == 1
    lines = short.out.splitlines()
    assert lines[0] == "error: malformed: 5 file(s)"
    assert sum(": error: unreadable JSON" in line for line in lines) == SHOWN
    assert f"  ... and {5 - SHOWN} more (--verbose lists every file)" in lines
    assert lines[-1] == "checked 5 artifact(s) in 1 dir(s): 5 problem(s)"
    assert all(f"{tmp_path / n}: error: unreadable JSON" in full.out for n in names)
    assert "more (--verbose" not in full.out
    assert not re.search(r"Traceback", short.err + full.err)
