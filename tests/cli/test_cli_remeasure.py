"""``flyreg check --remeasure``: each artifact's config re-timed here against the default and the configs
around it, with a verdict (keep, stale-but-fine, retune), the cost of each fallback source, a JSON report,
and ``--retune`` tuning the retune set alone.

The op is ``toynap`` (``toy_ops.py``): its configs only sleep, 1, 6 and 18 ms (6 is the default), so even a
loaded 2-core machine times them in that order, far apart; the verdicts asserted are those of such gaps.
Artifacts of another product of this CPU's arch and of another toolchain are written by hand, as a
machine with an H200's artifacts and a newer Triton has them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli_harness import Flyreg, one_line_error, table_rows
from toy_ops import NAP_DEFAULT, NAP_NAME, nap_site, shipped_naps


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Flyreg, Path]:
    """Artifacts of toynap: n=64 the fastest config (keep), n=128 the slowest (retune), n=256 the fastest
    tuned on another product of this arch, n=512 the fastest tuned with another torch."""
    root = tmp_path_factory.mktemp("remeasure")
    cmd = Flyreg(root, {NAP_NAME: nap_site(root / "site")})
    shipped = root / "shipped"
    tuned = cmd.run("tune", "toynap", "--spec", "n=64", "--device", "cpu", "--out", str(shipped))
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    shipped_naps(shipped)
    return cmd, shipped


def by_n(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {row["spec"]["n"]: row for row in report["rows"]}


def test_remeasure_classifies_each_artifact_and_costs_each_fallback(shipped: tuple[Flyreg, Path]) -> None:
    cmd, directory = shipped
    report_path = cmd.root / "remeasure.json"
    proc = cmd.run("check", "--remeasure", str(directory), "--device", "cpu", "--report", str(report_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # an artifact to re-tune
    rows = by_n(json.loads(report_path.read_text(encoding="utf-8")))
    assert {n: (r["source"], r["verdict"]) for n, r in rows.items()} == {
        64: ("offline", "keep"), 128: ("offline", "retune"),
        256: ("offline-other-device", "stale-but-fine"), 512: ("offline-other-toolchain", "stale-but-fine")}
    for n in (64, 256, 512):  # the 1 ms nap: the fastest, well ahead of the 6 ms default
        assert rows[n]["served"]["config"]["kwargs"] == {"NAP": 1} and rows[n]["vs_default"] > 1.5
        assert rows[n]["fastest"]["config"] == rows[n]["served"]["config"] and rows[n]["slower_than_fastest"] == 0
    slow = rows[128]
    assert slow["fastest"]["config"]["kwargs"] == {"NAP": 1} and slow["slower_than_fastest"] > 1
    assert slow["default"]["config"]["kwargs"] == {"NAP": NAP_DEFAULT} and slow["vs_default"] < 0.6
    assert all(r["whole_space_timed"] and len(r["measured"]) == 3 for r in rows.values())
    assert rows[256]["tuned_on"] == "Other_CPU_9000" and rows[512]["stale"]
    assert all([Path(f).parent for f in r["files"]] == [directory] for r in rows.values())
    assert json.loads(report_path.read_text())["retune"] == [
        {"op": "toynap", "spec": {"n": 128}, "command": "flyreg tune toynap --spec n=128"}]

    progress = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    assert progress == ["[1/4] toynap n=64: keep", "[2/4] toynap n=128: retune", "[3/4] toynap n=256: stale-but-fine",
                        "[4/4] toynap n=512: stale-but-fine"]
    table = {row[1]: row for row in table_rows(proc.stdout)}
    assert {spec: row[-1] for spec, row in table.items()} == {
        "n=64": "keep", "n=128": "retune", "n=256": "stale-but-fine", "n=512": "stale-but-fine"}
    lines = proc.stdout.splitlines()
    assert any(line.startswith("cost of source offline-other-device: 1 spec(s), 0.0% slower") for line in lines)
    assert any(line.startswith("cost of source offline-other-toolchain: 1 spec(s)") for line in lines)
    assert lines[-2].startswith("remeasured 4 spec(s) on ") and "1 keep, 2 stale-but-fine, 1 retune" in lines[-2]
    assert lines[-1] == "to re-tune: flyreg tune toynap --spec n=128"


def test_retune_tunes_the_retune_set_alone_and_it_is_then_kept(shipped: tuple[Flyreg, Path]) -> None:
    cmd, directory = shipped
    out = cmd.root / "retuned"
    proc = cmd.run("check", "--remeasure", str(directory), "--op", "toynap", "--where", "n=128", "--where", "n=99",
                   "--device", "cpu", "--retune", "--out", str(out), "--report", str(cmd.root / "first.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[1/1] toynap n=128: retune" in proc.stderr.splitlines()  # --where: that spec alone
    (written,) = out.glob("*.json")
    data = json.loads(written.read_text(encoding="utf-8"))
    assert (data["spec"], data["config"]["kwargs"]) == ({"n": 128}, {"NAP": 1})
    again = cmd.run("check", "--remeasure", str(out), "--device", "cpu", "--report", str(cmd.root / "again.json"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert {n: r["verdict"] for n, r in by_n(json.loads((cmd.root / "again.json").read_text())).items()} == {
        128: "keep"}


def test_remeasure_options_need_it(shipped: tuple[Flyreg, Path]) -> None:
    cmd, directory = shipped
    for argv, what in ((["--op", "toynap"], "--op needs --remeasure"), (["--retune"], "--retune needs --remeasure"),
                       (["--where", "n=1"], "--where needs --remeasure"),
                       (["--remeasure", "--out", "x"], "--out needs --retune")):
        assert what in one_line_error(cmd.run("check", str(directory), *argv), 2)


def test_a_separably_faster_config_within_the_margin_is_stale_but_fine(shipped: tuple[Flyreg, Path]) -> None:
    cmd, directory = shipped
    report = cmd.root / "wide.json"
    proc = cmd.run("check", "--remeasure", str(directory), "--where", "n=128", "--margin", "100000", "--device", "cpu",
                   "--report", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr  # nothing to re-tune
    (row,) = json.loads(report.read_text(encoding="utf-8"))["rows"]
    assert row["verdict"] == "stale-but-fine" and row["fastest"]["config"]["kwargs"] == {"NAP": 1}
    assert "within the margin of 100000%" in row["reason"]
