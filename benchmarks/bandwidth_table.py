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
    peers = {p: row[p] for p in PEERS if row.get(p)}
    name = max(peers, key=peers.__getitem__)
    return name, peers[name]


def table(data: dict[str, Any]) -> list[str]:
    copy = data["copy_tbps"]
    lines = ["| M | N | flyreg TB/s | flyreg us | % of copy | without PDL | default | tuned / default | torch "
             "| compile | liger | flyreg / best peer | config |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    digits = lambda v: f"{v:.3f}" if v < 1 else f"{v:.2f}"  # noqa: E731
    for r in data["rows"]:
        _, best = _best_peer(r)
        cells = [r["M"], r["N"], digits(r["flyreg"]), f"{r['flyreg_us']:.1f}", f"{100 * r['flyreg'] / copy:.1f} %",
                 digits(r["no_pdl"]), digits(r["default"]), f"{r['flyreg'] / r['default']:.2f}x",
                 *(digits(r[p]) if r.get(p) else "-" for p in PEERS), f"{r['flyreg'] / best:.3f}x",
                 r["config"].removeprefix("Config(").removesuffix(")")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def bars(data: dict[str, Any]) -> list[str]:
    copy, rows = data["copy_tbps"], data["rows"]
    pct = lambda r: 100 * r["flyreg"] / copy  # noqa: E731
    big = [r for r in rows if r["M"] == 32768 and r["N"] >= 1024]
    mid = [r for r in rows if r["M"] == 4096 and r["N"] >= 4096]
    out = [f"- M = 32768, N >= 1024 at >= 95 % of copy: {sum(pct(r) >= 95 for r in big)} of {len(big)} "
           f"({min(map(pct, big)):.1f} to {max(map(pct, big)):.1f} %)",
           f"- M = 4096, N >= 4096 at >= 85 % of copy: {sum(pct(r) >= 85 for r in mid)} of {len(mid)} "
           f"({min(map(pct, mid)):.1f} to {max(map(pct, mid)):.1f} %)"]
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
