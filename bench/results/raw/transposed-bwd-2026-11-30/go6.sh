# Call 6: the landed form (F: T6 in the d128 kernels without a band or split; band and split
# kernels keep the row-major step): gpu_backward (with the new 2,000-case lean d128 test),
# gpu_sparse, gpu_varlen's and gpu_gather's backward tests, in parallel; memcheck / racecheck on
# the small lean cases; then F against main (C) alternating twice, and cuDNN on F's cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
(T=300 run gpu_backward > $R/t-backward.txt 2>&1) &
(T=250 run gpu_sparse > $R/t-sparse.txt 2>&1) &
(T=250 run gpu_varlen backward > $R/t-varlen.txt 2>&1) &
(T=250 run gpu_gather backward > $R/t-gather.txt 2>&1) &
wait
cat $R/t-*.txt
SC=2 T=80 san gpu_backward lean_d128_small | tee $R/san.txt
C=$(bench_at .gpu-pack/bench-C.xz); F=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d128/s8192/causal,d128/s16384/causal,sparse/d128/q16384/k16384/causal+window1024,d64/s8192/dense"
for r in 1 2; do for pair in C=$C F=$F; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 60 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,sparse --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-C-1.log | awk '{print $1}' > $R/case-ids.txt
timeout 90 python3 .gpu-pack/peers.py --cases /tmp/ab-F-1/cases.json --out /tmp/ab-F-1/peers.json --impls sdpa-cudnn > $OUT/peers.log 2>&1; echo "peers rc=$?"
cp /tmp/ab-F-1/*.json $R/ 2>/dev/null
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
