# Call 2: the d128 warp-specialised modifier forward on 128-key tiles (one mask slot beside the
# bias ring, softmax state in registers, producer at 72 registers). First main (c64e11d's
# kernels) against this build over the d128 LLM rows, twice; then the forward-side test
# binaries; then memcheck/racecheck on each_forward_kernel and a few modifier property cases.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
H=$(bench_at $here/bench-main.xz)
ONLY="d128/s1024/blocks128x50%+bias,d128/s4096/blocks128x50%+bias,d128/s8192,d128/s16384/blocks128x50%+bias"
for r in 1 2; do for pair in main=$H new=$here/bin/dmattn-bench; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 100 $b --out /tmp/ab-$n-$r --groups llm --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $OUT/ab.txt
grep -E "^[a-z-]+/" $OUT/bench-new-1.log > $OUT/ids.txt
T=330 run gpu_forward > $OUT/t-1.txt 2>&1 &
T=330 run gpu_sparse > $OUT/t-2.txt 2>&1 &
T=330 run gpu_backward > $OUT/t-3.txt 2>&1 &
T=330 run gpu_decode > $OUT/t-4.txt 2>&1 &
T=330 run gpu_interop > $OUT/t-5.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
T=150 san gpu_forward each_forward_kernel | tee $OUT/san.txt
SC=6 T=150 san gpu_forward modifier_forward_matches_reference | tee -a $OUT/san.txt
cd $OUT && tar czf logs.tgz *.log t-*.txt && rm -f *.log t-*.txt
