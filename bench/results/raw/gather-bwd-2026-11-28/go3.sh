# Call 3: the Hopper backward with a key-side bias copies the bias row alone and sums dbias over
# the CTA's whole walk (`step::bias_columns`). Smoke; main's bench against this build twice
# (gather group); gpu_backward (with the new key-side bias property test) and gpu_gather;
# memcheck and racecheck on four key-side bias property cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
timeout 60 $B --out /tmp/smoke --groups gather --only "d128/q8192" --impls dmattn --reps 3 > /tmp/smoke.log 2>&1
echo "smoke rc=$? $(grep -E '^  dmattn' /tmp/smoke.log | awk '{print $2, $3}' | tr '\n' ' ')" | tee $R/smoke.txt
grep -q "rc=0" $R/smoke.txt || exit 1
H=$(bench_at .gpu-pack/bench-main.xz)
ONLY="d64/q16384,d64/q32768,d128/q8192,d128/q32768"
for r in 1 2; do for pair in main=$H new=$B; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 150 $b --out /tmp/ab-$n-$r --groups gather --only "$ONLY" --impls dmattn --reps 10 > /tmp/bench-$n-$r.log 2>&1
  echo "$n #$r: $(grep -E '^  dmattn +(fwd|bwd)' /tmp/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
T=400 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=400 run gpu_gather > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
SC=4 T=200 san gpu_backward key_side_bias | tee $R/san.txt
tar czf $R/logs.tgz /tmp/bench-*.log /tmp/L 2>/dev/null; ls $R
