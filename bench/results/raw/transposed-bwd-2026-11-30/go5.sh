# Call 5: T6, T4 with dV issued after the barrier beside dK (the order of main's issue_grads: dQ,
# dV, dK), so that dQ's reductions drain under both (T4's ncu: long-scoreboard stalls 0.80
# against main's 0.15 a issue, with 14 % fewer instructions); T7, T6 with dS from P as rounded
# for dV (233 registers instead of 253); against main (C) and T4, alternating twice; ncu.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh 2>/dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
C=$(bench_at .gpu-pack/bench-C.xz); T4=$(bench_at .gpu-pack/bench-T4.xz); T6=$(bench_at .gpu-pack/bench-T6.xz); T7=$(bench_at .gpu-pack/bench-T7.xz)
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d128/s8192/causal,sparse/d128/q16384/k16384/causal+window1024"
for r in 1 2; do for pair in C=$C T4=$T4 T6=$T6 T7=$T7; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 60 $b --out /tmp/ab-$n-$r --groups llm,sparse --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-C-1.log | awk '{print $1}' > $R/case-ids.txt
MET="--metrics l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,sm__cycles_active.avg,gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio"
for pair in C=$C T6=$T6 T7=$T7; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 100 ncu -k 'regex:dmattn_bwd_sm90_bf16_d128$' --launch-skip 1 --launch-count 1 $MET $b --out /tmp/n-$n --groups llm --only "d128/s8192/dense" --reps 1 --impls dmattn > $OUT/ncu-$n.log 2>&1
  echo "ncu $n rc=$? $(( $(date +%s)-s ))s"; grep -E '^ +[a-z_]+__' $OUT/ncu-$n.log | sed "s/^/$n /"
done | tee $R/ncu.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
