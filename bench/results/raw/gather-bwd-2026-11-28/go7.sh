# Call 8 (ab-blocks-bias-call8.txt) ran the same A/B inline with 612d1cc's bench too (main, c3, new).
# Call 7: the bias variants' other path (a bias with a query dimension, not summed over the walk)
# after the restructuring (`Step::ds_of`, `WarpScores::visible_bits`): main (8edbb36) against
# 56823f4, alternating twice, on the LLM blocks + bias rows (b2 h32 hk8 8K, d128 and d64).
source .gpu-pack/lib.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
H=$(bench_at .gpu-pack/bench-main.xz); B=.gpu-pack/bin/dmattn-bench
for r in 1 2; do for pair in main=$H new=$B; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 90 $b --out /tmp/ab-$n-$r --groups llm --only "d128/s8192/blocks128x50%+bias,d64/s8192/blocks128x50%+bias" --impls dmattn --reps 10 > /tmp/ab-$n-$r.log 2>&1
  echo "$n #$r rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' /tmp/ab-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $OUT/ab.txt
