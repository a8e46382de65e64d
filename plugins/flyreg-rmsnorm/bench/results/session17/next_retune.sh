#!/bin/bash
# For the next session: re-tune over the rescue kernels the specs whose cells read more than 2 % slower in session
# 17's A/B (ab_hybrid.json), then time each cell best against best: session 7's kernels with the shipped config
# against the rescue kernels with the re-tuned one (kernel_ab.py --after-configs). Run from the repository root with
# OUT set, after plugins/flyreg-moe/benchmarks/results/h200/session16/install.sh, in two calls: `bash next_retune.sh 1`
# tunes (30 s budget a spec) and writes $OUT/retuned.tgz; `bash next_retune.sh 2 TGZ` times those configs.
set -u
DIR=/tmp/retuned
mkdir -p $DIR
if [ "${1:?part 1 or 2}" = 1 ]; then
tune() {  # op dtype M N
  timeout 100 flyreg tune "$1" --device cuda --spec "M=$3,N=$4,dtype=$2,backend=triton" --out $DIR --force --fresh \
    --budget 30 >> $OUT/retune.txt 2>&1
}
tune rmsnorm bfloat16 256 2048; tune rmsnorm float32 256 2048; tune rmsnorm bfloat16 256 16384
tune rmsnorm bfloat16 256 3072; tune rmsnorm float32 256 4096; tune rmsnorm bfloat16 32 8192
tune rmsnorm bfloat16 256 5120; tune fused_add_rmsnorm float32 1 2048; tune fused_add_rmsnorm float32 1 3072
tune fused_add_rmsnorm float32 256 5120; tune fused_add_rmsnorm bfloat16 1 5120; tune fused_add_rmsnorm bfloat16 32 128
(cd $DIR && tar czf $OUT/retuned.tgz *.json)
grep -ciE "error|traceback" $OUT/retune.txt; ls $DIR | wc -l
exit 0
fi
tar xzf "${2:?the retuned.tgz of part 1}" -C $DIR
# An empty scratch cache: the tunes of part 1 also wrote theirs, which lookup serves before the shipped artifacts,
# and "before" must run the config session 7 shipped.
export FLYREG_CACHE_DIR=$(mktemp -d)
git show 688f7b6:plugins/flyreg-rmsnorm/flyreg_rmsnorm/triton_kernels.py > /tmp/before_kernels.py
cd plugins/flyreg-rmsnorm
ab() {  # op dtype Ms Ns
  timeout 60 python3 benchmarks/kernel_ab.py --before /tmp/before_kernels.py --after-configs $DIR --ops "$1" \
    --dtype "$2" --M $3 --N $4 --rounds 3 --json $OUT/best_$1_$2.json >> $OUT/best.txt 2>&1
}
ab rmsnorm bfloat16 "32 256" "2048 3072 5120 8192 16384"; ab rmsnorm float32 256 "2048 4096"
ab fused_add_rmsnorm float32 "1 256" "2048 3072 5120"; ab fused_add_rmsnorm bfloat16 "1 32" "128 5120"
grep -E "after/before|cells" $OUT/best.txt
rm -rf "$FLYREG_CACHE_DIR"
