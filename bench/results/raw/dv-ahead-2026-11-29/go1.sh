# Call 1 (dv-ahead): the Hopper backward issues dV += Pᵀ dO as soon as the P it reads is in its
# tile (a warpgroup barrier on 64-row tiles, the CTA's on d64's 128-row one), so that dS forms
# under it. A/B against G (main eb43c39's kernels), builds alternating twice; then gpu_backward
# and gpu_gather in full.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
M=$(bench_at .gpu-pack/bench-G.xz)
for r in 1 2; do for pair in main=$M new=$B; do
  n=${pair%%=*}; b=${pair#*=}
  for g in "llm d128/s8192/dense,d128/s8192/causal,d128/s8192/blocks128x50%,d128/s4096/dense" "llm-d64 d64/s8192/dense,d64/s8192/causal,d64/s8192/blocks128x50%" "gather d64/q32768,d128/q8192" "sparse compress4"; do
    set -- $g
    timeout 100 $b --out /tmp/ab-$n-$r-$1 --groups $1 --only "$2" --impls dmattn --reps 10 > /tmp/bench-$n-$r-$1.log 2>&1
    echo "$n #$r $1 rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' /tmp/bench-$n-$r-$1.log | awk '{print $2, $3}' | tr '\n' ' ')"
  done
done; done | tee $R/ab.txt
T=280 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=280 run gpu_gather > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
tar czf $R/logs.tgz /tmp/bench-*.log /tmp/L 2>/dev/null; ls $R
