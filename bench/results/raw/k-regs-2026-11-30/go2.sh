# Call 2 (2026-11-30, 21st session): K (Sᵀ's A = the warp's K fragments in registers, loaded once;
# Pᵀ's exponentials packed as they are formed, dSᵀ from P as rounded) against L (main 4ec9ada),
# alternating twice; then gpu_backward, gpu_sparse, gpu_varlen backward in parallel; then the
# sanitizer on lean_small.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
L=$(bench_at .gpu-pack/L-bench.xz); K=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s8192/causal,d128/s16384/dense,d128/s16384/causal,d64/s4096/dense,d64/s8192/dense,d64/s8192/causal,d64/s16384/dense"
for r in 1 2; do for pair in L=$L K=$K; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 100 $b --out /tmp/ab-$n --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-L-1.log | awk '{print $1}' > $R/case-ids.txt
( T=330 run gpu_backward > $OUT/t-bwd.txt 2>&1 & T=330 run gpu_sparse > $OUT/t-sparse.txt 2>&1 & T=330 run gpu_varlen backward > $OUT/t-varlen.txt 2>&1 & wait )
cat $OUT/t-*.txt | tee $R/tests.txt
T=120 san gpu_backward lean_small | tee -a $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
