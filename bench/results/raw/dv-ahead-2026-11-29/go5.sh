# Call 5: the build to land (Z of call 4: whole-tile copies without bounds tests; wgmma descriptors
# as one conversion a product plus a constant a k-step) against G (main eb43c39), alternating twice;
# then F on the blocks + bias and Flash-DMA training rows with FlexAttention in the same run.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
G=$(bench_at .gpu-pack/bench-G.xz); F=.gpu-pack/bin/dmattn-bench  # Z
ONLY="d128/s8192/dense,d128/s8192/causal,d128/s8192/blocks128x50%,d64/s8192/dense,d64/s8192/blocks128x50%+bias,d64/s16384/blocks128x50%+bias,dma-train/q16384/k"
for r in 1 2; do for pair in G=$G F=$F; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 150 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z-]+/' $OUT/bench-G-1.log | awk '{print $1}' > $R/case-ids.txt
REP="s4096/blocks128x50%+bias,s8192/blocks128x50%+bias,s16384/blocks128x50%+bias,dma-train/q16384/k"
timeout 120 $F --out /tmp/run --groups llm,llm-d64,dma-train --only "$REP" --impls dmattn --reps 10 > $OUT/bench-report.log 2>&1; echo "report rc=$?"
timeout 200 python3 .gpu-pack/peers.py --cases /tmp/run/cases.json --out /tmp/run/peers.json --impls flex > $OUT/peers.log 2>&1; echo "peers rc=$?"
cd /tmp && tar czf $R/run.tgz run L 2>/dev/null; ls $R
