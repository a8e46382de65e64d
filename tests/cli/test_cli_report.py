"""``flyreg report`` after a CPU tune: the page, its plots, every journaled spec, coverage, and its errors.

Commands run in fresh interpreters that see flyreg's own ops and the toy op of ``toy_ops.py``
(it states flops as well as bytes) only.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cli_harness import IN_TREE, ONLY_PLUGINS_VARIABLE, Flyreg, one_line_error, table_rows
from toy_ops import NAME, toy_site

pytest.importorskip("matplotlib", reason="flyreg report draws with matplotlib (flyreg[report])")
Image = pytest.importorskip("PIL.Image", reason="the PNG check decodes with Pillow (a matplotlib dependency)")

IMAGE = re.compile(r"<img alt='([^']*)' src='data:image/png;base64,([A-Za-z0-9+/=]+)'>")


@pytest.fixture(scope="module")
def cmd(tmp_path_factory: pytest.TempPathFactory) -> Flyreg:
    root = tmp_path_factory.mktemp("report")
    return Flyreg(root, {NAME: toy_site(root / "site")})


@pytest.fixture(scope="module")
def tuned(cmd: Flyreg) -> list[tuple[str, str]]:
    """Two specs of each RMSNorm op and the toy op's workloads tuned on the CPU: the (op, spec) rows tuned."""
    rows = []
    for args in (["--where", "M=32,dtype=float32"], ["toyscale"]):
        proc = cmd.run("tune", *args, "--device", "cpu")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows += [(r[0], r[1]) for r in table_rows(proc.stdout) if r[-1] == "written"]
    assert {op for op, _ in rows} == {"rmsnorm", "fused_add_rmsnorm", "toyscale"}
    return rows


