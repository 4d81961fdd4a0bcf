# Call 2: the transposed step (T, call 1) and two variants against main (C = c0ad353),
# alternating twice on the d128 rows: T3 forms dS from P as rounded for dV (unpacked: 16
# registers fewer), T2 issues dK before the barrier (dQ alone after it). Then ncu of C's and
# T's kernel (d128 dense 8K, one launch each): instructions, shared-memory wavefronts, warp
# stalls. Then cuDNN on the d64 rows beside C; then T's lean property test capped at 500 cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
C=$(bench_at .gpu-pack/bench-C.xz); T=.gpu-pack/bin/dmattn-bench; T2=$(bench_at .gpu-pack/bench-T2.xz); T3=$(bench_at .gpu-pack/bench-T3.xz)
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d128/s8192/causal"
for r in 1 2; do for pair in C=$C T=$T T2=$T2 T3=$T3; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 60 $b --out /tmp/ab-$n-$r --groups llm --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-C-1.log | awk '{print $1}' > $R/case-ids.txt
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats"
MET="--metrics l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,sm__cycles_active.avg,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
for pair in C=$C T=$T; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 120 ncu -k 'regex:dmattn_bwd_sm90_bf16_d128$' --launch-skip 1 --launch-count 1 $SEC $MET -o /tmp/rep-$n $b --out /tmp/n-$n --groups llm --only "d128/s8192/dense" --reps 1 --impls dmattn > $OUT/ncu-$n.log 2>&1
  echo "ncu $n rc=$? $(( $(date +%s)-s ))s"
  ncu -i /tmp/rep-$n.ncu-rep --page details > $R/details-$n.txt 2>&1
done
timeout 60 $C --out /tmp/d64 --groups llm-d64 --only "d64/s4096/dense,d64/s8192/dense,d64/s16384/dense,d64/s8192/causal,d64/s16384/causal" --impls dmattn --reps 10 > $OUT/bench-d64.log 2>&1; echo "d64 rc=$?"
timeout 100 python3 .gpu-pack/peers.py --cases /tmp/d64/cases.json --out /tmp/d64/peers.json --impls sdpa-cudnn > $OUT/peers-d64.log 2>&1; echo "peers rc=$?"
mkdir -p $R/d64 && cp /tmp/d64/*.json $R/d64/
DMATTN_GPU_CASES=500 T=150 run gpu_backward lean_d128_backward | tee $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
