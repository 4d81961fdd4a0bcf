# Call 3: QB, dQ by one bulk reduction a warp and step (cp.reduce.async.bulk of the warp's
# 4 KB run of the blocked accumulator from a staging slot; d128 lean kernels on a tile without
# a bias tile; d128 bias kernels keep red.add), against main (M), alternating twice; then QB's
# gpu_backward and gpu_sparse, memcheck and racecheck on 10 backward cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
M=$(bench_at .gpu-pack/bench-M.xz); QB=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d128/s8192/causal,d128/s16384/causal,d128/s8192/blocks128x50%,d64/s8192/dense,d64/s16384/dense,d64/s8192/causal,d64/s8192/blocks128x50%+bias"
for r in 1 2; do for pair in M=$M QB=$QB; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 90 $b --out /tmp/ab-$n-$r --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-M-1.log | awk '{print $1}' > $R/case-ids.txt
T=220 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=220 run gpu_sparse > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
SC=10 T=120 san gpu_backward backward_matches_reference --exact | tee -a $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
