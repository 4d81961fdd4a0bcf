# Call 3: the d128 Hopper backward without modifiers on the step with its scores transposed
# (`bwd::swapped`: Sᵀ and dPᵀ per warpgroup, dV and dK from registers, only dS through shared
# memory). A smoke case; main (727fdeb's kernels, the same as eca9579's) against this build
# twice over d128 dense and causal; the backward, sparse (windows, compression: the band
# kernels) and varlen suites in parallel; memcheck/racecheck on two small lean d128 cases.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 40 $here/bin/dmattn-bench --out /tmp/smoke --groups llm --only "d128/s1024/dense" --impls dmattn --reps 3 > $OUT/smoke.log 2>&1
echo "smoke rc=$? $(grep -E '^  dmattn +bwd' $OUT/smoke.log)" | tee $OUT/smoke.txt
grep -q "rc=0" $OUT/smoke.txt || exit 1
H=$(bench_at $here/bench-main.xz)
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s8192/causal,d128/s16384/causal"
for r in 1 2; do for pair in main=$H new=$here/bin/dmattn-bench; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 90 $b --out /tmp/ab-$n-$r --groups llm --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $OUT/ab.txt
grep -E "^[a-z-]+/" $OUT/bench-new-1.log > $OUT/ids.txt
T=300 run gpu_backward > $OUT/t-1.txt 2>&1 &
T=300 run gpu_sparse > $OUT/t-2.txt 2>&1 &
T=320 run gpu_varlen > $OUT/t-3.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
T=100 san gpu_backward lean_d128_small | tee $OUT/san.txt
cd $OUT && tar czf logs.tgz *.log t-*.txt && rm -f *.log t-*.txt
