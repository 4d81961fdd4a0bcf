# Call 10 (2026-11-30, 21st session): B1 (`b1-cudnn-order-bulk-dq.diff`: the d128 transposed step
# in cuDNN's order, dV and dK issued before the barrier, dQ alone after it and added by one bulk
# reduction a warp from a shared-memory slot) against L (main), alternating twice; then the lean
# backward tests and memcheck/racecheck on lean_small.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
L=$(bench_at .gpu-pack/L-bench.xz); B1=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s8192/causal,d128/s16384/dense,d128/s16384/causal"
for r in 1 2; do for pair in L=$L B1=$B1; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 100 $b --out /tmp/ab-$n --groups llm --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-L-1.log | awk '{print $1}' > $R/case-ids.txt
T=200 run gpu_backward lean | tee $R/tests.txt
SC=4 T=120 san gpu_backward lean_small | tee -a $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
