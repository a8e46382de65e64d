#!/bin/bash
# Session 18: the cold `flyreg tune` wall time of two RMSNorm specs with the bind as landed (capped: the
# rescue-free kernel compiled too) and uncapped, each in a fresh Triton cache, alternating, two rounds. Run from
# the repository root with OUT set, after plugins/flyreg-moe/benchmarks/results/h200/session16/install.sh.
set -u
cd plugins/flyreg-rmsnorm/benchmarks/results/session18
for round in 1 2; do
  for spec in "rmsnorm M=256,N=3072,dtype=bfloat16,backend=triton" \
              "fused_add_rmsnorm M=256,N=5120,dtype=float32,backend=triton"; do
    set -- $spec
    for mode in capped uncapped; do
      flag=(); [ $mode = uncapped ] && flag=(--uncapped)
      cache=$(mktemp -d); out=$(mktemp -d)
      echo "round $round $1 $2 $mode" >> $OUT/cold_tune.txt
      TRITON_CACHE_DIR=$cache timeout 120 python3 cold_tune.py "${flag[@]}" -- "$1" --spec "$2" --device cuda \
        --out $out --force --fresh --no-isolate 2>&1 | grep -E "^wall|cost:|tuned," >> $OUT/cold_tune.txt
      rm -rf $cache $out
    done
  done
done
cat $OUT/cold_tune.txt
