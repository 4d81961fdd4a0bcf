# Call 3: L (the build to land) and M (main cd3f900) alternating twice, backward and forward ms;
# then L's dense and causal rows, d128 and d64, 4K-16K, with cuDNN in the same run.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
M=$(bench_at .gpu-pack/bench-M.xz); L=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/dense,d128/s8192/causal,d128/s8192/blocks128x50%+bias,d64/s4096/dense,d64/s8192/dense,d64/s16384/dense,d64/s8192/causal,d64/s8192/blocks128x50%,d64/s8192/blocks128x50%+bias,d64/q32768,d128/q8192,dma-train/q16384/k"
for r in 1 2; do for pair in M=$M L=$L; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 80 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,gather,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-M-1.log | awk '{print $1}' > $R/case-ids.txt
REP="s4096/dense,s8192/dense,s16384/dense,s4096/causal,s8192/causal,s16384/causal"
s=$(date +%s); timeout 70 $L --out /tmp/run --groups llm,llm-d64 --only "$REP" --impls dmattn --reps 10 > $OUT/bench-report.log 2>&1; echo "report rc=$? $(( $(date +%s) - s ))s"
s=$(date +%s); timeout 70 python3 .gpu-pack/peers.py --cases /tmp/run/cases.json --out /tmp/run/peers.json --impls sdpa-cudnn > $OUT/peers.log 2>&1; echo "peers rc=$? $(( $(date +%s) - s ))s"
cd /tmp && tar czf $R/run.tgz run L 2>/dev/null; ls $R
