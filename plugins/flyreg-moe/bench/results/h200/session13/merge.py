"""Builds bench_merged.json, the table of docs/performance.md: session 10's rows at M <= 32, session 11's at
M = 64 (after its re-tune), this session's at M >= 128, with gpt-oss M = 512 to 8192 from the calls after
their re-tune. Run from this folder: ``python3 merge.py``."""

import json

ORDER = ["Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V2-Lite", "gpt-oss-20b"]


def rows(path: str) -> list[dict]:
    return json.load(open(path))["rows"]


late = {(r["model"], r["M"]): dict(r, run="session13, after the gpt-oss re-tune")
        for r in rows("bench_gptoss.json") + rows("bench_gptoss2.json")}
merged = [dict(r, run="session10") for r in rows("../session10/bench.json") if r["M"] <= 32]
merged += [dict(r, run="session11") for r in rows("../session11/moe_after.json") if r["M"] == 64]
merged += [late.get((r["model"], r["M"]), dict(r, run="session13")) for r in rows("bench.json")]
merged.sort(key=lambda r: (ORDER.index(r["model"]), r["M"]))
assert len({(r["model"], r["M"]) for r in merged}) == 56 == len(merged)
note = ("M<=32 rows: session 10's run; M=64: session 11's (after its re-tune); M>=128: session 13's, gpt-oss "
        "M=512..8192 timed after their re-tune in two later calls. The kernels and configs of M<=64 are those of "
        "today's tree.")
with open("bench_merged.json", "w") as f:
    json.dump({"meta": {"session13": json.load(open("bench.json"))["meta"], "note": note}, "rows": merged}, f,
              indent=1)
