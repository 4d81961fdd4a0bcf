# Call 5: the landed build (47ccb82) with cuDNN in the same run over the llm and llm-d64
# groups (dense and causal, 4K-16K); then gpu_backward, gpu_sparse and gpu_varlen's backward tests in parallel, and
# memcheck/racecheck on lean_small.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
N=.gpu-pack/bin/dmattn-bench
s=$(date +%s); timeout 150 $N --out /tmp/D --groups llm,llm-d64 --only "s4096/dense,s4096/causal,s8192/dense,s8192/causal,s16384/dense,s16384/causal" --impls dmattn --reps 10 > $OUT/bench.log 2>&1; echo "bench rc=$? $(( $(date +%s) - s ))s" > $OUT/steps.txt
s=$(date +%s); timeout 200 python3 .gpu-pack/peers.py --cases /tmp/D/cases.json --out /tmp/D/peers.json --impls sdpa-cudnn > $OUT/peers.log 2>&1; echo "peers rc=$? $(( $(date +%s) - s ))s" >> $OUT/steps.txt
( T=330 run gpu_varlen backward > $OUT/t-varlen.txt 2>&1 ) &
( T=330 run gpu_sparse > $OUT/t-sparse.txt 2>&1 ) &
T=330 run gpu_backward > $OUT/t-backward.txt 2>&1
wait
T=90 san gpu_backward lean_small > $OUT/t-san.txt 2>&1
cat $OUT/steps.txt $OUT/t-*.txt > $R/tests.txt; cat $R/tests.txt
cp /tmp/D/cases.json /tmp/D/dmattn.json /tmp/D/peers.json $R/
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
