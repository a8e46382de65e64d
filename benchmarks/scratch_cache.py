"""Scratch-cache cost at scale: the lookup of a new key and a store, in a database of many entries.

    python benchmarks/scratch_cache.py [--entries 200000] [--samples 200]

Fills a fresh cache dir with ``--entries`` entries of realistic size (one op, spread over keys like
a call key's hash), then times, each as the median over ``--samples`` tries in a fresh process's
first connection and then warm: ``get`` of a key that is present and of one that is absent (what
the first call of a new key pays), and ``store`` of a new entry (one transaction). Prints a table
and, with ``--json``, writes it. Runs on the CPU; no GPU needed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def entry(i: int) -> dict[str, object]:
    return {"spec": {"M": i % 8192, "N": 4096, "dtype": "bfloat16", "backend": "triton"},
            "device": {"name": "NVIDIA_H200", "arch": "sm_90"},
            "toolchain": {"flyreg": "0.1.0", "torch": "2.11.0", "triton": "3.6.0", "op": "3"},
            "env": {}, "config": {"kwargs": {"BLOCK_N": 4096, "ROWS": 1}, "hints": {"num_warps": 8}},
            "time_ms": 0.0123, "default_ms": 0.0130, "date": "2026-12-01T00:00:00+00:00"}


def key(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


CHILD = """
import json, sys, time
from flyreg._artifacts import cache
n, samples = int(sys.argv[1]), int(sys.argv[2])
t0 = time.perf_counter(); hit = cache.get("op", sys.argv[3]); first = time.perf_counter() - t0
assert hit is not None
out = {"first_get_ms": first * 1e3, "get_hit_ms": [], "get_miss_ms": [], "store_ms": []}
for s in range(samples):
    t0 = time.perf_counter(); cache.get("op", sys.argv[3]); out["get_hit_ms"].append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter(); cache.get("op", f"absent-{s}"); out["get_miss_ms"].append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter(); cache.store("op", f"new-{s}", json.loads(sys.argv[4]))
    out["store_ms"].append((time.perf_counter() - t0) * 1e3)
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.entries < 1 or args.samples < 1:
        ap.error("--entries and --samples must be >= 1")
    with tempfile.TemporaryDirectory() as d:
        os.environ["FLYREG_CACHE_DIR"] = d
        from flyreg._artifacts import cache

        t0 = time.perf_counter()
        text = json.dumps(entry(0), sort_keys=True)
        with cache.DB.write() as conn:  # bulk fill in one transaction: the setup, not what is measured
            conn.executemany("INSERT INTO entries VALUES ('op', ?, ?, 0)", ((key(i), text) for i in range(args.entries)))
        fill = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        cache.close()
        done = subprocess.run([sys.executable, "-c", CHILD, str(args.entries), str(args.samples), key(args.entries // 2),
                               json.dumps(entry(1))], capture_output=True, text=True, check=True, env=os.environ.copy())
        r = json.loads(done.stdout)
    rows = {"entries": args.entries, "database_mb": size / 1e6, "fill_s": fill,
            "first_get_ms (new process, first connection)": r["first_get_ms"],
            "get_hit_ms (median)": statistics.median(r["get_hit_ms"]),
            "get_miss_ms (median)": statistics.median(r["get_miss_ms"]),
            "store_ms (median)": statistics.median(r["store_ms"]),
            "store_ms (max)": max(r["store_ms"])}
    for k, v in rows.items():
        print(f"{k:48s} {v:12.3f}" if isinstance(v, float) else f"{k:48s} {v:12d}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
