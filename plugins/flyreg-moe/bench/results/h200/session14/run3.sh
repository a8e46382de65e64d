#!/bin/bash
# Session 14, third device call: gpu tests of the changed paths, re-tune of the specs the new default changes
# (most important first), then the benchmark of all 56 workloads (M >= 128, then M <= 64) in this one call.
set -u
C=plugins/flyreg-moe/flyreg_moe/configs
B=plugins/flyreg-moe/benchmarks
export COLUMNS=250
start=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - start) )); }
timeout 100 python3 -m pytest -q -m gpu plugins/flyreg-moe/tests -p no:cacheprovider -k "tail_tiles or default_config or tma" > $OUT/gpu_moe.txt 2>&1
tail -2 $OUT/gpu_moe.txt
tune() {  # tune(seconds, log, where...): the op's workloads with any of these axis values
  local t=$1 log=$2; shift 2; local W=(); for s in "$@"; do W+=(--where "$s"); done
  [ "$t" -gt 15 ] && (time timeout $t flyreg tune fused_moe --device cuda --force --budget 1 --no-isolate "${W[@]}" --out $C) > $OUT/$log 2>&1
  tail -3 $OUT/$log
}
tune 80 tune_gptoss.txt E=32,M=512 E=32,M=1024 E=32,M=2048 E=32,M=4096 E=32,M=8192
tune 110 tune_mixtral.txt E=8,M=128 E=8,M=256 E=8,M=512 E=8,M=1024 E=8,M=2048 E=8,M=4096 E=8,M=8192 E=128,M=512 E=128,M=1024
t=$(left 300); tune $(( t < 90 ? t : 90 )) tune_rest.txt E=64,M=1024 E=64,M=2048 E=64,M=4096 E=64,M=8192 E=128,M=2048 E=128,M=4096 E=128,M=8192
(cd $C && tar czf $OUT/configs.tgz *.json)
flyreg check $C 2>&1 | tail -1
ALL="gpt-oss-20b Mixtral-8x7B DeepSeek-V2-Lite Qwen3-30B-A3B"
timeout $(left 450) python3 $B/moe_bench.py --shapes $ALL --M 128 256 512 1024 2048 4096 8192 --json $OUT/bench_large.json > $OUT/bench_large.txt 2>&1
tail -30 $OUT/bench_large.txt
timeout $(left 560) python3 $B/moe_bench.py --shapes $ALL --M 1 2 4 8 16 32 64 --json $OUT/bench_small.json > $OUT/bench_small.txt 2>&1
tail -30 $OUT/bench_small.txt
