# Call 5: SR, call 3's sender warpgroup adding dQ with red.add (its four warps read each
# step's blocks from the slots and add a quarter each: no bulk engine, no proxy fence) against
# main (M) and S (call 3), alternating twice; then gpu_backward and memcheck / racecheck on 3
# backward_matches_reference cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
M=$(bench_at .gpu-pack/bench-M.xz); S=$(bench_at .gpu-pack/bench-S.xz); SR=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d128/s8192/causal,d128/s8192/blocks128x50%,d64/s8192/dense,d64/s16384/dense,d64/s8192/causal"
for r in 1 2; do for pair in M=$M S=$S SR=$SR; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 60 $b --out /tmp/ab-$n-$r --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-M-1.log | awk '{print $1}' > $R/case-ids.txt
T=280 run gpu_backward | tee $R/tests.txt
SC=3 T=100 san gpu_backward backward_matches_reference | tee -a $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
