# Call 1: do the CTAs running together contend for one dQ tile? Main (M) against
# A (the kv group's heads visited in an order rotated by key tile), B (each key tile's
# walk started at the top of the (n % 4)-th quarter of its query tiles) and AB (both),
# builds alternating twice, dmattn alone.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin; source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
M=$(bench_at .gpu-pack/bench-M.xz); A=$(bench_at .gpu-pack/bench-A.xz); B=$(bench_at .gpu-pack/bench-B.xz); AB=$(bench_at .gpu-pack/bench-AB.xz)
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d128/s16384/causal,d128/s8192/blocks128x50%+bias,d64/s8192/dense,d64/s16384/dense,d64/s16384/causal"
for r in 1 2; do for pair in M=$M A=$A B=$B AB=$AB; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 90 $b --out /tmp/ab-$n-$r --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-M-1.log | awk '{print $1}' > $R/case-ids.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
