#!/bin/bash
# Session 18: the one served kernel whose rescue mode changed after session 17's timing (fused-add bf16 4096 x 128,
# 4 rows on 1 warp: RESCUE_AFTER as landed), with its neighbours, against session 7's kernels. Run from the
# repository root with OUT set, after plugins/flyreg-moe/benchmarks/results/h200/session16/install.sh.
set -u
git show 688f7b6:plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py > /tmp/before_kernels.py
cd plugins/flyreg-rmsnorm
timeout 200 python3 benchmarks/kernel_ab.py --before /tmp/before_kernels.py --ops fused_add_rmsnorm rmsnorm \
  --dtype bfloat16 --M 4096 --N 128 512 --rounds 3 --json $OUT/ab_4096x128.json > $OUT/ab_4096x128.txt 2>&1
cat $OUT/ab_4096x128.txt
