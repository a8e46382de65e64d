"""Off-device screen of where an overflow rescue moves the common path's instructions: for every served RMSNorm
kernel (sm_90a, the ptxas of the installed Triton; Triton 3.6 gives the H200's binaries), the kernel before the
rescue against the rescue kernel under three register caps (none, ``maxnreg`` at the rescue-free kernel's count
or 32 as session 15 timed it, and the most registers that keep the rescue-free kernel's blocks a SM).

The common path is the SASS up to the first ``EXIT`` after a store. Two of its features are leads, not a verdict
(they mark 7 of session 15's 15 slow cells, and 25 cells within 3 %): ``early`` (global loads issued before the
reduction's first shuffle: fewer than before means a load waits for the sum), and ``sync`` (barriers and shuffles
between the last store and that exit: the tile-wide test of whether any row overflowed, which every warp then
waits for).

Run from ``plugins/flyreg-rmsnorm/benchmarks`` without TRITON_INTERPRET, with Triton 3.6 importable:

    git show HEAD:plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py > before.py && cp before.py after.py
    patch -s after.py results/session15/rescue_pinned.patch
    python results/session16/screen_schedule.py before.py after.py bfloat16 float32 --json out.json
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the benchmarks folder
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session14"))

import triton  # noqa: E402
from flyreg_rmsnorm.triton_kernels import _blocks_per_sm as blocks_per_sm  # noqa: E402
from flyreg_rmsnorm.triton_kernels import _occupancy_cap as occupancy_cap  # noqa: E402
from screen_maxnreg import assemble, ptx_of, screen_served  # noqa: E402


#: session 15's floor of the pin (``_FREE_REGS`` in rescue_pinned.patch).
PIN_FLOOR = 32
#: One SASS instruction, without its predicate (``@!P0``).
INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P[0-9T]\s+)?(.*?)\s*;", re.M)


def common_path(sass: str) -> list[str]:
    """The instructions up to the first ``EXIT`` (predicated or not) after a global store."""
    out: list[str] = []
    stored = False
    for ins in INSTRUCTION.findall(sass):
        out.append(ins)
        stored = stored or ins.startswith("STG")
        if stored and ins.split()[-1] == "EXIT":
            break
    return out


def features(ptx: str) -> dict[str, int]:
    err, sass = assemble(ptx)
    path = common_path(sass)
    first_reduce = next((i for i, ins in enumerate(path) if ins.startswith(("SHFL", "MUFU"))), len(path))
    last_store = max(i for i, ins in enumerate(path) if ins.startswith("STG"))
    regs = re.search(r"Used (\d+) registers", err)
    return {"regs": int(regs.group(1)) if regs else 0,
            "early": sum(ins.startswith("LDG") for ins in path[:first_reduce]),
            "sync": sum(ins.startswith(("BAR", "SHFL")) for ins in path[last_store:])}


def screen(before: Any, after: Any, cfg: tuple[Any, ...]) -> dict[str, Any]:
    base = features(ptx_of(before, cfg))
    warps = cfg[6]
    caps = {"unpinned": None, "pinned": max(base["regs"], PIN_FLOOR), "occupancy": occupancy_cap(base["regs"], warps)}
    row: dict[str, Any] = {"config": list(cfg), "before": base, "caps": caps}
    for name, cap in caps.items():
        row[name] = features(ptx_of(after, cfg, maxnreg=cap))
    return row


def main() -> None:
    rows = screen_served(__doc__.splitlines()[0], screen)
    print(f"{len(rows)} kernels (Triton {triton.__version__})")
    for name in ("unpinned", "pinned", "occupancy"):
        late = [r for r in rows if r[name]["early"] < r["before"]["early"]]
        synced = [r for r in rows if r[name]["sync"] > r["before"]["sync"]]
        either = [r for r in rows if r in late or r in synced]
        print(f"{name:9s}: a load moved after the reduction in {len(late)}, a tile-wide test after the stores in "
              f"{len(synced)}, neither in {len(rows) - len(either)}; fewer registers in "
              f"{sum(r[name]['regs'] < r['before']['regs'] for r in rows)}")


if __name__ == "__main__":
    main()
