# Call 9 (2026-11-30, 21st session): cuDNN's d128 dense 8K backward kernel and L's under ncu with
# clocks locked (as calls 5-8 measured N0-N2), for a like-for-like cycle count.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
L=.gpu-pack/bin/dmattn-bench
$L --cases-only --groups llm --only "d128/s8192/dense" --reps 1 --out /tmp/c8 > $OUT/cases.log 2>&1
MET="--metrics smsp__inst_executed.sum,sm__cycles_active.avg,gpu__time_duration.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
timeout 150 ncu -k "regex:(?i)bprop" --launch-skip 1 --launch-count 1 $MET python3 .gpu-pack/peers.py --cases /tmp/c8/cases.json --out /tmp/c8/peers.json --impls sdpa-cudnn > $OUT/ncu-cudnn.log 2>&1
echo "ncu cudnn rc=$?" | tee $R/ncu.txt; grep -E '^ +[a-z0-9_]+__|bprop' $OUT/ncu-cudnn.log | sed "s/^/cudnn /" | tee -a $R/ncu.txt
timeout 100 ncu -k 'regex:dmattn_bwd_sm90_bf16_d128$' --launch-skip 1 --launch-count 1 $MET $L --out /tmp/n-L --groups llm --only "d128/s8192/dense" --reps 1 --impls dmattn > $OUT/ncu-L.log 2>&1
echo "ncu L rc=$?" | tee -a $R/ncu.txt; grep -E '^ +[a-z0-9_]+__' $OUT/ncu-L.log | sed "s/^/L /" | tee -a $R/ncu.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
