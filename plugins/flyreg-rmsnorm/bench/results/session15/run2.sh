#!/bin/bash
# Session 15, second device call: the pinned overflow rescue (session 14's rescue_pinned.patch, applied in
# triton_kernels_rescue.py) A/B against the kernels of HEAD on the served configs, bf16 and float32.
# Run from the repository root with OUT set, after install.sh.
# The overflow tests after it did not run: the call's limit came first (its overflow_gpu.txt was empty).
# The trial file is rescue_pinned.patch (session 14's, with its RESCUE keyword passed once) applied to a copy:
set -u
R=benchmarks/results/session15
git show HEAD:plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py > plugins/flyreg-rmsnorm/$R/triton_kernels_rescue.py
patch -s plugins/flyreg-rmsnorm/$R/triton_kernels_rescue.py plugins/flyreg-rmsnorm/$R/rescue_pinned.patch
(cd plugins/flyreg-rmsnorm && time timeout 350 python3 benchmarks/kernel_ab.py --before flyreg_rmsnorm/triton_kernels.py \
  --after $R/triton_kernels_rescue.py --dtype bfloat16 float32 --rounds 3 --json $OUT/ab.json) > $OUT/ab.txt 2>&1
tail -4 $OUT/ab.txt
# Then the overflow tests on the rescue, every config of the space (--runxfail: the strict xfails of HEAD's
# test file then have to pass).
cp plugins/flyreg-rmsnorm/$R/triton_kernels_rescue.py plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py
timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_rmsnorm_kernels.py -k overflow --runxfail -p no:cacheprovider > $OUT/overflow_gpu.txt 2>&1
tail -3 $OUT/overflow_gpu.txt
