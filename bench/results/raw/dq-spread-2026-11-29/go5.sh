# Call 5: PA, P (call 4) with the partner's half sent by `st.async` completing on an mbarrier of
# the receiving warp (two a warp, alternating by step), so that each warp waits only for its
# partner warp's half rather than at a cluster barrier of all 512 threads; against main (M),
# alternating twice; then, where PA is faster, its gpu_backward, memcheck and racecheck
# on 10 backward cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
M=$(bench_at .gpu-pack/bench-M.xz); P=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d128/s8192/causal,d128/s16384/causal,d128/s8192/blocks128x50%,d64/s8192/dense,d64/s16384/dense,d64/s8192/causal"
for r in 1 2; do for pair in M=$M PA=$P; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 90 $b --out /tmp/ab-$n-$r --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-M-1.log | awk '{print $1}' > $R/case-ids.txt
# Tests only where PA is faster on d128 dense 8K (the second row) in round 2.
m=$(grep '^M #2' $R/ab.txt | awk '{print $8}'); pa=$(grep '^PA #2' $R/ab.txt | awk '{print $8}')
echo "d128 dense 8K round 2: M $m, PA $pa" | tee $R/tests.txt
if awk "BEGIN{exit !($pa < $m)}"; then
  T=240 run gpu_backward | tee -a $R/tests.txt
  SC=10 T=120 san gpu_backward backward_matches_reference --exact | tee -a $R/tests.txt
fi
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
