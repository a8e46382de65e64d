"""The docs' RMSNorm bandwidth table and its bar checks, from a ``rmsnorm_bandwidth.py --json`` file.

    python benchmarks/bandwidth_table.py benchmarks/results/rmsnorm_bandwidth_bf16.json

Prints a Markdown table (TB/s, device time, % of the run's copy, the served config without
programmatic dependent launch, the default, the peers, flyreg over the best peer) and, below it,
the RMSNorm issue's bars as this run measured them. Needs no GPU.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

PEERS = ("torch", "compile", "liger")


def _best_peer(row: dict[str, Any]) -> tuple[str, float]:
    """The fastest peer of a row and its TB/s; ``("-", 0.0)`` when every peer failed."""
    peers = {p: row[p] for p in PEERS if row.get(p)}
    if not peers:
        return "-", 0.0
    name = max(peers, key=peers.__getitem__)
    return name, peers[name]


def _ratio(a: float | None, b: float | None, places: int = 3) -> str:
    return f"{a / b:.{places}f}x" if a and b else "-"


def table(data: dict[str, Any]) -> list[str]:
    copy = data["copy_tbps"]
    lines = ["| M | N | flyreg TB/s | flyreg us | % of copy | without PDL | default | tuned / default | torch "
             "| compile | liger | flyreg / best peer | config |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    digits = lambda v: f"{v:.3f}" if v < 1 else f"{v:.2f}"  # noqa: E731
    cell = lambda r, k: digits(r[k]) if r.get(k) else "-"  # noqa: E731
    for r in data["rows"]:
        _, best = _best_peer(r)
        fly = r.get("flyreg")
        cells = [r["M"], r["N"], cell(r, "flyreg"), f"{r['flyreg_us']:.1f}" if fly else "-",
                 f"{100 * fly / copy:.1f} %" if fly else "-", cell(r, "no_pdl"), cell(r, "default"),
                 _ratio(fly, r.get("default"), 2), *(cell(r, p) for p in PEERS),
                 _ratio(fly, best), r["config"].removeprefix("Config(").removesuffix(")")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def bars(data: dict[str, Any]) -> list[str]:
    copy = data["copy_tbps"]
    rows = [r for r in data["rows"] if r.get("flyreg") and r.get("default")]  # flyreg or its default failed: no bar
    pct = lambda r: 100 * r["flyreg"] / copy  # noqa: E731
    out = []
    for M, N, bar in ((32768, 1024, 95), (4096, 4096, 85)):
        sel = [pct(r) for r in rows if r["M"] == M and r["N"] >= N]
        span = f" ({min(sel):.1f} to {max(sel):.1f} %)" if sel else ""
        out.append(f"- M = {M}, N >= {N} at >= {bar} % of copy: {sum(p >= bar for p in sel)} of {len(sel)}{span}")
    losses = []
    for r in rows:
        name, best = _best_peer(r)
        if r["flyreg"] < best:
            losses.append(f"{r['M']} x {r['N']}: {r['flyreg'] / best:.4f}x {name} "
                          f"({r['flyreg_us']:.2f} against {r[name + '_us']:.2f} us)")
    out.append(f"- at least as fast as every peer: {len(rows) - len(losses)} of {len(rows)}"
               + (f"; slower on {'; '.join(losses)}" if losses else ""))
    off = [r for r in rows if r["default"] < r["flyreg"] / 1.05 or r["default"] < _best_peer(r)[1] / 1.05]
    beaten = [r for r in off if r["flyreg"] > r["default"]]
    out.append(f"- the default more than 5 % off (behind the tuned config or the best peer): {len(off)} shapes; "
               f"tuned faster on {len(beaten)}")
    worse = [f"{r['M']} x {r['N']} ({r['flyreg'] / r['default']:.3f}x)" for r in rows
             if r["flyreg"] < r["default"] * 0.99]
    out.append("- tuned more than 1 % behind the default: " + (", ".join(worse) if worse else "none"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json_file")
    data = json.load(open(ap.parse_args().json_file, encoding="utf-8"))
    print(f"Copy (2 GiB, same run): {data['copy_tbps']:.2f} TB/s; {data['device']}, torch {data['torch']}, "
          f"{data['dtype']}\n")
    print("\n".join(table(data)))
    print()
    print("\n".join(bars(data)))


if __name__ == "__main__":
    main()
