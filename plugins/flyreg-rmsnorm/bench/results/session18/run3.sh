#!/bin/bash
# Session 18: is the latency-bound residual of the one-row RESCUE_AFTER tiles the rescue's? The same cells timed
# (a) session 7's kernels against a second copy of themselves, loaded as their own module (--after the same file),
# and (b) session 7's against the landed kernels, in one run on an empty scratch cache. Run from the repository
# root with OUT set, after plugins/flyreg-moe/benchmarks/results/h200/session16/install.sh.
set -u
export FLYREG_CACHE_DIR=$(mktemp -d)
git show 688f7b6:plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py > /tmp/before_kernels.py
cp /tmp/before_kernels.py /tmp/before_copy.py
cd plugins/flyreg-rmsnorm
ab() {  # name after op dtype Ms Ns
  timeout 70 python3 benchmarks/kernel_ab.py --before /tmp/before_kernels.py $2 --ops "$3" --dtype "$4" --M $5 \
    --N $6 --rounds 3 --json $OUT/$1_$3_$4.json >> $OUT/$1.txt 2>&1
}
for name in copy landed; do
  after=""; [ $name = copy ] && after="--after /tmp/before_copy.py"
  ab $name "$after" rmsnorm bfloat16 "32 256" "3072 8192 16384"
  ab $name "$after" fused_add_rmsnorm float32 "1 256" "2048 3072 5120"
done
grep -E "cells" $OUT/copy.txt $OUT/landed.txt
rm -rf "$FLYREG_CACHE_DIR"
