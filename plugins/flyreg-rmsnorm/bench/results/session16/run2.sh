#!/bin/bash
# Session 16, second device call: the float64 sum of squares (sum_f64.patch, as triton_kernels_f64.py) A/B against the kernels of
# HEAD on the served configs, both ops, bf16 and float32. Run from the repository root with OUT set, after
# plugins/flyreg-moe/benchmarks/results/h200/session16/install.sh.
set -u
R=benchmarks/results/session16
git show HEAD:plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py > plugins/flyreg-rmsnorm/$R/triton_kernels_f64.py
patch -s plugins/flyreg-rmsnorm/$R/triton_kernels_f64.py plugins/flyreg-rmsnorm/$R/sum_f64.patch
(cd plugins/flyreg-rmsnorm && time timeout 530 python3 benchmarks/kernel_ab.py --before flyreg_rmsnorm/triton_kernels.py \
  --after $R/triton_kernels_f64.py --dtype bfloat16 float32 --M 1 256 4096 32768 --N 128 512 2048 5120 8192 16384 \
  --rounds 3 --json $OUT/ab.json) > $OUT/ab.txt 2>&1
tail -3 $OUT/ab.txt
