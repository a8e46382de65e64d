#!/bin/bash
# Session 17, third device call: every gpu test under tests/ on the final tree (the overflowing rows are plain tests
# now). Run from the repository root with OUT set, after plugins/flyreg-moe/benchmarks/results/h200/session16/install.sh.
set -u
(time timeout 560 python3 -m pytest -q -m gpu tests -p no:cacheprovider) > $OUT/tests_gpu.txt 2>&1
sed -i "s#$(dirname "$(dirname "$(python3 -c 'import sys; print(sys.executable)')")")#<venv>#g" $OUT/tests_gpu.txt
tail -8 $OUT/tests_gpu.txt
