# Call 1: the d64 bias calls on the warp-specialised modifier kernel (A), and with the bias added
# after the scores' product instead of as its start values (B, A's kernels plus that), against
# main (f105ea2), builds alternating twice; then FlexAttention on B's cases (the same run).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
M=$(bench_at .gpu-pack/bench-base.xz); A=$(bench_at .gpu-pack/bench-A.xz)
ONLY="s1024/blocks128x50%,s4096/blocks128x50%+bias,s8192/blocks128x50%+bias,s16384/blocks128x50%+bias,dma-train/q1024/k,dma-train/q4096/k,dma-train/q16384/k"
for r in 1 2; do for pair in main=$M A=$A B=$B; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 100 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > /tmp/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$?: $(grep -E '^(llm|dma-train)/|^  dmattn +(fwd|bwd)' /tmp/bench-$n-$r.log | awk '/^(llm|dma)/{printf "\n%s ", $1} /dmattn/{printf "%s %s ", $2, $3}')"
done; done | tee $R/ab.txt
mkdir -p $R/run; cp /tmp/ab-B-2/*.json $R/run/
timeout 150 python3 .gpu-pack/peers.py --cases /tmp/ab-B-2/cases.json --out $R/run/peers.json --impls flex > $R/peers.log 2>&1; echo "peers rc=$?"
tar czf $R/logs.tgz -C /tmp $(cd /tmp && ls -d bench-*.log) 2>/dev/null; true
