# Call 2: call 1 hung (the consumers' setmaxnreg.inc asked for 64 + 224 registers, more than the
# 168 x 384 the CTA is launched with). Now 56 + 224. A 30 s smoke first (one small case), then
# the property test (both variants), memcheck/racecheck on two cases, then the plain kernel (0),
# `_ws` (1) and `_ws_red` (2) alternating twice over d128 dense 4K/8K and causal 8K.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
DMATTN_BENCH_BWD_WS=1 timeout 40 $here/bin/dmattn-bench --out /tmp/smoke --groups llm --only "d128/s1024/dense" --impls dmattn --reps 3 > $OUT/smoke.log 2>&1
echo "smoke rc=$? $(grep -E '^  dmattn +bwd' $OUT/smoke.log)" | tee $OUT/smoke.txt
grep -q "rc=0" $OUT/smoke.txt || exit 1
T=150 run gpu_backward warp_specialised | tee $OUT/tests.txt
SC=2 T=100 san gpu_backward warp_specialised | tee $OUT/san.txt
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s8192/causal"
for r in 1 2; do for ws in 0 1 2; do
  DMATTN_BENCH_BWD_WS=$ws timeout 60 $here/bin/dmattn-bench --out /tmp/ab-$ws-$r --groups llm --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$ws-$r.log 2>&1
  echo "ws=$ws #$r: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$ws-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $OUT/ab.txt
grep -E "^[a-z-]+/" $OUT/bench-1-1.log > $OUT/ids.txt
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
