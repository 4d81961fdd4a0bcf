# Call 7: what half the dQ reductions cost. Diagnostic build HO (wrong dQ by design): the second
# half of each warp's dQ column tiles predicated off by an opaque test, the data flow otherwise
# main's (call 2's `.take(DQ / 2)` build changed it, and ran slower); against main (M),
# alternating twice, dmattn alone.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin; source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
M=$(bench_at .gpu-pack/bench-M.xz); HO=$(bench_at .gpu-pack/bench-HO.xz)
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d128/s8192/causal,d64/s8192/dense,d64/s16384/dense"
for r in 1 2; do for pair in M=$M HO=$HO; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 90 $b --out /tmp/ab-$n-$r --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-M-1.log | awk '{print $1}' > $R/case-ids.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
