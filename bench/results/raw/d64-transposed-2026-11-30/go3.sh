# Call 3: D1, a diagnostic build without the step-start barrier in the transposed kernels
# (wrong results; timing only), against N (34f2a72), alternating twice; then gpu_sparse and
# gpu_varlen's backward tests on 34f2a72's build.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
D1=$(bench_at .gpu-pack/bench-D1.xz); N=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/dense,d128/s8192/causal,d128/s16384/dense,d64/s8192/dense,d64/s8192/causal"
for r in 1 2; do for pair in N=$N D1=$D1; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 70 $b --out /tmp/ab-$n --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-N-1.log | awk '{print $1}' > $R/case-ids.txt
( T=280 run gpu_varlen backward > $R/tests-varlen.txt 2>&1 ) &
T=280 run gpu_sparse > $R/tests-sparse.txt 2>&1
wait
cat $R/tests-*.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
