# Call 6: F, each thread's wait for its copies of the next stage moved from the step's start to
# just before the P and dS tiles' proxy fence (which then covers them too), so that no fence
# runs at the step's start, where its MEMBAR waited for the previous step's dQ reductions in
# flight; against main (M), alternating twice; then gpu_backward, gpu_sparse and memcheck / racecheck on 2
# backward_matches_reference cases. (A first form, wait and fence after dQ/dV/dK are issued,
# crashed ptxas 12.9 on the kernels without a bias.)
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
M=$(bench_at .gpu-pack/bench-M.xz); F=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d128/s8192/causal,d128/s8192/blocks128x50%,d64/s8192/dense,d64/s16384/dense,d64/s8192/causal"
for r in 1 2; do for pair in M=$M F=$F; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 60 $b --out /tmp/ab-$n-$r --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-M-1.log | awk '{print $1}' > $R/case-ids.txt
T=230 run gpu_backward | tee $R/tests.txt
T=140 run gpu_sparse | tee -a $R/tests.txt
SC=2 T=80 san gpu_backward backward_matches_reference | tee -a $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
