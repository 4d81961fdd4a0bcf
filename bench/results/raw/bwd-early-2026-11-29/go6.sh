# Call 6: dQ's accumulator rows found before dQ's product is waited for (Q; every Hopper backward
# kernel but d128's bias and softcap ones), against the landed build (F, call 4's), alternating
# twice; then gpu_backward on 500 cases a property (the device budget's end).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
F=$(bench_at .gpu-pack/bench-F.xz); Q=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/dense,d128/s8192/causal,d64/s8192/dense,d64/s8192/causal,d64/s8192/blocks128x50%+bias"
for r in 1 2; do for pair in F=$F Q=$Q; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 60 $b --out /tmp/ab-$n-$r --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z-]+/' $OUT/bench-F-1.log | awk '{print $1}' > $R/case-ids.txt
DMATTN_GPU_CASES=500 T=100 run gpu_backward | tee $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls $R
