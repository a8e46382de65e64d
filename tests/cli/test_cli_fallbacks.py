"""The fallback chain, visible: exact artifact, nearest spec, another product of the same arch, another
toolchain, default. Each is its own source in ``flyreg.resolve``, ``flyreg show``, the serving record and
``flyreg check --against-record``, and serving a fallback warns once per op and device, not per spec.

Another product of this CPU's arch is faked by an artifact whose device name is another (as an H100 finds
an H200's artifacts); another toolchain by one whose recorded torch is another. The op is ``toyscale``
(``toy_ops.py``: ``n`` ordered, ``dtype`` not).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_harness import Flyreg, table_rows
from toy_ops import NAME, toy_site

#: For each (n, dtype) of argv[1]: resolves it, or (argv[2] "call") calls toyscale with it twice; prints each
#: resolution's source and the fallback warnings.
PROGRAM = """
import json, sys, warnings, torch, flyreg
op = flyreg.op("toyscale")
out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for n, dtype in json.loads(sys.argv[1]):
        x = torch.randn(n, dtype=getattr(torch, dtype))
        if sys.argv[2] == "call":
            op(x); op(x)
        else:
            res = flyreg.resolve("toyscale", x)
            out[f"{n},{dtype}"] = [res.source, res.origin, res.nearest, res.stale]
print(json.dumps({"served": out, "warnings": [str(w.message) for w in caught
                                              if issubclass(w.category, flyreg.FlyregWarning)]}))
"""
CALLS = [[256, "float32"], [1024, "float32"], [2048, "float32"], [512, "float32"], [300, "float32"],
         [64, "float64"]]
SOURCES = {"256,float32": "offline", "1024,float32": "offline-other-device", "2048,float32": "offline-other-device",
           "512,float32": "offline-other-toolchain", "300,float32": "offline-nearest", "64,float64": "default"}


def copy_as(template: Path, n: int, device: str | None = None, torch_version: str | None = None) -> Path:
    data = json.loads(template.read_text(encoding="utf-8"))
    data["spec"]["n"] = n
    if device is not None:
        data["device"]["name"] = device
    if torch_version is not None:
        data["provenance"]["toolchain"]["torch"] = torch_version
    path = template.with_name(f"toyscale,dtype=float32,n={n},device_name={data['device']['name']}.json")
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Flyreg, Path, dict[str, Any]]:
    """An artifact for n=256 tuned here, copies for n=1024 and 2048 on another product of this arch and for
    n=512 with another torch; then PROGRAM's calls under FLYREG_RECORD, and its resolutions: the record and
    what the resolutions printed."""
    root = tmp_path_factory.mktemp("fallbacks")
    cmd = Flyreg(root, {NAME: toy_site(root / "site")})
    tuned = cmd.run("tune", "toyscale", "--spec", "n=256,dtype=float32", "--device", "cpu")
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    (exact,) = cmd.dirs["configs"].glob("toyscale,*.json")
    for n in (1024, 2048):
        copy_as(exact, n, device="Other_CPU_9000")
    copy_as(exact, 512, torch_version="0.0.1")
    record = root / "serving.sqlite3"
    printed = []
    fresh = {"FLYREG_CACHE_DIR": str(root / "fresh-cache")}  # the tune's scratch-cache entry would serve n=256
    for mode, env in (("call", {**fresh, "FLYREG_RECORD": str(record)}), ("resolve", fresh)):
        proc = subprocess.run([sys.executable, "-c", PROGRAM, json.dumps(CALLS), mode], env={**cmd.env, **env},
                              cwd=root, text=True, capture_output=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        printed.append(json.loads(proc.stdout))
    assert printed[0]["warnings"] == printed[1]["warnings"]  # a call warns as a resolution does
    return cmd, record, printed[1]


def test_each_fallback_is_its_own_source_and_warns_once_per_op_and_device(
        served: tuple[Flyreg, Path, dict[str, Any]]) -> None:
    _, _, printed = served
    assert {k: v[0] for k, v in printed["served"].items()} == SOURCES
    assert printed["served"]["300,float32"][2] and printed["served"]["512,float32"][3]  # nearest, stale flags
    assert {v[1] for k, v in printed["served"].items() if SOURCES[k] != "default"} == {"offline"}  # the origin
    fallback = [w for w in printed["warnings"] if "serving artifacts" in w]
    assert len(fallback) == 2, printed["warnings"]  # two specs of another product: one warning
    assert sum("same arch" in w and "Other_CPU_9000" in w for w in fallback) == 1
    assert sum("another toolchain" in w for w in fallback) == 1


def test_show_names_the_fallback_and_what_it_was_tuned_for(served: tuple[Flyreg, Path, dict[str, Any]]) -> None:
    cmd, _, _ = served
    one, table, as_json = cmd.many([
        ["show", "toyscale", "--spec", "n=2048,dtype=float32", "--device", "cpu"],
        ["show", "toyscale", "--spec", "n=300,dtype=float32", "--spec", "n=512,dtype=float32", "--device", "cpu"],
        ["show", "toyscale", "--spec", "n=1024,dtype=float32", "--device", "cpu", "--json"]])
    assert one.returncode == table.returncode == as_json.returncode == 0, one.stderr + table.stderr
    assert "source:  offline-other-device" in one.stdout
    assert re.search(r"note: +tuned on Other_CPU_9000, another product of the same arch", one.stdout), one.stdout
    assert [row[2] for row in table_rows(table.stdout)] == ["offline-nearest", "offline-other-toolchain"]
    (row,) = json.loads(as_json.stdout)
    assert row["source"] == "offline-other-device" and "Other_CPU_9000" in row["path"]


def test_the_record_and_against_record_name_each_fallback_and_from_record_tunes_them(
        served: tuple[Flyreg, Path, dict[str, Any]]) -> None:
    cmd, record, _ = served
    check, plan = cmd.many([["check", "--against-record", str(record)],
                            ["tune", "--from-record", str(record), "--device", "cpu", "--dry-run",
                             "--out", str(cmd.dirs["configs"])]])
    assert check.returncode == 1, check.stdout + check.stderr
    found = {f"{m[3]},{m[2]}": (m[1], m[4]) for m in re.finditer(
        r"^(missing|stale artifact): toyscale dtype=(\w+),n=(\d+) on .*: 2 call\(s\) served by (\S+)$",
        check.stdout, re.M)}
    assert found == {"1024,float32": ("missing", "offline-other-device"),
                     "2048,float32": ("missing", "offline-other-device"),
                     "512,float32": ("stale artifact", "offline-other-toolchain"),
                     "300,float32": ("missing", "offline-nearest"), "64,float64": ("missing", "default")}
    assert plan.returncode == 0, plan.stdout + plan.stderr
    planned = {spec for _, spec, action in table_rows(plan.stdout) if action == "tune"}
    assert planned == {f"dtype={k.split(',')[1]},n={k.split(',')[0]}" for k in found}
