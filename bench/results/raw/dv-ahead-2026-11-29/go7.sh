# Call 7: the landed build (F: call 6's spills fixed by keeping the checked copies where every
# thread copies): gpu_smoke (no kernel using local memory on this GPU), G and F alternating
# twice on three rows, then gpu_forward as far as the budget goes.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
T=60 run gpu_smoke | tee $R/tests.txt
G=$(bench_at .gpu-pack/bench-G.xz); F=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/blocks128x50%+bias,d64/s8192/blocks128x50%+bias,dma-train/q16384/k"
for r in 1 2; do for pair in G=$G F=$F; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 60 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
T=150 run gpu_forward | tee -a $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls $R
