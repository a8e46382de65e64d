#!/bin/bash
# Session 16, third device call: the fused-MoE gpu tests (run1.sh's suite reached 11 of them before its limit),
# the isolation test and the serving tests, on the final tree (HEAD's RMSNorm kernels). Run from the repository
# root with OUT set, after install.sh.
set -u
(time timeout 480 python3 -m pytest -q -m gpu plugins/flyreg-moe/tests tests/cli/test_cli_isolate_gpu.py tests/serving \
  -p no:cacheprovider -rfE) > $OUT/gpu_moe.txt 2>&1
tail -6 $OUT/gpu_moe.txt
