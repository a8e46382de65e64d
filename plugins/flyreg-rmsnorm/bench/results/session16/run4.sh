#!/bin/bash
# Session 16, last device call: does the register cap explain session 15's slow cells? Session 15's rescue
# (rescue_pinned.patch) with no cap ("unpinned") and with the most registers that keep the rescue-free kernel's
# blocks a SM ("occupancy"), each A/B against HEAD's kernels on the latency-bound cells where the pinned rescue
# read 3 to 23 % slower. Run from the repository root with OUT set, after install.sh.
set -u
R=benchmarks/results/session16
K=plugins/flyreg-rmsnorm/$R
git show HEAD:plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py > $K/unpinned.py
patch -s $K/unpinned.py plugins/flyreg-rmsnorm/benchmarks/results/session15/rescue_pinned.patch
python3 - "$K" <<'PY'
import sys
d = sys.argv[1]
src = open(f"{d}/unpinned.py").read()
pin = '    return {**options, "maxnreg": max(base.n_regs, _FREE_REGS)}\n'
assert src.count(pin) == 1
cap = ('def _occupancy_cap(regs: int, warps: int) -> int:\n'
       '    def blocks(r: int) -> int:\n'
       '        return min(65536 // (-(-r // 8) * 8 * 32 * warps), 64 // warps, 32)\n'
       '    return max(r for r in range(regs, 256) if blocks(r) == blocks(regs))\n\n\n')
occ = src.replace(pin, '    return {**options, "maxnreg": _occupancy_cap(base.n_regs, options.get("num_warps", 4))}\n')
occ = occ.replace("def _pinned(", cap + "def _pinned(", 1)
open(f"{d}/occupancy.py", "w").write(occ)
open(f"{d}/unpinned.py", "w").write(src.replace(pin, "    return options\n"))
PY
for v in unpinned occupancy; do
  (cd plugins/flyreg-rmsnorm && timeout 95 python3 benchmarks/kernel_ab.py --before flyreg_rmsnorm/triton_kernels.py \
    --after $R/$v.py --ops rmsnorm --dtype float32 bfloat16 --M 1 32 256 --N 128 512 3072 --rounds 3 \
    --json $OUT/ab_$v.json) > $OUT/ab_$v.txt 2>&1
  tail -1 $OUT/ab_$v.txt
done
