# Call 2: build D = B (d64 bias calls on the warp-specialised modifier kernel, the bias added after
# the scores' product) plus the running sums stored to a shared word, which keeps ptxas from
# moving the PV wait ahead of the softmax in the bias-ring kernels. Its modifier tests, memcheck
# and racecheck; then main (f105ea2), B and D alternating twice on call 1's rows.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
T=200 run gpu_forward > /tmp/t-1.txt 2>&1 &
T=200 run gpu_sparse > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
SC=3 T=120 san gpu_forward each_forward_kernel | tee $R/san.txt
SC=3 T=100 san gpu_forward shared_bias | tee -a $R/san.txt
B=.gpu-pack/bin/dmattn-bench
M=$(bench_at .gpu-pack/bench-base.xz); LB=$(bench_at .gpu-pack/bench-B.xz)
ONLY="s4096/blocks128x50%+bias,s8192/blocks128x50%+bias,s16384/blocks128x50%+bias,dma-train/q1024/k,dma-train/q16384/k"
for r in 1 2; do for pair in main=$M B=$LB D=$B; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 100 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > /tmp/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$?: $(grep -E '^(llm|dma-train)/|^  dmattn +(fwd|bwd)' /tmp/bench-$n-$r.log | awk '/^(llm|dma)/{printf "\n%s ", $1} /dmattn/{printf "%s %s ", $2, $3}')"
done; done | tee $R/ab.txt
cd /tmp && tar czf $R/logs.tgz bench-*.log L 2>/dev/null; true
