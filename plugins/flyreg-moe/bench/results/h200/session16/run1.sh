#!/bin/bash
# Session 16, first device call: the whole gpu suite on the final tree, with the RMSNorm kernels that sum squares
# in float64 (plugins/flyreg-rmsnorm/benchmarks/results/session16/sum_f64.patch) in the package and the
# overflow tests' strict xfails run as plain tests (--runxfail). Run from the repository root with OUT set.
set -u
git apply plugins/flyreg-rmsnorm/benchmarks/results/session16/sum_f64.patch
(time timeout 520 python3 -m pytest -q -m gpu tests plugins/flyreg-moe/tests -p no:cacheprovider --runxfail -rfE) > $OUT/gpu_tests.txt 2>&1
tail -8 $OUT/gpu_tests.txt
