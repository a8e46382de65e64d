"""Two ``rmsnorm_bandwidth.py`` grids of one device run, before and after a change, cell by cell.

    python plugins/flyreg-rmsnorm/bench/bandwidth_compare.py before.json after.json [--band 0.01] [--json out.json]

Each cell's flyreg ratio is after / before of its time per call. Torch eager, torch.compile and
Liger run the same code in both grids, so their ratios in a cell show how far that cell moved by
itself between the two passes. The noise rule: a flyreg cell is slower only if its ratio is
below every peer's ratio in that cell by more than ``--band`` (1 %). A cell with no peer
(a peer that failed) falls back to the band alone around 1.0.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

PEERS = ("torch", "compile", "liger")


def _cells(path: str) -> dict[tuple[int, int], dict[str, Any]]:
    with open(path) as f:
        data = json.load(f)
    return {(row["M"], row["N"]): row for row in data["rows"]}


def _speed(before: dict[str, Any], after: dict[str, Any], name: str) -> float | None:
    # before time / after time: above 1 means after is faster.
    b, a = before.get(f"{name}_us"), after.get(f"{name}_us")
    return b / a if b and a else None


def compare(before_path: str, after_path: str, band: float) -> list[dict[str, Any]]:
    """One record per cell present in both grids: flyreg's speed ratio, the peers', and the verdict."""
    before, after = _cells(before_path), _cells(after_path)
    out = []
    for cell in sorted(before.keys() & after.keys()):
        b, a = before[cell], after[cell]
        flyreg = _speed(b, a, "flyreg")
        peers = {p: r for p in PEERS if (r := _speed(b, a, p)) is not None}
        floor = min(peers.values(), default=1.0) - band
        out.append({"M": cell[0], "N": cell[1], "flyreg": flyreg, "peers": peers,
                    "before_config": b.get("config"), "after_config": a.get("config"),
                    "slower": flyreg is not None and flyreg < floor})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--band", type=float, default=0.01, help="margin below the slowest peer's ratio (0.01)")
    ap.add_argument("--json", default=None, help="also write the records here")
    args = ap.parse_args()
    rows = compare(args.before, args.after, args.band)
    print(f"{'M':>6} {'N':>6}  flyreg  peers (torch, compile, liger)  verdict")
    for r in rows:
        peers = ", ".join(f"{v:.3f}" for v in r["peers"].values())
        flyreg = f"{r['flyreg']:.3f}" if r["flyreg"] is not None else "  -  "
        print(f"{r['M']:>6} {r['N']:>6}  {flyreg}  {peers:<30} {'SLOWER' if r['slower'] else 'ok'}")
    ratios = [r["flyreg"] for r in rows if r["flyreg"] is not None]
    if ratios:
        print(f"flyreg after/before speed: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, "
              f"max {max(ratios):.3f}; cells slower beyond the noise rule: {sum(r['slower'] for r in rows)} "
              f"of {len(rows)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
