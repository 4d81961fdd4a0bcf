# Call 4 (2026-11-30, 21st session): H (the d128 transposed step reads its rows' lse before Sᵀ's
# wait and their delta before dPᵀ's; d64 PTX reordered only) against L (main 4ec9ada), alternating twice.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
H=$(bench_at .gpu-pack/bench-H.xz); L=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s8192/causal,d128/s16384/dense,d128/s16384/causal,d64/s4096/dense,d64/s8192/dense,d64/s8192/causal,d64/s16384/dense"
for r in 1 2; do for pair in L=$L H=$H; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 100 $b --out /tmp/ab-$n --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-L-1.log | awk '{print $1}' > $R/case-ids.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
