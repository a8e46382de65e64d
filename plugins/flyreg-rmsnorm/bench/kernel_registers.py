"""Registers, spills and occupancy of every config the shipped artifacts serve, for two versions of
the kernels, compiled and loaded on this machine's GPU.

    python plugins/flyreg-rmsnorm/bench/kernel_registers.py --before OLD/triton_kernels.py [--after NEW/triton_kernels.py] [--dtype ...]
        [--workers 8] [--json out.json]

Each distinct kernel of ``flyreg_rmsnorm/configs`` (op, dtype, constexprs and hints: 271 for the
450 artifacts, M mattering only through the row mask and the index width) is compiled the way a
launch on dense rows compiles it (``kernel_ptx.py``), by ``--before`` and by ``--after`` (default:
the installed kernels module); a ``RESCUE_AFTER`` kernel without the ``maxnreg`` cap its bind adds
(``triton_kernels._capped``). Occupancy is warps resident a multiprocessor by registers alone (64K
registers, allocated 256 a warp, at most 64 warps and 32 blocks), the limit a change of registers
can move.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import flyreg_rmsnorm
from flyreg_rmsnorm import triton_kernels as installed_module

from flyreg_rmsnorm_bench.kernel_ab import load_kernels
from flyreg_rmsnorm_bench.kernel_ptx import TYPES, compile_config


def served_configs(dtypes: list[str]) -> list[tuple[Any, ...]]:
    """(op, dtype, M, N, BLOCK_N, ROWS, num_warps, num_stages), one for each distinct kernel the shipped
    Triton artifacts compile: M only matters through the constexprs it sets (the row mask, the index width)."""
    out: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for path in sorted((Path(flyreg_rmsnorm.__file__).parent / "configs").glob("*.json")):
        a = json.loads(path.read_text())
        spec, config = a["spec"], a["config"]
        if spec.get("backend") == "triton" and spec["dtype"] in dtypes:
            cfg = (a["op"], spec["dtype"], spec["M"], spec["N"], config["kwargs"]["BLOCK_N"],
                   config["kwargs"]["ROWS"], config["hints"].get("num_warps", 4), config["hints"].get("num_stages"))
            op, dtype, M, N, block_n, rows, warps, stages = cfg
            strides = (N, N) if op == "fused_add_rmsnorm" else (N,)
            rescue = installed_module.rescue_mode(getattr(torch, dtype), block_n, rows, warps)
            consts = installed_module._constexprs(M, N, block_n, rows, True, *strides, rescue=rescue)
            out.setdefault((op, dtype, warps, stages, tuple(sorted(consts.items()))), cfg)
    return sorted(out.values(), key=repr)


def compiled(module: ModuleType, cfg: tuple[Any, ...], arch: int) -> Any:
    """``module``'s kernel for ``cfg``, compiled for compute capability ``arch``."""
    op, dtype, M, N, block_n, rows, warps, stages = cfg
    return compile_config(module, op, dtype, M, N, block_n, rows, warps, stages, arch)[0]


def counts(kernel: Any) -> tuple[int, int]:
    """(registers, spill bytes) of a compiled kernel, read once it is loaded on the current GPU."""
    kernel._init_handles()
    return kernel.n_regs, kernel.n_spills


def occupancy(regs: int, warps: int) -> int:
    """Warps a multiprocessor holds by registers alone."""
    return installed_module._blocks_per_sm(regs, warps) * warps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="an older flyreg_rmsnorm/triton_kernels.py")
    ap.add_argument("--after", default=None, help="a variant of it (default: the installed module)")
    ap.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=sorted(TYPES))
    ap.add_argument("--workers", type=int, default=8, help="compiles in parallel")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the registers are read from the loaded binary)")
    major, minor = torch.cuda.get_device_capability()
    before = load_kernels(args.before)
    after = load_kernels(args.after, "after") if args.after else installed_module
    cfgs = served_configs(args.dtype)
    arch = major * 10 + minor
    with ThreadPoolExecutor(args.workers) as pool:  # compiles in parallel; binaries loaded one at a time
        b = [counts(k) for k in list(pool.map(lambda c: compiled(before, c, arch), cfgs))]
        a = [counts(k) for k in list(pool.map(lambda c: compiled(after, c, arch), cfgs))]
    rows = [{"config": list(c), "before": rb, "after": ra, "occupancy": [occupancy(rb[0], c[6]), occupancy(ra[0], c[6])]}
            for c, rb, ra in zip(cfgs, b, a)]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    delta = Counter(r["after"][0] - r["before"][0] for r in rows)
    lost = [r for r in rows if r["occupancy"][1] < r["occupancy"][0]]
    spilled = [r for r in rows if r["after"][1] > r["before"][1]]
    print(f"{len(rows)} configs: registers after - before: {dict(sorted(delta.items()))}")
    print(f"{len(lost)} lose occupancy, {len(spilled)} spill more")
    for r in lost + spilled:
        print("  ", r)


if __name__ == "__main__":
    main()
