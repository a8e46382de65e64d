#!/bin/bash
# Session 13's re-tune and benchmark on the H200, run from the repository root with OUT set.
set -u
C=plugins/flyreg-moe/flyreg_moe/configs
B=plugins/flyreg-moe/benchmarks
W=()
for m in 128 256 512 1024 2048 4096 8192; do W+=(--where "M=$m"); done
export COLUMNS=250
start=$(date +%s)
(time timeout 330 flyreg tune fused_moe --device cuda --force --budget 1.5 --no-isolate "${W[@]}" --out $C) > $OUT/tune.txt 2>&1
tail -3 $OUT/tune.txt
(cd $C && tar czf $OUT/configs.tgz *.json)
flyreg check $C 2>&1 | tail -1
left=$(( 560 - ($(date +%s) - start) ))
echo "bench gets ${left} s"
timeout $left python3 $B/moe_bench.py --shapes gpt-oss-20b Mixtral-8x7B DeepSeek-V2-Lite Qwen3-30B-A3B --M 128 256 512 1024 2048 4096 8192 --json $OUT/bench.json > $OUT/bench.txt 2>&1
tail -30 $OUT/bench.txt
