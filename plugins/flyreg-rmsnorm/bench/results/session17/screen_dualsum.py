"""Off-device screen of an overflow rescue as it is served: for every served RMSNorm kernel (sm_90a, the ptxas of the installed Triton; Triton 3.6 gives the H200's binaries),
registers, blocks a SM, spill bytes, the common path's instructions and shuffles, and ``early`` and ``sync`` as
in ``session16/screen_schedule.py``, before and after.

Run from ``plugins/flyreg-rmsnorm/benchmarks`` without TRITON_INTERPRET, with Triton 3.6 importable:

    git show 688f7b6:plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py > before.py
    python results/session17/screen_dualsum.py before.py ../flyreg_rmsnorm/triton_kernels.py bfloat16 float32 \\
        --json out.json

``screen_landed.json`` is this screen of the landed kernels; ``screen_sum_everywhere.json`` of the first trial
(``run1.sh``: the scaled sum for every tile, uncapped).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the benchmarks folder
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session14"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session16"))

import torch  # noqa: E402
import triton  # noqa: E402
from screen_maxnreg import assemble, ptx_of, screen_served  # noqa: E402
from screen_schedule import blocks_per_sm, common_path, features  # noqa: E402


def kernel(module: Any, cfg: tuple[Any, ...], maxnreg: int | None = None) -> dict[str, Any]:
    ptx = ptx_of(module, cfg, maxnreg=maxnreg)
    err, sass = assemble(ptx)
    path = common_path(sass)
    spill = re.search(r"(\d+) bytes spill stores", err)
    row = features(ptx)
    row.update(blocks=blocks_per_sm(row["regs"], cfg[6]), spill=int(spill.group(1)) if spill else 0,
               instructions=len(path), shuffles=sum(ins.startswith("SHFL") for ins in path))
    return row


def screen(before: Any, after: Any, cfg: tuple[Any, ...]) -> dict[str, Any]:
    base = kernel(before, cfg)
    op, dtype, M, N, block_n, rows, warps, stages = cfg
    mode = after.rescue_mode(getattr(torch, dtype), block_n, rows, warps) if hasattr(after, "rescue_mode") else None
    # A RESCUE_AFTER kernel is bound with maxnreg capped (triton_kernels._capped): the screen caps it the same way.
    cap = after._occupancy_cap(base["regs"], warps) if mode == 1 else None  # RESCUE_AFTER
    return {"config": list(cfg), "mode": mode, "before": base, "after": kernel(after, cfg, cap)}


def main() -> None:
    rows = screen_served(__doc__.splitlines()[0], screen)
    print(f"{len(rows)} kernels (Triton {triton.__version__})")
    for key in ("regs", "blocks", "spill", "instructions", "shuffles", "early", "sync"):
        d = [r["after"][key] - r["before"][key] for r in rows]
        print(f"{key:12s}: more in {sum(x > 0 for x in d):3d}, fewer in {sum(x < 0 for x in d):3d}, "
              f"change {min(d)} to {max(d)}")


if __name__ == "__main__":
    main()
