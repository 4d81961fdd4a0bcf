# Call 3: persistence at d128 only (call 2: d64 ran slower persistent, d128 faster); d64 keeps a
# CTA a query tile on the same code. The persistent property test and gpu_forward; memcheck and
# racecheck; two A/B rounds against main (6ee769f) on call 2's rows; then the peers
# (FlexAttention, cuDNN) on this build's cases for the same-run report.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
T=240 run gpu_sparse persistent_lean > /tmp/t-1.txt 2>&1 &
T=240 run gpu_forward > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
grep -q "rc=0" /tmp/t-1.txt || exit 1
SC=3 T=90 san gpu_sparse persistent_lean | tee $R/san.txt
B=.gpu-pack/bin/dmattn-bench
M=$(bench_at .gpu-pack/bench-main.xz)
ONLY="s1024/dense,s1024/causal,s8192/dense,s8192/causal,compress,q16384/k16384/causal+window"
for r in 1 2; do for pair in main=$M persistent=$B; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 120 $b --out /tmp/ab-$n-$r --groups llm,llm-d64,sparse --only "$ONLY" --impls dmattn --reps 10 > /tmp/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$?: $(grep -E '^(llm|sparse)/|^  dmattn +(fwd|bwd)' /tmp/bench-$n-$r.log | awk '/^(llm|sparse)/{printf "\n%s ", $1} /dmattn/{printf "%s %s ", $2, $3}')"
done; done | tee $R/ab.txt
mkdir -p $R/run; cp /tmp/ab-persistent-2/*.json $R/run/
timeout 200 python3 .gpu-pack/peers.py --cases /tmp/ab-persistent-2/cases.json --out $R/run/peers.json --impls flex,sdpa-cudnn > $R/peers.log 2>&1; echo "peers rc=$?"
cp /tmp/bench-*.log $R/ 2>/dev/null; cp $OUT/*.log $R/ 2>/dev/null; true