@pytest.fixture(scope="module")
def report(cmd: Flyreg, tuned: list[tuple[str, str]]) -> tuple[subprocess.CompletedProcess[str], str]:
    proc = cmd.run("report", "--out", str(cmd.root / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = cmd.root / "out" / "index.html"
    assert f"report: {page}" in proc.stdout
    return proc, page.read_text(encoding="utf-8")


def sections(page: str) -> dict[str, str]:
    """Each op's part of the page, by op name."""
    parts = re.split(r"<h2 id='[^']*'>", page)[1:]
    return {part.split(" on ", 1)[0]: part for part in parts}


def test_every_plot_is_a_png_that_decodes(report: tuple[subprocess.CompletedProcess[str], str]) -> None:
    _, page = report
    images = IMAGE.findall(page)
    assert len(images) == page.count("<img ") >= 9  # speedup, spread and bound for each of three ops
    for _, data in images:
        with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as png:
            assert png.format == "PNG"
            png.load()
            assert png.width > 100 and png.height > 100


def test_every_tuned_spec_appears_in_its_op_section(report: tuple[subprocess.CompletedProcess[str], str],
                                                    tuned: list[tuple[str, str]]) -> None:
    _, page = report
    found = sections(page)
    assert set(found) == {op for op, _ in tuned}
    for op, spec in tuned:
        assert f"<td>{html.escape(spec)}</td>" in found[op], (op, spec)
    assert {alt for alt, _ in IMAGE.findall(found["toyscale"])} == {"speedup", "spread", "bound"}


def test_the_page_states_throughput_cost_and_coverage(report: tuple[subprocess.CompletedProcess[str], str]) -> None:
    proc, page = report
    found = sections(page)
    assert "GB/s" in found["rmsnorm"] and "TFLOP/s" in found["toyscale"]  # bytes for RMSNorm, flops too for the toy
    assert re.search(r"\d+ configs timed .*, \d+ failed or rejected, [\d.]+ s of measuring", found["rmsnorm"])
    assert "measured: copy bandwidth" in found["rmsnorm"]  # no CPU is in the known-peaks table
    # RMSNorm declares eight CPU workloads; two of them were tuned: six have no artifact
    assert re.search(r"8 workload\(s\) declared .*2 current.*6 missing", found["rmsnorm"])
    assert found["rmsnorm"].count("<span class='missing'>missing</span>") == 6
    rows = {r[0]: r for r in table_rows(proc.stdout)}
    assert set(rows) == set(found) and rows["rmsnorm"][1] == "2" and rows["rmsnorm"][-1] == "2/8"


def test_an_op_tuned_then_uninstalled_is_still_reported_by_name(cmd: Flyreg, tuned: list[tuple[str, str]]) -> None:
    out = cmd.root / "gone"
    proc = cmd.run("report", "toyscale", "--out", str(out), **{ONLY_PLUGINS_VARIABLE: IN_TREE})  # its distribution gone
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    page = (out / "index.html").read_text(encoding="utf-8")
    assert set(sections(page)) == {"toyscale"}
    toy_specs = [spec for op, spec in tuned if op == "toyscale"]
    assert toy_specs and all(f"<td>{html.escape(spec)}</td>" in page for spec in toy_specs)
    assert "unknown op" in one_line_error(cmd.run("report", "never_tuned_op"), 2)


def test_errors_are_one_line(cmd: Flyreg, tmp_path: Path) -> None:
    empty = cmd.run("report", FLYREG_CACHE_DIR=str(tmp_path / "empty"))
    assert "holds no measurements" in one_line_error(empty, 1)
    assert "unknown op 'rmsnrm'" in one_line_error(cmd.run("report", "rmsnrm"), 2)
    hidden = tmp_path / "hide"
    (hidden / "matplotlib").mkdir(parents=True)
    (hidden / "matplotlib" / "__init__.py").write_text("raise ImportError('hidden by the test')\n", encoding="utf-8")
    without = cmd.run("report", PYTHONPATH=os.pathsep.join([str(hidden), cmd.env["PYTHONPATH"]]))
    assert "pip install 'flyreg[report]'" in one_line_error(without, 1)


# -- what is served, and why ----------------------------------------------------------------------------------------
#: toyscale's specs tuned on a loaded CPU: small ones, where every CHUNK is one or two slices and times tie.
SERVED_SIZES = (64, 200, 256, 1000, 4096)
ROW = re.compile(r"<tr><td>([^<]*)</td><td>([^<]*)</td><td class='n'>[^<]*</td><td>([^<]*)</td>")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Flyreg, str, dict[str, dict[str, Any]]]:
    """toyscale tuned over several specs while another process keeps a core busy; its page, and its artifacts
    by spec text."""
    root = tmp_path_factory.mktemp("served")
    cmd = Flyreg(root, {NAME: toy_site(root / "site")})
    specs = [arg for n in SERVED_SIZES for arg in ("--spec", f"n={n},dtype=float32")]
    load = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 120\nwhile time.time() < end: pass"])
    try:
        proc = cmd.run("tune", "toyscale", "--device", "cpu", *specs)
    finally:
        load.kill()
        load.wait()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    artifacts = {}
    for path in cmd.dirs["configs"].glob("toyscale,*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        artifacts[",".join(f"{k}={v}" for k, v in sorted(data["spec"].items()))] = data
    assert len(artifacts) == len(SERVED_SIZES)
    rep = cmd.run("report", "--out", str(root / "out"))
    assert rep.returncode == 0, rep.stdout + rep.stderr
    return cmd, (root / "out" / "index.html").read_text(encoding="utf-8"), artifacts


def config_text(data: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in (*sorted(data["kwargs"].items()), *sorted(data["hints"].items())))


def test_the_report_serves_what_the_artifact_serves_for_every_spec(
        served: tuple[Flyreg, str, dict[str, dict[str, Any]]]) -> None:
    _, page, artifacts = served
    rows = {html.unescape(spec): (html.unescape(config), html.unescape(why)) for spec, config, why in ROW.findall(page)}
    assert set(rows) == set(artifacts)
    for spec, data in artifacts.items():
        config, why = rows[spec]
        assert config == config_text(data["config"]), spec
        assert why.startswith(data["provenance"]["decision"]["reason"]), (spec, why)
    assert "winner" not in page.lower()  # nothing else is called the winner


def test_the_bound_uses_the_peak_stored_at_tuning(served: tuple[Flyreg, str, dict[str, dict[str, Any]]]) -> None:
    cmd, page, artifacts = served
    stored = {data["provenance"]["decision"]["peak"]["how"] for data in artifacts.values()}
    assert len(stored) == 1 and f"<td>peak</td><td>{html.escape(stored.pop())}</td>" in page
    again = cmd.run("report", "--out", str(cmd.root / "again"))
    assert again.returncode == 0, again.stderr
    second = (cmd.root / "again" / "index.html").read_text(encoding="utf-8")
    bounds = re.compile(r"<td class='n'>([\d.]+)</td><td class='n'>\d+</td><td class='n'>\d+</td>")
    assert bounds.findall(page) and bounds.findall(second) == bounds.findall(page)  # not measured again


# -- hostile text (each crashed the report once) --------------------------------------------------------------------
HOSTILE_OP, HOSTILE_DEVICE = "evil[/]op[bold]", "GPU [/] [red]x"
HOSTILE_SPEC = {"formula": "$\\frac{1$", "huge": "x" * 20_000}


def test_hostile_names_and_spec_values_are_escaped_everywhere(
        served: tuple[Flyreg, str, dict[str, dict[str, Any]]], tmp_path: Path) -> None:
    cmd = Flyreg(tmp_path / "hostile")
    journal = cmd.dirs["cache"] / "flyreg-journal.sqlite3"
    source = sqlite3.connect(served[0].dirs["cache"] / "flyreg-journal.sqlite3")
    with sqlite3.connect(journal) as conn:
        source.backup(conn)  # the tuned journal, its write-ahead log included
    source.close()
    conn.close()
    with sqlite3.connect(journal) as conn:
        config, device, toolchain, timing = conn.execute(
            "SELECT config, device, toolchain, timing FROM measurements WHERE error IS NULL LIMIT 1").fetchone()
        arch = json.loads(device)["arch"]
        for op, dev in ((HOSTILE_OP, json.loads(device)["name"]), ("toyscale", HOSTILE_DEVICE)):
            conn.execute("INSERT INTO measurements (op, spec, config, device, toolchain, timing, median_ms, spread, "
                         "reps, error, created) VALUES (?, ?, ?, ?, ?, ?, 0.01, 0.1, 5, NULL, ?)",
                         (op, json.dumps(HOSTILE_SPEC), config, json.dumps({"arch": arch, "name": dev}), toolchain,
                          timing, time.time()))
    conn.close()
    proc = cmd.run("report", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert HOSTILE_OP in proc.stdout and f"flyreg report on {HOSTILE_DEVICE}" in proc.stdout  # printed as it is
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    found = sections(page)
    assert html.escape(HOSTILE_OP) in found and html.escape(HOSTILE_DEVICE) in page
    for section in (found[html.escape(HOSTILE_OP)], page.split(f"on {html.escape(HOSTILE_DEVICE)}</h2>")[1]):
        assert html.escape(HOSTILE_SPEC["formula"]) in section
        ((alt, data),) = IMAGE.findall(section)[:1]  # the spread plot of the one spec, labelled by its values
        with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as png:
            assert alt == "spread" and png.width < 2000 and png.height < 2000  # the label was cut


def test_an_empty_out_is_refused(served: tuple[Flyreg, str, dict[str, dict[str, Any]]]) -> None:
    cmd = served[0]
    assert "--out" in one_line_error(cmd.run("report", "--out", ""), 2)
    assert not (cmd.root / "index.html").exists()
