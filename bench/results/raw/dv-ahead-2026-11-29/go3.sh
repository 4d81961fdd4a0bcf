# Call 3: three builds alternating twice in one process each: G (main eb43c39's kernels), X (copies
# of whole tiles without bounds tests in `SmemTile::load_async`; d64's bias words read while the
# scores' product computes), Y (X + wgmma descriptors as one conversion a product plus a constant
# a k-step). Forward and backward ms on the rows these touch.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
G=$(bench_at .gpu-pack/bench-G.xz); X=$(bench_at .gpu-pack/bench-X.xz); Y=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/dense,d128/s8192/causal,d128/s8192/blocks128x50%+bias,d64/s8192/dense,d64/s8192/blocks128x50%+bias,d64/s16384/blocks128x50%+bias,dma-train/q16384/k"
for r in 1 2; do for pair in G=$G X=$X Y=$Y; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 150 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z-]+/' $OUT/bench-G-1.log | awk '{print $1}' > $R/case-ids.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls $R
