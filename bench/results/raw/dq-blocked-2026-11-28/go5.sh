# Call 5 (tried, not kept): the dQ reductions predicated in the asm instead of branched around (the d64 no-bias
# kernels' 128-row tile had its wgmmas serialised by ptxas, C7520, after call 1's change) against
# call 1's build with the host fix (blk1), alternating twice; then the suites whose kernels changed.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
M=$(bench_at .gpu-pack/bench-blk1.xz)
for r in 1 2; do for pair in blk1=$M new=$B; do
  n=${pair%%=*}; b=${pair#*=}
  for g in "llm-d64 d64/s8192/dense,d64/s8192/causal,d64/s8192/blocks128x50%" "llm d128/s8192/dense" "sparse d64/q16384/k16384/causal+window1024"; do
    set -- $g
    timeout 120 $b --out /tmp/ab-$n-$r-$1 --groups $1 --only "$2" --impls dmattn --reps 10 > /tmp/bench-$n-$r-$1.log 2>&1
    echo "$n #$r $1 rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' /tmp/bench-$n-$r-$1.log | awk '{print $2, $3}' | tr '\n' ' ')"
  done
done; done | tee $R/ab.txt
T=400 run gpu_varlen > /tmp/t-1.txt 2>&1 &
T=400 run gpu_backward > /tmp/t-2.txt 2>&1 &
T=400 run gpu_sparse > /tmp/t-3.txt 2>&1 &
T=400 run gpu_gather > /tmp/t-4.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
SC=2 T=100 san gpu_backward split_query_backward | tee $R/san.txt
tar czf $R/logs.tgz /tmp/bench-*.log /tmp/L 2>/dev/null; ls $R
