# Call 1: d64 on the transposed step (N) against main (B, 6b64e7c): the lean property test
# (d64 and d128) with all of gpu_backward, sanitizers on lean_small, then B and N
# alternating twice on d64 dense/causal and d128 dense/causal 8K.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
B=$(bench_at .gpu-pack/bench-B.xz); N=.gpu-pack/bin/dmattn-bench
ONLY="d64/s4096/dense,d64/s8192/dense,d64/s16384/dense,d64/s8192/causal,d64/s16384/causal,d128/s8192/dense,d128/s8192/causal"
for r in 1 2; do for pair in B=$B N=$N; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 70 $b --out /tmp/ab-$n --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-B-1.log | awk '{print $1}' > $R/case-ids.txt
T=300 run gpu_backward | tee $R/tests.txt
T=60 san gpu_backward lean_small | tee $R/san.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
