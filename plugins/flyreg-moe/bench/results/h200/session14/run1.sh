#!/bin/bash
# Session 14, first device call: gpu tests, SLOT_H A/B, the menu at 24 to 128 rows an expert, stages.
# Run from the repository root with OUT set, after installing the wheels and the three packages.
set -u
B=plugins/flyreg-moe/benchmarks
K="TMA=true TAILS=1 TAILS=2 TMA=true,TAILS=1 TMA=true,TAILS=2"
start=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - start) )); }
timeout 190 python3 -m pytest -q -m gpu plugins/flyreg-moe/tests -p no:cacheprovider > $OUT/gpu_moe.txt 2>&1
tail -2 $OUT/gpu_moe.txt
timeout 110 python3 $B/moe_knob_ab.py --set SLOT_H=true --shapes gpt-oss-20b Mixtral-8x7B --M 1024 2048 4096 --json $OUT/ab_slot.json > $OUT/ab_slot.txt 2>&1
tail -12 $OUT/ab_slot.txt
for cell in "Mixtral-8x7B 128 256" "gpt-oss-20b 256 512" "Qwen3-30B-A3B 512 1024 2048" "DeepSeek-V2-Lite 256 512"; do
  set -- $cell; name=$1; shift
  t=$(left 500); [ "$t" -gt 10 ] || break
  timeout $t python3 $B/moe_menu.py --shapes $name --M "$@" --knobs $K --json $OUT/menu_$name.json >> $OUT/menu.txt 2>&1
done
cat $OUT/menu.txt | grep -v Warn | tail -12
t=$(left 545); [ "$t" -gt 10 ] && timeout $t python3 $B/moe_stages.py --shapes gpt-oss-20b Mixtral-8x7B --M 1024 2048 4096 --json $OUT/stages.json > $OUT/stages.txt 2>&1
tail -8 $OUT/stages.txt
