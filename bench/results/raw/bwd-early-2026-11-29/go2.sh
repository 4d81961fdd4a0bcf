# Call 2: which order to keep. H: main 2b6259a. A: the first products issued before the next
# stage's copies are set up on d64's 128-row tile only, whose P stays in registers as bf16 pairs
# (its kernels are call 1's N's). C: every Hopper kernel sets up the next stage's copies once
# the step's last products (dQ, dV, dK) are issued, with the 128-row tile's P as in A and no
# early issue. Builds alternating twice; then C's tests, with memcheck and racecheck on backward
# property cases beside them.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
H=$(bench_at .gpu-pack/bench-H.xz); A=$(bench_at .gpu-pack/bench-A.xz); C=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/dense,d128/s8192/causal,d128/s8192/blocks128x50%+bias,d64/s8192/dense,d64/s8192/causal,d64/s8192/blocks128x50%+bias,dma-train/q16384/k"
for r in 1 2; do for pair in H=$H A=$A C=$C; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 120 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
T=280 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=280 run gpu_sparse > /tmp/t-2.txt 2>&1 &
T=280 run gpu_gather > /tmp/t-3.txt 2>&1 &
T=280 run gpu_varlen > /tmp/t-4.txt 2>&1 &
(SC=10 T=140 san gpu_backward backward_matches_reference --exact > /tmp/t-5.txt 2>&1) &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls $R
