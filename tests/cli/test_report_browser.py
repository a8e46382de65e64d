"""The report page renders in a real browser: headless Chromium (Debian's package) screenshots it.

Skipped where Chromium is not installed; CI installs it and runs this file in a step of its own.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cli_harness import Flyreg

pytest.importorskip("matplotlib", reason="flyreg report draws with matplotlib (flyreg[report])")
Image = pytest.importorskip("PIL.Image", reason="the screenshot is read with Pillow (a matplotlib dependency)")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install chromium)")

WIDTH, HEIGHT = 1280, 1600


def screenshot(page: Path, out: Path, profile: Path) -> subprocess.CompletedProcess[str]:
    """Chromium, headless and offline, with a fresh profile, screenshots ``page`` into ``out``."""
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
            f"--screenshot={out}", page.as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def inked(shot: Path) -> int:
    """Pixels of the screenshot that are not background white."""
    with Image.open(shot) as png:
        assert png.size == (WIDTH, HEIGHT)
        colours = png.convert("RGB").getcolors(WIDTH * HEIGHT)
    return sum(n for n, rgb in colours if min(rgb) < 235)


def test_the_report_page_renders_with_its_plots(tmp_path: Path) -> None:
    cmd = Flyreg(tmp_path / "run")
    tuned = cmd.run("tune", "rmsnorm", "--spec", "M=32,N=1024,backend=cpu,dtype=float32", "--device", "cpu")
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    made = cmd.run("report", "--out", str(tmp_path / "report"))
    assert made.returncode == 0, made.stdout + made.stderr
    page = tmp_path / "report" / "index.html"
    text = page.read_text(encoding="utf-8")
    assert text.count("<img ") == 3
    without = tmp_path / "without-plots.html"  # the same page, its images left out
    without.write_text(re.sub(r"<img [^>]*>", "", text), encoding="utf-8")
    shots = {}
    for name, source in (("page", page), ("without", without)):
        shots[name] = tmp_path / f"{name}.png"
        proc = screenshot(source, shots[name], tmp_path / f"profile-{name}")
        assert proc.returncode == 0 and shots[name].is_file(), proc.stderr
    with_plots, text_only = inked(shots["page"]), inked(shots["without"])
    assert text_only > 5000  # the page's text and tables rendered, not a blank or an error page
    assert with_plots > text_only + 20000, (with_plots, text_only)  # and the three PNG plots were decoded and drawn
