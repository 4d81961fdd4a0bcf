# Call 1: the persistent lean forward. Its property test (2000 cases through 1-5 CTAs) and
# gpu_forward side by side; memcheck and racecheck on a few persistent cases; then one A/B
# round against main's bench (6ee769f, bench-main.xz) on the lean rows: dense and causal 1K and
# 8K (d128, d64), compressed causal (and its dense-mask form, not run by this kernel), causal
# window 1024 at 16K.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
T=300 run gpu_sparse persistent_lean > /tmp/t-1.txt 2>&1 &
T=300 run gpu_forward > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
SC=3 T=150 san gpu_sparse persistent_lean | tee $R/san.txt
B=.gpu-pack/bin/dmattn-bench
M=$(bench_at .gpu-pack/bench-main.xz)
ONLY="s1024/dense,s1024/causal,s8192/dense,s8192/causal,compress,q16384/k16384/causal+window"
for r in 1; do for pair in main=$M persistent=$B; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 150 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,sparse --only "$ONLY" --impls dmattn --reps 10 > /tmp/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$?: $(grep -E '^(llm|sparse)/|^  dmattn +(fwd|bwd)' /tmp/bench-$n-$r.log | awk '/^(llm|sparse)/{printf "\n%s ", $1} /dmattn/{printf "%s %s ", $2, $3}')"
done; done | tee $R/ab.txt
cp /tmp/bench-*.log $R/ 2>/dev/null; cp $OUT/*.log $R/ 2>/dev/null; true
