"""Scratch-cache cost at scale: the lookup of a new key and a store, in a database of many entries.

    python benchmarks/scratch_cache.py [--entries 200000] [--samples 200]

Fills a fresh cache dir with ``--entries`` entries of realistic size: one written by a real search,
the rest copies of it under other keys, written straight into the cache's documented table (the
setup, not what is measured). Then, in a fresh process, times through the public API, each the
median over ``--samples`` tries: the first resolution of the searched key (what the first call of a
new key pays, the process's first connection to the database included; imports are warmed on another
cache dir first), the resolution of that key and of an
absent one by a new tuner each (key building, the lookup, and for the absent key the artifact
directories and the default), the resolution of the searched spec by spec alone (``resolve_spec``,
what ``flyreg show`` runs: it reads the entries whose key a call of that spec could have, among
``--entries`` keys of other specs), and a search of one config (its store included). Prints a table and,
with ``--json``, writes it. Runs on the CPU; no GPU needed.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

#: The op of the benchmark: ``out = x`` with one config and a default, spec ``{"M": rows}``; imported by both
#: processes (``make()`` a new tuner, ``rows(m)`` a call of spec M=m).
OP = """
import torch
import flyreg
from flyreg import Config


def make():
    return flyreg.autotune_builder("op", lambda config, spec: (lambda x: x), lambda x: {"M": int(x.shape[0])},
                                   [Config({"BLOCK_N": 4096, "ROWS": 1}, num_warps=8)],
                                   lambda spec: Config({"BLOCK_N": 4096, "ROWS": 1}, num_warps=8), warmup=0, rep=1)


def rows(m):
    return torch.zeros(m, 8)
"""

CHILD = OP + """
import json, os, sys, tempfile, time
samples = int(sys.argv[1])
real = os.environ["FLYREG_CACHE_DIR"]
with tempfile.TemporaryDirectory() as warm:  # the first resolution anywhere imports what a call needs: not timed
    os.environ["FLYREG_CACHE_DIR"] = warm
    make().resolve(rows(1))
    os.environ["FLYREG_CACHE_DIR"] = real
t0 = time.perf_counter(); first = make().resolve(rows(1)); first_ms = (time.perf_counter() - t0) * 1e3
assert first.source == "cache", first
out = {"first_resolve_ms": first_ms, "hit_ms": [], "miss_ms": [], "spec_ms": [], "search_ms": []}
for s in range(samples):
    tuner = make()
    t0 = time.perf_counter(); hit = tuner.resolve(rows(1)); out["hit_ms"].append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter(); miss = tuner.resolve(rows(2 + s)); out["miss_ms"].append((time.perf_counter() - t0) * 1e3)
    assert (hit.source, miss.source) == ("cache", "default"), (hit, miss)
    t0 = time.perf_counter(); by_spec = make().resolve_spec({"M": 1}); out["spec_ms"].append((time.perf_counter() - t0) * 1e3)
    assert by_spec.source == "cache", by_spec
    t0 = time.perf_counter(); tuner.tune(rows(100_000 + s), emit=False)
    out["search_ms"].append((time.perf_counter() - t0) * 1e3)
print(json.dumps(out))
"""

SEARCH_ONE = OP + """
make().tune(rows(1), emit=False)
"""


def fill(directory: str, entries: int) -> None:
    """One real search's entry, and ``entries - 1`` copies of it under the keys of other specs (its key with
    another ``M``)."""
    subprocess.run([sys.executable, "-c", SEARCH_ONE], check=True, env=os.environ.copy())
    with sqlite3.connect(os.path.join(directory, "flyreg-cache.sqlite3")) as conn:
        ((real, text),) = conn.execute("SELECT key, entry FROM entries WHERE op = 'op'").fetchall()
        entry, fields = json.loads(text), json.loads(real)

        def copies() -> object:
            for i in range(entries - 1):
                entry["spec"] = fields["spec"] = {"M": 1_000_000 + i}
                yield json.dumps(fields, sort_keys=True, separators=(",", ":")), json.dumps(entry, sort_keys=True)

        conn.executemany("INSERT INTO entries VALUES ('op', ?, ?, 0)", copies())
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.entries < 1 or args.samples < 1:
        ap.error("--entries and --samples must be >= 1")
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as configs:
        os.environ.update({"FLYREG_CACHE_DIR": d, "FLYREG_CONFIG_DIR": configs})
        t0 = time.perf_counter()
        fill(d, args.entries)
        fill_s = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        done = subprocess.run([sys.executable, "-c", CHILD, str(args.samples)], capture_output=True, text=True,
                              check=True, env=os.environ.copy())
        r = json.loads(done.stdout)
    rows = {"entries": args.entries, "database_mb": size / 1e6, "fill_s": fill_s,
            "first_resolve_ms (new process, first connection)": r["first_resolve_ms"],
            "resolve_hit_ms (new tuner, key present; median)": statistics.median(r["hit_ms"]),
            "resolve_miss_ms (new tuner, key absent; median)": statistics.median(r["miss_ms"]),
            "resolve_spec_ms (new tuner, by spec alone; median)": statistics.median(r["spec_ms"]),
            "search_and_store_ms (one config; median)": statistics.median(r["search_ms"]),
            "search_and_store_ms (one config; max)": max(r["search_ms"])}
    for k, v in rows.items():
        print(f"{k:52s} {v:12.3f}" if isinstance(v, float) else f"{k:52s} {v:12d}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
