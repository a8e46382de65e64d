"""Off-device screen: whether a kernels variant's common path (the path that takes no rescue) issues the same
instructions in the same order as session 7's kernels, for the one-row ``RESCUE_AFTER`` tiles that read 2 to 4 %
slower on the H200 (sm_90a, the installed Triton's ptxas; Triton 3.6 gives the H200's binaries). Each variant is
capped as its bind caps it (``triton_kernels._capped``).

Run from ``plugins/flyreg-rmsnorm/benchmarks`` without TRITON_INTERPRET:

    git show 688f7b6:plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py > before.py
    python results/session18/screen_order.py before.py VARIANT.py

Prints, per kernel: the rescue-free registers and the cap, then for the landed kernels and the variant their
registers, common-path length, and ``same-ops`` or ``diff`` against session 7's opcode sequence.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1] / "session14"),
                str(Path(__file__).resolve().parents[1] / "session16")]

from flyreg_rmsnorm import triton_kernels as landed  # noqa: E402
from kernel_ab import load_kernels  # noqa: E402
from screen_maxnreg import assemble, ptx_of  # noqa: E402
from screen_schedule import common_path  # noqa: E402

CONFIGS = [  # (op, dtype, M, N, BLOCK_N, ROWS, num_warps, num_stages) as served
    ("rmsnorm", "bfloat16", 256, 3072, 4096, 1, 8, None),
    ("rmsnorm", "bfloat16", 256, 16384, 16384, 1, 16, None),
    ("rmsnorm", "bfloat16", 32, 8192, 8192, 1, 16, None),
    ("fused_add_rmsnorm", "float32", 1, 3072, 4096, 1, 8, None),
    ("fused_add_rmsnorm", "float32", 1, 2048, 2048, 1, 8, None),
    ("fused_add_rmsnorm", "float32", 256, 5120, 8192, 1, 8, None),
    ("fused_add_rmsnorm", "bfloat16", 1, 5120, 8192, 1, 8, None),
]


def opcodes(path: list[str]) -> list[str]:
    return [re.sub(r"/\*[0-9a-f]*\*/", "", line).split()[0] for line in path if line.strip()]


def registers(report: str) -> int:
    return int(re.search(r"Used (\d+) registers", report).group(1))


def main() -> None:
    before = load_kernels(sys.argv[1])
    variant = load_kernels(sys.argv[2], "variant")
    for cfg in CONFIGS:
        report, sass = assemble(ptx_of(before, cfg))
        base = opcodes(common_path(sass))
        cap = landed._occupancy_cap(registers(report), cfg[6])
        row: list[object] = [*cfg[:4], "regs", registers(report), "cap", cap]
        for name, module in (("landed", landed), ("variant", variant)):
            report, sass = assemble(ptx_of(module, cfg, maxnreg=cap))
            path = opcodes(common_path(sass))
            row += [name, registers(report), len(path), "same-ops" if path == base else "diff"]
        print(*row)


if __name__ == "__main__":
    main()
