# Call 4: where the dQ reductions' cost goes. ncu (one launch each, d128 dense 8K, b2 h32 hk8)
# of main's kernel (M), the no-reduction diagnostic (N: every dQ red.add predicated off) and
# the sender build (S, call 3): tensor pipe, shared-memory wavefronts, L2 throughput by
# operation, warp stalls.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
M=$(bench_at .gpu-pack/bench-M.xz); N=$(bench_at .gpu-pack/bench-N.xz); S=$(bench_at .gpu-pack/bench-S.xz)
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats"
MET="--metrics l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,lts__t_sectors_op_red.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_atom.sum,smsp__inst_executed.sum,sm__cycles_active.avg"
for pair in M=$M N=$N S=$S; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  ncu --query-metrics 2>/dev/null | grep -E "^(sm__pipe_tensor|sm__inst_executed_pipe_tensor)" > $R/tensor-metrics.txt; timeout 150 ncu -k 'regex:dmattn_bwd_sm90_bf16_d128$' --launch-skip 1 --launch-count 1 $SEC $MET -o /tmp/rep-$n $b --out /tmp/n-$n --groups llm --only "d128/s8192/dense" --reps 1 --impls dmattn > $OUT/ncu-$n.log 2>&1
  echo "ncu $n rc=$? $(( $(date +%s)-s ))s"
  ncu -i /tmp/rep-$n.ncu-rep --page details > $R/details-$n.txt 2>&1
  ncu -i /tmp/rep-$n.ncu-rep --page raw --csv > $R/raw-$n.csv 2>&1
done
gzip -f $R/raw-*.csv
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
