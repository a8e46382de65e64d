#!/bin/bash
# Session 17, second device call: the per-tile rescue (RESCUE_AFTER capped, RESCUE_IN_SUM where rows spread over
# warps; the working tree's kernels) A/B against the kernels of 688f7b6 (session 7's), both ops, bf16 and float32,
# then the gpu tests of the RMSNorm kernels and the bound launcher, the strict xfails run as plain tests. Run from
# the repository root with OUT set, after plugins/flyreg-moe/benchmarks/results/h200/session16/install.sh.
set -u
git show 688f7b6:plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py > /tmp/before_kernels.py
cd plugins/flyreg-rmsnorm
(time timeout 300 python3 benchmarks/kernel_ab.py --before /tmp/before_kernels.py --dtype bfloat16 float32 \
  --M 1 32 256 4096 --N 128 512 1024 2048 3072 4096 5120 8192 16384 --rounds 2 --json $OUT/ab_hybrid.json) \
  > $OUT/ab_hybrid.txt 2>&1
(time timeout 80 python3 benchmarks/kernel_ab.py --before /tmp/before_kernels.py --dtype bfloat16 float32 \
  --M 32768 --N 512 4096 16384 --rounds 2 --json $OUT/ab_hybrid_32768.json) > $OUT/ab_hybrid_32768.txt 2>&1
cd ../..
tail -4 $OUT/ab_hybrid.txt; tail -4 $OUT/ab_hybrid_32768.txt
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_rmsnorm_kernels.py tests/kernels/test_launcher_gpu.py \
  --runxfail -p no:cacheprovider > $OUT/kernels_gpu.txt 2>&1
tail -3 $OUT/kernels_gpu.txt
