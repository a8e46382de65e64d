"""The docs' RMSNorm bandwidth table and its bar checks, from a ``rmsnorm_bandwidth.py --json`` file.

    python plugins/flyreg-rmsnorm/bench/bandwidth_table.py plugins/flyreg-rmsnorm/bench/results/rmsnorm_bandwidth_bf16.json

Prints a Markdown table (TB/s, device time, % of the run's copy, the served config without
programmatic dependent launch, the default, the peers, flyreg over the best peer) and, below it,
the RMSNorm issue's bars as this run measured them. Where the run re-timed a close peer in
back-to-back pairs (``rmsnorm_bandwidth.py --recheck``), the pairs' median decides that cell's
peer bar and is shown beside the one-pass ratio. Needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

PEERS = ("torch", "compile", "liger")


def best_peer(row: dict[str, Any]) -> tuple[str, float]:
    """The fastest peer of a row and its TB/s; ``("-", 0.0)`` when every peer failed."""
    peers = {p: row[p] for p in PEERS if row.get(p)}
    if not peers:
        return "-", 0.0
    name = max(peers, key=peers.__getitem__)
    return name, peers[name]


def _vs(row: dict[str, Any], peer: str, band: float) -> tuple[float, int]:
    """flyreg's speed over ``peer``'s and how many back-to-back pairs it is the median of: their
    median where the run re-timed the peer and the row's ratio is within ``band`` of parity (with
    ``--repeat``, a repeat may have re-timed a peer that the median of the repeats puts outside),
    else the row's ratio and 0."""
    ratio = row["flyreg"] / row[peer]
    pairs = row.get("recheck", {}).get(peer)
    if pairs and abs(ratio - 1) <= band:
        return statistics.median(pairs), len(pairs)
    return ratio, 0


def _decisive(row: dict[str, Any], band: float) -> tuple[float, int, str] | None:
    """The peer that flyreg is slowest against (by :func:`_vs`): ``(ratio, pairs, peer)``; None
    without a peer or flyreg."""
    peers = [(*_vs(row, p, band), p) for p in PEERS if row.get(p)] if row.get("flyreg") else []
    return min(peers) if peers else None


def _ratio(a: float | None, b: float | None, places: int = 3) -> str:
    return f"{a / b:.{places}f}x" if a and b else "-"


def table(data: dict[str, Any]) -> list[str]:
    copy = data["copy_tbps"]
    lines = ["| M | N | flyreg TB/s | flyreg us | % of copy | without PDL | default | tuned / default | torch "
             "| compile | liger | flyreg / best peer | config |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    digits = lambda v: f"{v:.3f}" if v < 1 else f"{v:.2f}"  # noqa: E731
    cell = lambda r, k: digits(r[k]) if r.get(k) else "-"  # noqa: E731
    band = data.get("recheck_band", 0.0)
    for r in data["rows"]:
        _, best = best_peer(r)
        fly = r.get("flyreg")
        vs = _ratio(fly, best)
        decisive = _decisive(r, band)
        if decisive and decisive[1]:
            vs += f" (pairs {decisive[0]:.3f}x {decisive[2]})"
        cells = [r["M"], r["N"], cell(r, "flyreg"), f"{r['flyreg_us']:.1f}" if fly else "-",
                 f"{100 * fly / copy:.1f} %" if fly else "-", cell(r, "no_pdl"), cell(r, "default"),
                 _ratio(fly, r.get("default"), 2), *(cell(r, p) for p in PEERS),
                 vs, r["config"].removeprefix("Config(").removesuffix(")")]
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
    band = data.get("recheck_band", 0.0)
    losses = []
    for r in rows:
        decisive = _decisive(r, band)
        if decisive and decisive[0] < 1:
            v, pairs, name = decisive
            how = (f"median of {pairs} back-to-back pairs" if pairs
                   else f"{r['flyreg_us']:.2f} against {r[name + '_us']:.2f} us")
            losses.append(f"{r['M']} x {r['N']}: {v:.4f}x {name} ({how})")
    paired = sum(1 for r in rows for p in PEERS if r.get(p) and _vs(r, p, band)[1])
    out.append(f"- at least as fast as every peer: {len(rows) - len(losses)} of {len(rows)}"
               + (f" ({paired} peer cells within the recheck band decided by back-to-back pairs)" if paired else "")
               + (f"; slower on {'; '.join(losses)}" if losses else ""))
    off = [r for r in rows if r["default"] < r["flyreg"] / 1.05 or r["default"] < best_peer(r)[1] / 1.05]
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
          f"{data['dtype']}, weight {data.get('weights', 'shared')}\n")
    print("\n".join(table(data)))
    print()
    print("\n".join(bars(data)))


if __name__ == "__main__":
    main()
