# Call 6: PD, PA (call 5) with each step's own half held in registers and added a step later,
# once the partner's half (sent at the same step) has arrived, so that neither CTA waits for the
# other at the step it sends; against main (M), alternating twice on the dense rows (the only
# calls the pairs take); then, where PD is faster on d128 dense 8K, its gpu_backward, memcheck
# and racecheck on 10 backward cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
M=$(bench_at .gpu-pack/bench-M.xz); P=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d64/s8192/dense,d64/s16384/dense"
for r in 1 2; do for pair in M=$M PD=$P; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 90 $b --out /tmp/ab-$n-$r --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-M-1.log | awk '{print $1}' > $R/case-ids.txt
m=$(grep '^M #2' $R/ab.txt | awk '{print $8}'); pd=$(grep '^PD #2' $R/ab.txt | awk '{print $8}')
echo "d128 dense 8K round 2: M $m, PD $pd" | tee $R/tests.txt
if awk "BEGIN{exit !($pd < 0.97 * $m)}"; then
  T=220 run gpu_backward | tee -a $R/tests.txt
  SC=10 T=100 san gpu_backward backward_matches_reference --exact | tee -a $R/tests.txt
fi
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
