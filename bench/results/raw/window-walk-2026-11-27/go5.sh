source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
for r in 1 2; do
  /tmp/bench-main --out /tmp/a$r --groups sparse --only window1024 --impls dmattn > $OUT/ab-main$r.log 2>&1
  $here/bin/dmattn-bench --out /tmp/b$r --groups sparse --only window1024 --impls dmattn > $OUT/ab-new$r.log 2>&1
done
cp /tmp/b1/cases.json $OUT/cases.json
for f in $OUT/ab-*.log; do echo "$(basename $f): $(grep -E ' (fwd|bwd) ' $f | awk '{print $3}' | tr '\n' ' ')"; done
M=lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
timeout 120 ncu --kernel-name regex:dmattn_bwd_sm90 --launch-skip 2 --launch-count 1 --metrics $M $here/bin/dmattn-bench --out /tmp/n --groups sparse --only d128/q16384/k16384/causal+window1024 --impls dmattn --reps 1 > $OUT/ncu-window.log 2>&1
grep -E "dmattn_bwd|lts__|dram__|gpu__time" $OUT/ncu-window.log | head -8
PYTHONUNBUFFERED=1 timeout 240 python3 $here/peers.py --cases /tmp/b1/cases.json --out /tmp/peers.json --impls flex > $OUT/peers.log 2>&1; echo peers rc=$?
grep -E " (fwd|bwd):" $OUT/peers.log | tail -12
