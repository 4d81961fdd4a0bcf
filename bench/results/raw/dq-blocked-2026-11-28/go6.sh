# Call 6 (branch wip-dq-scratch): dQ's accumulators left undefined for its product (scale-d 0 on
# its first step, `arch::wgmma_scratch`) instead of zeroed between the group's fence and its first
# wgmma, which removed ptxas's serialisation (C7520) of the d64 no-bias and d128 split kernels.
# A/B against blk1 (main's kernels), then a short property run (few cases: the device time left).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
M=$(bench_at .gpu-pack/bench-blk1.xz)
for r in 1 2; do for pair in blk1=$M new=$B; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 40 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,gather --only "d64/s8192/dense,d64/s8192/causal,d128/s8192/dense,gather/d64/q32768" --impls dmattn --reps 10 > /tmp/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' /tmp/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
DMATTN_GPU_CASES=40 T=45 run gpu_backward > /tmp/t-1.txt 2>&1 &
DMATTN_GPU_CASES=40 T=45 run gpu_gather > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
tar czf $R/logs.tgz /tmp/bench-*.log /tmp/L 2>/dev/null; ls $R
