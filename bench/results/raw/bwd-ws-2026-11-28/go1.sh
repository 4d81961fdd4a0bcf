# Call 1: the warp-specialised d128 backward (a producer warpgroup copying the stages and, in
# `_ws`, sending dQ by bulk reductions; `_ws_red`: the consumers add dQ themselves). Its
# property test (both variants), memcheck/racecheck on four cases, then the plain kernel (0),
# `_ws` (1) and `_ws_red` (2) alternating twice over d128 dense and causal, 4K-16K.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=200 run gpu_backward warp_specialised | tee $OUT/tests.txt
SC=4 T=150 san gpu_backward warp_specialised | tee $OUT/san.txt
ONLY="d128/s4096/dense,d128/s4096/causal,d128/s8192/dense,d128/s8192/causal,d128/s16384/dense,d128/s16384/causal"
for r in 1 2; do for ws in 0 1 2; do
  DMATTN_BENCH_BWD_WS=$ws timeout 150 $here/bin/dmattn-bench --out /tmp/ab-$ws-$r --groups llm --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$ws-$r.log 2>&1
  echo "ws=$ws #$r: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$ws-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $OUT/ab.txt
grep -E "^[a-z-]+/" $OUT/bench-1-1.log > $OUT/ids.txt
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
