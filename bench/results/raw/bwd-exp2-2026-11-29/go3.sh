# Call 3: L4, the landed build (L3 with the logit's fused LSE at d64 only: the f16 d128 bias
# kernel spilled 4 bytes with it): dense and causal, d128 and d64, 4K-16K, forward and
# backward, with cuDNN in the same run; then gpu_backward, gpu_sparse, gpu_smoke.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
REP="s4096/dense,s8192/dense,s16384/dense,s4096/causal,s8192/causal,s16384/causal"
s=$(date +%s); timeout 150 $B --out /tmp/run --groups llm,llm-d64 --only "$REP" --impls dmattn --reps 10 > $OUT/bench-report.log 2>&1; echo "report rc=$? $(( $(date +%s) - s ))s"
s=$(date +%s); timeout 150 python3 .gpu-pack/peers.py --cases /tmp/run/cases.json --out /tmp/run/peers.json --impls sdpa-cudnn > $OUT/peers.log 2>&1; echo "peers rc=$? $(( $(date +%s) - s ))s"
T=220 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=220 run gpu_sparse > /tmp/t-2.txt 2>&1 &
T=220 run gpu_smoke > /tmp/t-3.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
cd /tmp && tar czf $R/run.tgz run L 2>/dev/null; ls $R
