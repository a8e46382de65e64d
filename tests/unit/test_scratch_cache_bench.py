"""The scratch-cache benchmark runs end to end (small, on the CPU) and reports every row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "scratch_cache.py"


def test_scratch_cache_benchmark_reports_lookups_and_stores(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(BENCH), "--entries", "500", "--samples", "5", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())
    assert rows["entries"] == 500 and rows["database_mb"] > 0
    assert all(rows[k] > 0 for k in rows if k.endswith("median)"))
