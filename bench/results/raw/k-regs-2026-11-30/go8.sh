# Call 8 (2026-11-30, 21st session): N2 (`n2-dq-staged-no-dq-diagnostic.diff`: N1, cuDNN's order
# without dQ's additions, plus each warp's dQ block stored to shared memory and the async proxy
# fenced, as cuDNN's computing warps hand it to their sender; never added) against N1 and L,
# alternating twice; then N1 and N2 under ncu (clocks locked).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
N1=$(bench_at .gpu-pack/bench-N1.xz); N2=$(bench_at .gpu-pack/bench-N2.xz); L=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s8192/causal,d128/s16384/dense"
for r in 1 2; do for pair in L=$L N1=$N1 N2=$N2; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 100 $b --out /tmp/ab-$n --groups llm --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-L-1.log | awk '{print $1}' > $R/case-ids.txt
MET="--metrics smsp__inst_executed.sum,sm__cycles_active.avg,gpu__time_duration.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
for pair in N1=$N1 N2=$N2; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 100 ncu -k 'regex:dmattn_bwd_sm90_bf16_d128$' --launch-skip 1 --launch-count 1 $MET $b --out /tmp/n-$n --groups llm --only "d128/s8192/dense" --reps 1 --impls dmattn > $OUT/ncu-$n.log 2>&1
  echo "ncu $n rc=$?"; grep -E '^ +[a-z0-9_]+__' $OUT/ncu-$n.log | sed "s/^/$n /"
done | tee $R/ncu.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
