source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
B=$here/bin/dmattn-bench
ONLY="llm/d128/s8192/blocks128x50%,bcsr128x50%,bitset128x50%,compress4,dma-train/q8192"
for r in 1 2; do
for p in plan 0 1; do
  if [ $p = plan ]; then $B --out /tmp/p$p --groups llm,sparse,dma-train --only "$ONLY" --impls dmattn > $OUT/pl-$p-$r.log 2>&1
  else DMATTN_BENCH_BWD_PLACED=$p $B --out /tmp/p$p --groups llm,sparse,dma-train --only "$ONLY" --impls dmattn > $OUT/pl-$p-$r.log 2>&1; fi
  echo "$p/$r: $(grep -E ' bwd ' $OUT/pl-$p-$r.log | awk '{print $3}' | tr '\n' ' ')"
done; done
grep -E "^(llm|sparse|dma)" $OUT/pl-plan-1.log
M=lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
for p in 0 1; do
DMATTN_BENCH_BWD_PLACED=$p timeout 120 ncu --kernel-name regex:dmattn_bwd_sm90 --launch-skip 2 --launch-count 1 --metrics $M $B --out /tmp/n --groups sparse --only bcsr128x50% --impls dmattn --reps 1 > $OUT/ncu-bcsr-p$p.log 2>&1
echo "ncu P=$p"; grep -E "dmattn_bwd|lts__|dram__|gpu__time" $OUT/ncu-bcsr-p$p.log | head -6
done
