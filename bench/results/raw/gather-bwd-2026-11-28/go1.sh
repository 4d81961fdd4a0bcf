# Call 1: where the gathered backward's time goes (main's build, 8edbb36). Smoke; the gather
# group's dmattn rows twice; ncu per-kernel durations of a d128 32K and 8K call; ncu sections
# of the gathered d128 32K backward kernel.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
B=.gpu-pack/bin/dmattn-bench
timeout 60 $B --out /tmp/smoke --groups gather --only "d128/q8192" --impls dmattn --reps 3 > $OUT/smoke.log 2>&1
echo "smoke rc=$?" | tee $OUT/smoke.txt; grep -E '^  dmattn' $OUT/smoke.log | tee -a $OUT/smoke.txt
grep -q "rc=0" $OUT/smoke.txt || exit 1
for r in 1 2; do
  timeout 150 $B --out /tmp/g$r --groups gather --only "d64/q16384,d64/q32768,d128/q8192,d128/q32768" --impls dmattn --reps 10 > $OUT/bench-$r.log 2>&1
  echo "round $r rc=$?"; grep -E '^(gather|  dmattn)' $OUT/bench-$r.log
done | tee $OUT/bench.txt
for c in d128/q32768 d128/q8192 d64/q32768; do
  n=$(echo $c | tr / -)
  timeout 200 ncu --metrics gpu__time_duration.sum --csv $B --out /tmp/n-$n --groups gather --only "$c" --impls dmattn --reps 1 > $OUT/times-$n.csv 2> $OUT/times-$n.err
  echo "ncu times $c rc=$?"
done
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats"
timeout 150 ncu -k "regex:dmattn_bwd_sm90" --launch-skip 1 --launch-count 1 $S --csv $B --out /tmp/ns --groups gather --only "d128/q32768" --impls dmattn --reps 1 > $OUT/ncu-bwd-d128-32k.csv 2> $OUT/ncu-bwd.err
echo "ncu sections rc=$?"
