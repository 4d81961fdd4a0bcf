# Call 1: dQ's accumulator in the blocked layout (one 16-byte reduction a lane, 512 contiguous
# bytes a warp) against main (60d131d), builds alternating twice; then gpu_backward and gpu_gather.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
timeout 60 $B --out /tmp/smoke --groups gather --only "d128/q8192" --impls dmattn --reps 3 > /tmp/smoke.log 2>&1
echo "smoke rc=$? $(grep -E '^  dmattn' /tmp/smoke.log | awk '{print $2, $3}' | tr '\n' ' ')" | tee $R/smoke.txt
grep -q "rc=0" $R/smoke.txt || { tail -30 /tmp/smoke.log > $R/smoke.log; exit 1; }
M=$(bench_at .gpu-pack/bench-main.xz)
for r in 1 2; do for pair in main=$M new=$B; do
  n=${pair%%=*}; b=${pair#*=}
  for g in "llm d128/s8192/dense,d128/s8192/causal,d128/s8192/blocks128x50%,d128/s8192/blocks128x50%+bias" "llm-d64 d64/s8192/dense,d64/s8192/blocks128x50%" "gather d64/q32768,d128/q8192,d128/q32768"; do
    set -- $g
    timeout 150 $b --out /tmp/ab-$n-$r-$1 --groups $1 --only "$2" --impls dmattn --reps 10 > /tmp/bench-$n-$r-$1.log 2>&1
    echo "$n #$r $1 rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' /tmp/bench-$n-$r-$1.log | awk '{print $2, $3}' | tr '\n' ' ')"
  done
done; done | tee $R/ab.txt
T=330 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=330 run gpu_gather > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
tar czf $R/logs.tgz /tmp/bench-*.log /tmp/L 2>/dev/null; ls $R
