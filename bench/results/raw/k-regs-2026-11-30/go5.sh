# Call 5 (2026-11-30, 21st session): the d128 dense 8K backward kernel under ncu (clocks locked by
# ncu), one launch each of L (main), K (K's fragments in registers) and H (lse/delta read early).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
H=$(bench_at .gpu-pack/bench-H.xz); K=$(bench_at .gpu-pack/bench-K.xz); L=.gpu-pack/bin/dmattn-bench
MET="--metrics l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,sm__cycles_active.avg,gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio"
for r in 1 2; do for pair in L=$L K=$K H=$H; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 100 ncu -k 'regex:dmattn_bwd_sm90_bf16_d128$' --launch-skip 1 --launch-count 1 $MET $b --out /tmp/n-$n --groups llm --only "d128/s8192/dense" --reps 1 --impls dmattn > $OUT/ncu-$n-$r.log 2>&1
  echo "ncu $n #$r rc=$? $(( $(date +%s)-s ))s"; grep -E '^ +[a-z0-9_]+__' $OUT/ncu-$n-$r.log | sed "s/^/$n /"
done; done | tee $R/ncu.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
