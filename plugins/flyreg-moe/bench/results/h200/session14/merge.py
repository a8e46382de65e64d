"""Builds bench_merged.json, the table of docs/performance.md: every cell from run3.sh's benchmark (one call,
all 56 workloads: bench_large.json, bench_small.json), except the cells re-tuned after it, which take their
timing from the call that re-tuned them (run4.sh: bench_qwen3.json, bench_deepseek.json; then, on the same
machine, bench_gptoss.json and bench_last.json, the later of two timings of a cell). Run from this folder:
``python3 merge.py``."""

import json

ORDER = ["Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V2-Lite", "gpt-oss-20b"]


def rows(path: str) -> list[dict]:
    return json.load(open(path))["rows"]


late: dict = {}
for path in ("bench_qwen3.json", "bench_deepseek.json", "bench_gptoss.json", "bench_last.json"):
    late.update({(r["model"], r["M"]): dict(r, run=f"after the re-tune ({path})") for r in rows(path)})
merged = [late.get((r["model"], r["M"]), dict(r, run="run3"))
          for r in rows("bench_large.json") + rows("bench_small.json")]
merged.sort(key=lambda r: (ORDER.index(r["model"]), r["M"]))
assert len({(r["model"], r["M"]) for r in merged}) == 56 == len(merged)
note = ("All cells from run3.sh's call, except the re-tuned ones, timed in the calls that re-tuned them "
        "(run4.sh and two later calls on its machine).")
with open("bench_merged.json", "w") as f:
    json.dump({"meta": {"run3": json.load(open("bench_large.json"))["meta"], "note": note}, "rows": merged}, f,
              indent=1)
