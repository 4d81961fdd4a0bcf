# Call 5: P8, the build to land (one n8 key tile in 8 by exp2_poly): dense and causal, d128 and
# d64, 4K-16K, with cuDNN in the same run; then P8, L4 (a tile in 4, commit 2ad4550), P16 (a
# tile in 16) and P0 (none) alternating twice on the d64 rows; then P8's gpu_backward and
# gpu_sparse.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
REP="s4096/dense,s8192/dense,s16384/dense,s4096/causal,s8192/causal,s16384/causal"
s=$(date +%s); timeout 70 $B --out /tmp/run --groups llm,llm-d64 --only "$REP" --impls dmattn --reps 10 > $OUT/bench-report.log 2>&1; echo "report rc=$? $(( $(date +%s) - s ))s"
s=$(date +%s); timeout 70 python3 .gpu-pack/peers.py --cases /tmp/run/cases.json --out /tmp/run/peers.json --impls sdpa-cudnn > $OUT/peers.log 2>&1; echo "peers rc=$? $(( $(date +%s) - s ))s"
L4=$(bench_at .gpu-pack/bench-L4.xz); P16=$(bench_at .gpu-pack/bench-P16.xz); P0=$(bench_at .gpu-pack/bench-P0.xz)
ONLY="d64/s4096/dense,d64/s8192/dense,d64/s8192/causal,d64/s8192/blocks128x50%,d64/s16384/dense"
for r in 1 2; do for pair in P8=$B L4=$L4 P16=$P16 P0=$P0; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 40 $b --out /tmp/ab-$n-$r --groups llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
T=170 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=170 run gpu_sparse > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
cd /tmp && tar czf $R/run.tgz run L 2>/dev/null; ls $R
