# Call 2: L3, the build to land: L2 (commit 773d724: E4 + D of call 1 on main, a quarter of
# d64's 128-row tile's exponentials by exp2_poly, dS's scale folded into dP - delta without a
# bias or softcap, not in the modifier kernels) plus P's logits less the row's LSE as one FMA
# without a softcap (Step::scores_to_p, WarpScores::logits_less): gpu_backward, gpu_gather,
# gpu_varlen, gpu_sparse; memcheck and racecheck on 10 backward_matches_reference cases; then
# F (main a8cc8de), L2 and L3 alternating twice.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
T=300 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=380 run gpu_gather > /tmp/t-2.txt 2>&1 &
T=380 run gpu_varlen > /tmp/t-3.txt 2>&1 &
T=300 run gpu_sparse > /tmp/t-4.txt 2>&1 &
(SC=10 T=150 san gpu_backward backward_matches_reference --exact > /tmp/t-5.txt 2>&1) &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
F=$(bench_at .gpu-pack/bench-F.xz); L2=$(bench_at .gpu-pack/bench-L2.xz); L3=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/dense,d128/s8192/causal,d128/s8192/blocks128x50%+bias,d64/s4096/dense,d64/s8192/dense,d64/s8192/causal,d64/s8192/blocks128x50%,d64/s8192/blocks128x50%+bias,d64/s16384/dense,dma-train/q16384/k"
for r in 1 2; do for pair in F=$F L2=$L2 L3=$L3; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 100 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls $R
