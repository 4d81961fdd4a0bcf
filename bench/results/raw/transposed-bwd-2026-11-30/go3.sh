# Call 3: T4, the transposed step (call 1's T) with the hidden scores zeroed in a loop of their
# own behind the tile's test (T ran the per-score test on every tile as selects: 15 % more
# instructions, call 2's ncu), not in the d128 band + split kernels (spilled 12 bytes);
# against main (C = c0ad353), alternating twice. If T4 is faster at d128 dense 8K: gpu_backward,
# gpu_sparse, memcheck / racecheck on the small lean cases, and gpu_varlen / gpu_gather's
# backward tests.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
C=$(bench_at .gpu-pack/bench-C.xz); T4=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d128/s8192/causal,d128/s16384/causal,sparse/d128/q16384/k16384/causal+window1024"
for r in 1 2; do for pair in C=$C T4=$T4; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 60 $b --out /tmp/ab-$n-$r --groups llm,sparse --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-C-1.log | awk '{print $1}' > $R/case-ids.txt
c=$(grep -h -A3 'llm/d128/s8192/dense' $OUT/bench-C-*.log | grep -E '^  dmattn +bwd' | awk '{s+=$3} END {print s}')
t=$(grep -h -A3 'llm/d128/s8192/dense' $OUT/bench-T4-*.log | grep -E '^  dmattn +bwd' | awk '{s+=$3} END {print s}')
echo "8K dense sums C=$c T4=$t" | tee -a $R/ab.txt
if awk "BEGIN {exit !($t < 0.99 * $c)}"; then
  T=230 run gpu_backward | tee $R/tests.txt
  T=140 run gpu_sparse | tee -a $R/tests.txt
  SC=2 T=100 san gpu_backward lean_d128_small | tee -a $R/tests.txt
  (T=250 run gpu_varlen backward > $OUT/varlen.txt; T=250 run gpu_gather backward > $OUT/gather.txt); cat $OUT/varlen.txt $OUT/gather.txt | tee -a $R/tests.txt
fi
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
