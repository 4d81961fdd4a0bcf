# Call 5: F (the landed build, 1f1c998) against ST (F with the second warpgroup issuing dQ after
# dV, so that the two warpgroups' dQ reductions do not go out at once: dq-staggered.diff),
# alternating twice.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
F=$(bench_at .gpu-pack/bench-F.xz); ST=$(bench_at .gpu-pack/bench-ST.xz)
ONLY="d128/s8192/dense,d128/s8192/causal,d64/s8192/dense,d64/s8192/causal,d64/s8192/blocks128x50%+bias,dma-train/q16384/k"
for r in 1 2; do for pair in F=$F ST=$ST; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 60 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-F-1.log | awk '{print $1}' > $R/case-ids.txt
