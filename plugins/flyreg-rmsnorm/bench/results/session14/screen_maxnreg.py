"""Off-device screen of an overflow rescue: registers, spill bytes and SASS instructions of every served
RMSNorm kernel (sm_90a, the ptxas of the installed Triton), for the kernels before the rescue, with it, and
with it under ``maxnreg`` pinned to the rescue-free kernel's registers (ptxas's floor of 24 aside).

Run from ``plugins/flyreg-rmsnorm/benchmarks`` without TRITON_INTERPRET, with Triton 3.6 importable:

    git show HEAD:plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py > before.py && cp before.py after.py
    sed 's#plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py#after.py#g' results/session11/rescue_trial.patch \
        | patch -p1 after.py
    python results/session14/screen_maxnreg.py before.py after.py bfloat16 float32 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the benchmarks folder

import triton  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402

from kernel_ab import load_kernels  # noqa: E402
from kernel_ptx import TYPES, compile_config  # noqa: E402
from kernel_registers import served_configs  # noqa: E402

#: ptxas allocates at least this many registers a thread whatever maxnreg asks.
PTXAS_FLOOR = 24


def ptx_of(module: Any, cfg: tuple[Any, ...], maxnreg: int | None = None) -> str:
    """PTX of ``module``'s kernel for a served config ``(op, dtype, M, N, BLOCK_N, ROWS, warps, stages)``."""
    return compile_config(module, *cfg, arch=90, maxnreg=maxnreg)[0].asm["ptx"]


def assemble(ptx: str) -> tuple[str, str]:
    """(ptxas -v's report, cuobjdump's SASS) of ``ptx`` assembled for sm_90a by the installed Triton's ptxas."""
    ptxas = get_ptxas(90).path
    cuobjdump = str(Path(ptxas).with_name("cuobjdump"))
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.o")
        Path(src).write_text(ptx, encoding="utf-8")
        err = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", obj], capture_output=True, text=True,
                             check=True).stderr
        sass = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, check=True).stdout
    return err, sass


def counts(ptx: str) -> tuple[int, int, int]:
    """(registers, spill-store bytes, SASS instructions) of ``ptx`` for sm_90a."""
    err, sass = assemble(ptx)
    regs = re.search(r"Used (\d+) registers", err)
    spill = re.search(r"(\d+) bytes spill stores", err)
    return (int(regs.group(1)) if regs else 0, int(spill.group(1)) if spill else 0,
            len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/", sass, re.M)))


def screen_served(description: str, one: Callable[[Any, Any, tuple[Any, ...]], dict[str, Any]]) -> list[dict[str, Any]]:
    """The command line both screens share (``before after dtypes... --json FILE``): ``one(before, after, cfg)``
    for every served kernel of those dtypes, the rows written to ``--json`` with the Triton version."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("dtypes", nargs="+", choices=sorted(TYPES))
    p.add_argument("--json", required=True)
    a = p.parse_args()
    before, after = load_kernels(a.before, "before"), load_kernels(a.after, "after")
    with ThreadPoolExecutor(2) as pool:
        rows = list(pool.map(lambda cfg: one(before, after, cfg), served_configs(a.dtypes)))
    with open(a.json, "w", encoding="utf-8") as f:
        json.dump({"triton": triton.__version__, "rows": rows}, f, indent=1)
    return rows


def one_kernel(before: Any, after: Any, cfg: tuple[Any, ...]) -> dict[str, Any]:
    base = counts(ptx_of(before, cfg))
    return {"config": list(cfg), "before": base, "rescue": counts(ptx_of(after, cfg)),
            "pinned": counts(ptx_of(after, cfg, maxnreg=max(base[0], PTXAS_FLOOR)))}


def main() -> None:
    rows = screen_served(__doc__.splitlines()[0], one_kernel)
    for key in ("rescue", "pinned"):
        more = sum(r[key][0] > max(r["before"][0], PTXAS_FLOOR) for r in rows)
        fewer = sum(r[key][0] < r["before"][0] for r in rows)
        print(f"{key}: {len(rows)} kernels, {more} with more registers, {fewer} with fewer, "
              f"{sum(r[key][1] > 0 for r in rows)} spilling")


if __name__ == "__main__":
    main()
