#!/bin/bash
# Session 14, second device call: GEMM 2 twice as wide as GEMM 1 (BLOCK_N_DOWN=256), served and default configs.
set -u
B=plugins/flyreg-moe/benchmarks
for cell in "gpt-oss-20b 512 2048 4096" "Mixtral-8x7B 512 2048 4096" "Qwen3-30B-A3B 2048 4096" "DeepSeek-V2-Lite 2048"; do
  set -- $cell; name=$1; shift
  timeout 150 python3 $B/moe_knob_ab.py --set BLOCK_N_DOWN=256 --shapes $name --M "$@" --json $OUT/ab_down_$name.json 2>&1 | grep -v "^NVIDIA\|^model" >> $OUT/ab_down.txt
done
cat $OUT/ab_down.txt
