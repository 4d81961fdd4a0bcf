# Call 1: T, the d128 lean backward's step transposed (cuDNN's and FlashAttention-3's form: Sᵀ,
# dPᵀ per warpgroup's 64 keys, dV and dK from registers, dS stored keys by rows with stmatrix, lse
# and delta side by side) against main (C = c0ad353), alternating twice; cuDNN on the same cases;
# then the lean d128 property test (2,000 cases) and memcheck / racecheck on two small cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
C=$(bench_at .gpu-pack/bench-C.xz); T=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d128/s8192/causal,d128/s16384/causal"
for r in 1 2; do for pair in C=$C T=$T; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 60 $b --out /tmp/ab-$n-$r --groups llm --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-C-1.log | awk '{print $1}' > $R/case-ids.txt
T=200 run gpu_backward lean_d128 | tee $R/tests.txt
SC=2 T=100 san gpu_backward lean_d128_small | tee -a $R/tests.txt
timeout 120 python3 .gpu-pack/peers.py --cases /tmp/ab-T-1/cases.json --out /tmp/ab-T-1/peers.json --impls sdpa-cudnn > $OUT/peers.log 2>&1; echo "peers rc=$?"
cp /tmp/ab-T-1/*.json $R/ 2>/dev/null
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
