# Call 3: is it the registers or the order? P: d64's 128-row tile keeps P in registers as bf16
# pairs, the step's order as main's (the next stage's copies set up before the first products).
# H (main 2b6259a), A (call 2's) and P alternating twice; then P's tests, memcheck and racecheck
# on backward property cases beside them.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
H=$(bench_at .gpu-pack/bench-H.xz); A=$(bench_at .gpu-pack/bench-A.xz); P=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/dense,d64/s4096/dense,d64/s8192/dense,d64/s8192/causal,d64/s8192/blocks128x50%,d64/s16384/dense"
for r in 1 2; do for pair in H=$H A=$A P=$P; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 120 $b --out /tmp/ab-$n-$r --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z-]+/' $OUT/bench-H-1.log | awk '{print $1}' > $R/case-ids.txt
T=240 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=400 run gpu_gather > /tmp/t-2.txt 2>&1 &
T=400 run gpu_varlen > /tmp/t-3.txt 2>&1 &
(SC=10 T=140 san gpu_backward backward_matches_reference --exact > /tmp/t-4.txt 2>&1) &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls $R
