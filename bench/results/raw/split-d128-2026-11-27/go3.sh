source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
for r in 1 2; do
  /tmp/bench-main --out /tmp/a$r --groups sparse --only compress64 --impls dmattn > $OUT/ab-main$r.log 2>&1
  $here/bin/dmattn-bench --out /tmp/b$r --groups sparse --only compress64 --impls dmattn > $OUT/ab-new$r.log 2>&1
done
cp /tmp/b1/cases.json $OUT/cases.json
for f in $OUT/ab-*.log; do echo "== $f"; grep -iE "compress64" $f | head -8; done
PYTHONUNBUFFERED=1 timeout 200 python3 $here/peers.py --cases /tmp/b1/cases.json --out $OUT/peers.json --impls sdpa-cudnn,flex > $OUT/peers.log 2>&1; echo peers rc=$?
grep -iE "compress64|ms" $OUT/peers.log | tail -20
M=lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sectors_op_red.sum
for c in "sparse d128/q16384/k16384/causal+window1024" "llm d128/s8192/causal" "llm llm/d128/s8192"; do set -- $c
  timeout 120 ncu --kernel-name regex:dmattn_bwd_sm90 --launch-skip 2 --launch-count 1 --metrics $M $here/bin/dmattn-bench --out /tmp/n --groups $1 --only $2 --impls dmattn --reps 1 > $OUT/ncu-$(echo $2 | tr '/+' '__').log 2>&1
  echo "== ncu $2"; grep -E "dmattn_bwd|lts__|dram__|gpu__time|gmma" $OUT/ncu-$(echo $2 | tr '/+' '__').log | head -10
done
