# Call 5: ncu of main's d128 backward kernel and of the transposed step's (call 4's build,
# branch wip-bwd-swapped) on the same call (b2 h32 hk8 d128 4K dense, the third backward
# launch): speed of light, warp states, schedulers, pipes, memory.
here=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy"
for v in main swapped; do
  xz -dc $here/bench-$v.xz > /tmp/bench-$v; chmod +x /tmp/bench-$v
  timeout 150 ncu -k "regex:dmattn_bwd_sm90_bf16_d128$" --launch-skip 2 --launch-count 1 $S --csv /tmp/bench-$v --out /tmp/n-$v --groups llm --only "d128/s4096/dense" --reps 3 --impls dmattn > $OUT/ncu-$v.csv 2>$OUT/ncu-$v.err; echo "ncu $v rc=$?"
done
