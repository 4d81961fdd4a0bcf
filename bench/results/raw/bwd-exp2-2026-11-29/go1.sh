# Call 1: builds alternating twice, backward and forward ms: F (main a8cc8de), T (the copy-path
# twins folded: SmemTile::load_async_with, keeps_columns), E4 / E2 (T plus a quarter / half of
# d64's 128-row tile's exponentials on the FMA pipe, exp2_poly), E4all (a quarter on every
# Hopper tile that keeps P), D (T plus dS's scale folded into dP - delta, no bias or softcap).
# E2: POLY_PERIOD 2; E4all: the test `keep != KeptP::No` instead of `keep == KeptP::Packed`.
# T is twins-T.diff against main; E4 and D are the landed commit's two changes, each on T.
# Then T's gpu_backward, gpu_sparse, gpu_smoke.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
F=$(bench_at .gpu-pack/bench-F.xz); E4=$(bench_at .gpu-pack/bench-E4.xz); E2=$(bench_at .gpu-pack/bench-E2.xz)
EA=$(bench_at .gpu-pack/bench-E4all.xz); D=$(bench_at .gpu-pack/bench-D.xz); T=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/dense,d128/s8192/causal,d128/s8192/blocks128x50%+bias,d64/s4096/dense,d64/s8192/dense,d64/s8192/causal,d64/s8192/blocks128x50%,d64/s8192/blocks128x50%+bias,d64/s16384/dense,dma-train/q16384/k"
for r in 1 2; do for pair in F=$F T=$T E4=$E4 E2=$E2 EA=$EA D=$D; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 120 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z-]+/' $OUT/bench-F-1.log | awk '{print $1}' > $R/case-ids.txt
T=260 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=260 run gpu_sparse > /tmp/t-2.txt 2>&1 &
T=260 run gpu_smoke > /tmp/t-3.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls $R
