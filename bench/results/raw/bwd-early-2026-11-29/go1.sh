# Call 1: the Hopper backward's first products issued before the next stage's copies are set up
# (d64 and d128 without a bias), and the d64 128-row tile's P kept in registers as bf16 pairs
# (N), against main 2b6259a (H), builds alternating twice; then N with cuDNN on the dense rows
# in one run; then gpu_backward and gpu_sparse.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
H=$(bench_at .gpu-pack/bench-H.xz); N=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/dense,d128/s8192/causal,d128/s8192/blocks128x50%+bias,d64/s8192/dense,d64/s8192/causal,d64/s8192/blocks128x50%+bias,dma-train/q16384/k"
for r in 1 2; do for pair in H=$H N=$N; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 120 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z-]+/' $OUT/bench-H-1.log | awk '{print $1}' > $R/case-ids.txt
REP="s4096/dense,s8192/dense,s16384/dense"
s=$(date +%s); timeout 120 $N --out /tmp/run --groups llm,llm-d64 --only "$REP" --impls dmattn --reps 10 > $OUT/bench-report.log 2>&1; echo "report rc=$? $(( $(date +%s) - s ))s"
s=$(date +%s); timeout 150 python3 .gpu-pack/peers.py --cases /tmp/run/cases.json --out /tmp/run/peers.json --impls sdpa-cudnn > $OUT/peers.log 2>&1; echo "peers rc=$? $(( $(date +%s) - s ))s"
T=240 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=240 run gpu_sparse > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
cd /tmp && tar czf $R/run.tgz run L 2>/dev/null; ls $R
