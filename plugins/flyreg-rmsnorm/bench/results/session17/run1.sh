#!/bin/bash
# Session 17, first device call: the branch-free rescue (the scaled sum of squares reduced with the plain one, the
# working tree's kernels then: the landed kernels with rescue_mode giving RESCUE_IN_SUM to every bf16 and float32
# tile; that file was not kept) A/B against the kernels of 688f7b6 (session 7's) on latency- and bandwidth-bound cells, then the overflow gpu
# tests with the strict xfails run as plain tests. Run from the repository root with OUT set, after
# plugins/flyreg-moe/benchmarks/results/h200/session16/install.sh.
set -u
git show 688f7b6:plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py > /tmp/before_kernels.py
(cd plugins/flyreg-rmsnorm && time timeout 390 python3 benchmarks/kernel_ab.py --before /tmp/before_kernels.py \
  --dtype bfloat16 float32 --M 1 32 256 4096 --N 128 512 3072 16384 --rounds 3 --json $OUT/ab_dualsum.json) \
  > $OUT/ab_dualsum.txt 2>&1
tail -2 $OUT/ab_dualsum.txt
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_rmsnorm_kernels.py -k overflow --runxfail -p no:cacheprovider \
  > $OUT/overflow_gpu.txt 2>&1
tail -3 $OUT/overflow_gpu.txt
