# Call 4: four builds alternating twice, one process each: G (main eb43c39's kernels), Y (call
# 3's), Z (Y without d64's early bias words; the backward's d128 stage copies keep their bounds
# tests; the checked copies recompute the thread's place per call), W (Z + the bias words by
# `ldmatrix.x4`). Forward and backward ms.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
G=$(bench_at .gpu-pack/bench-G.xz); Y=$(bench_at .gpu-pack/bench-Y.xz); Z=$(bench_at .gpu-pack/bench-Z.xz); W=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/dense,d128/s8192/blocks128x50%,d64/s8192/dense,d64/s8192/blocks128x50%+bias,d64/s16384/blocks128x50%+bias,dma-train/q16384/k"
for r in 1 2; do for pair in G=$G Y=$Y Z=$Z W=$W; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 150 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z-]+/' $OUT/bench-G-1.log | awk '{print $1}' > $R/case-ids.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls $R
