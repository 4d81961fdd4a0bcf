# Call 1: builds alternating twice, forward and backward ms: M (main cd3f900), S (the parameter
# copy read with ld.shared: ../shared-params-2026-11-27/shared-params.diff), D (each Hopper step's
# dQ reductions deferred to the next step, issued while its S and dP compute: dq-deferred.diff),
# SD (both), DC (D's reductions issued before the step's S and dP instead, after its copies:
# dq-deferred-early.diff against D). Then D's gpu_backward.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
M=$(bench_at .gpu-pack/bench-M.xz); S=$(bench_at .gpu-pack/bench-S.xz); SD=$(bench_at .gpu-pack/bench-SD.xz); DC=$(bench_at .gpu-pack/bench-DC.xz); D=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/dense,d128/s8192/causal,d128/s8192/blocks128x50%+bias,d64/s4096/dense,d64/s8192/dense,d64/s8192/causal,d64/s8192/blocks128x50%+bias,d64/q32768,d128/q8192,dma-train/q16384/k"
for r in 1 2; do for pair in M=$M S=$S D=$D SD=$SD DC=$DC; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 80 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,gather,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-M-1.log | awk '{print $1}' > $R/case-ids.txt
T=200 run gpu_backward | tee $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls $R
