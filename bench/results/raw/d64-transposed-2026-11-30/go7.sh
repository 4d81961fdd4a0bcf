# Call 7: R1 (`r1-rotated-walk-diagnostic.diff`, wrong results, timing only: the transposed walk
# rotated, each step's dQ, dV, dK issued at the next step's start before its S) against L (47ccb82).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
R1=$(bench_at .gpu-pack/bench-R1.xz); L=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s8192/causal,d128/s16384/dense,d128/s16384/causal"
for r in 1 2; do for pair in L=$L R1=$R1; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 90 $b --out /tmp/ab-$n --groups llm --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-L-1.log | awk '{print $1}' > $R/case-ids.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
