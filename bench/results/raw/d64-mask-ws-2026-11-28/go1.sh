# Call 1 (session 2026-11-28 fifth): the warp-specialised mask-only d64 forward with launch
# bounds (branch d64-mask-ws): gpu_forward (its mask-only property test now draws d64 and d128),
# gpu_sparse, gpu_gather whole; memcheck/racecheck on each_forward_kernel and a few mask-only
# property cases; then main's bench against this build, twice, over the d64 mask-only calls and
# the key-side path at the same w.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=240 run gpu_forward > $OUT/t-1.txt 2>&1 &
T=240 run gpu_sparse > $OUT/t-2.txt 2>&1 &
T=240 run gpu_gather > $OUT/t-3.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
T=200 san gpu_forward each_forward_kernel | tee $OUT/san.txt
SC=6 T=200 san gpu_forward mask_only_forward_matches_reference | tee -a $OUT/san.txt
H=$(bench_at $here/bench-main.xz)
ONLY="lists1024-window,d64/s8192/blocks128x50%,d64/q16384/k4096/compress4-dense,d64/q16384/k256/compress64-dense,d64/q32768/k32768/causal+keytopk1024"
for r in 1 2; do for pair in main=$H new=$here/bin/dmattn-bench; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 100 $b --out /tmp/ab-$n-$r --groups indices,llm-d64,sparse,gather --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $OUT/ab.txt
grep -E "^[a-z-]+/" $OUT/bench-new-1.log > $OUT/ids.txt
cd $OUT && tar czf logs.tgz *.log t-*.txt && rm -f *.log t-*.txt
