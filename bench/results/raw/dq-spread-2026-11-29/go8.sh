# Call 8: PS, PD (call 6) with each step's own half held in a shared slot of the warp (not in
# registers) and added a step later with the partner's, so that neither CTA waits for the
# other at the step it sends; against main (M), alternating twice on the dense rows (the only
# calls the pairs take); bench only (the device time left).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
M=$(bench_at .gpu-pack/bench-M.xz); P=$(bench_at .gpu-pack/bench-PS.xz)
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d64/s8192/dense,d64/s16384/dense"
for r in 1 2; do for pair in M=$M PS=$P; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 40 $b --out /tmp/ab-$n-$r --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-M-1.log | awk '{print $1}' > $R/case-ids.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
