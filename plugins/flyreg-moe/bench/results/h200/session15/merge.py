"""Builds bench_merged.json, the table of docs/performance.md: session 14's table (../session14/bench_merged.json)
with its M = 4096 and 8192 cells of all four shapes taken from run1.sh's benchmark (bench.json), which ran
right after that call re-tuned six of those eight specs. Run from this folder: ``python3 merge.py``."""

import json

late = {(r["model"], r["M"]): dict(r, run="session 15 (run1.sh, after the re-tune)")
        for r in json.load(open("bench.json"))["rows"]}
base = json.load(open("../session14/bench_merged.json"))
merged = [late.get((r["model"], r["M"]), r) for r in base["rows"]]
assert len(late) == 8 and sum(r["run"].startswith("session 15") for r in merged) == 8 and len(merged) == 56
note = base["meta"]["note"] + " Session 15: M = 4096 and 8192 from run1.sh's call, after its re-tune."
with open("bench_merged.json", "w") as f:
    json.dump({"meta": {**base["meta"], "session15": json.load(open("bench.json"))["meta"], "note": note},
               "rows": merged}, f, indent=1)
