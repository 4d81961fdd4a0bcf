# Call 2: the d64-transposed build (N) with cuDNN in the same run over the llm rows, then every
# kernel of one backward call timed under ncu (clocks not locked), dmattn and cuDNN, for d128
# causal 8K, d128 dense 8K and d64 dense 8K.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
N=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s16384/dense,d128/s8192/causal,d128/s16384/causal,d64/s4096/dense,d64/s8192/dense,d64/s16384/dense,d64/s8192/causal,d64/s16384/causal"
s=$(date +%s); timeout 150 $N --out /tmp/D --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-N.log 2>&1; echo "bench rc=$? $(( $(date +%s) - s ))s" | tee $R/steps.txt
s=$(date +%s); timeout 200 python3 .gpu-pack/peers.py --cases /tmp/D/cases.json --out /tmp/D/peers.json --impls sdpa-cudnn > $OUT/peers.log 2>&1; echo "peers rc=$? $(( $(date +%s) - s ))s" | tee -a $R/steps.txt
cp /tmp/D/*.json $R/
M=gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_elapsed.avg
for c in d128-s8192-causal d128-s8192-dense d64-s8192-dense; do
  s=$(date +%s); timeout 60 ncu --clock-control none --metrics $M --csv --log-file $R/ncu-dmattn-$c.csv $N --cases .gpu-pack/cc/cc-$c/cases.json --out /tmp/n-$c --impls dmattn --reps 1 > $OUT/ncu-dmattn-$c.log 2>&1; echo "ncu dmattn $c rc=$? $(( $(date +%s) - s ))s" | tee -a $R/steps.txt
  s=$(date +%s); timeout 90 ncu --clock-control none --metrics $M --csv --log-file $R/ncu-cudnn-$c.csv python3 .gpu-pack/peers.py --cases .gpu-pack/cc/cc-$c/cases.json --out /tmp/p-$c.json --impls sdpa-cudnn > $OUT/ncu-cudnn-$c.log 2>&1; echo "ncu cudnn $c rc=$? $(( $(date +%s) - s ))s" | tee -a $R/steps.txt
done
gzip $R/ncu-*.csv
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
