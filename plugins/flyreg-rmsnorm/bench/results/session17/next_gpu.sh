#!/bin/bash
# For the next session: the gpu tests under tests/ on the tree with session 17's rescue, in two calls that each fit
# the 10-minute limit. `bash next_gpu.sh 1` runs the overflow tests on every config of their spaces (they bind every
# config of three spaces a dtype), `bash next_gpu.sh 2` everything else under tests/. Run from the repository root with
# OUT set, after plugins/flyreg-moe/benchmarks/results/h200/session16/install.sh.
set -u
case "${1:?part 1 or 2}" in
  1) sel=(-k overflowing_rows_every_config) ;;
  2) sel=(-k "not overflowing_rows_every_config") ;;
  *) echo "part must be 1 or 2" >&2; exit 2 ;;
esac
(time timeout 540 python3 -m pytest -q -m gpu tests "${sel[@]}" -p no:cacheprovider --durations=10) > $OUT/tests_gpu_$1.txt 2>&1
sed -i "s#$(dirname "$(dirname "$(python3 -c 'import sys; print(sys.executable)')")")#<venv>#g" $OUT/tests_gpu_$1.txt
tail -15 $OUT/tests_gpu_$1.txt
