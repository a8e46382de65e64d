#!/bin/bash
# Session 15, first device call: re-tune the six specs whose session-14 artifacts read 3 to 6 % behind the
# new default (tuned before the space had 256-wide GEMM 2 tiles), then benchmark M = 4096 and 8192 on all
# four shapes. Run from the repository root with OUT set, after install.sh.
set -u
C=plugins/flyreg-moe/flyreg_moe/configs
B=plugins/flyreg-moe/benchmarks
export COLUMNS=250
W=(); for s in E=8,M=8192 E=32,M=8192 E=64,M=4096 E=64,M=8192 E=128,M=4096 E=128,M=8192; do W+=(--where "$s"); done
(time timeout 280 flyreg tune fused_moe --device cuda --force --budget 1 --no-isolate "${W[@]}" --out $C) > $OUT/tune.txt 2>&1
grep "tuned,\|real" $OUT/tune.txt
(cd $C && tar czf $OUT/configs.tgz *.json)
flyreg check $C 2>&1 | tail -1
timeout 120 python3 $B/moe_bench.py --shapes Mixtral-8x7B gpt-oss-20b DeepSeek-V2-Lite Qwen3-30B-A3B --M 4096 8192 --json $OUT/bench.json > $OUT/bench.txt 2>&1
tail -10 $OUT/bench.txt
