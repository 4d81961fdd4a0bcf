# Call 2: the blocked dQ build (6622e0c's kernels): the gathered backward's query chunks again
# (2 / 4 / 8 / 16, DMATTN_BENCH_GATHER_CHUNKS; the plan picks 4), then gpu_varlen and gpu_sparse,
# then memcheck and racecheck on small backward cases (split, packed, gathered, sparse).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
for c in 4 2 8 16 4; do
  DMATTN_BENCH_GATHER_CHUNKS=$c timeout 100 $B --out /tmp/ch-$c --groups gather --only "d128/q8192,d128/q32768,d64/q32768" --impls dmattn --reps 10 > /tmp/bench-ch-$c.log 2>&1
  echo "chunks $c rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' /tmp/bench-ch-$c.log | awk '{print $2, $3}' | tr '\n' ' ')"
done | tee $R/chunks.txt
T=400 run gpu_varlen > /tmp/t-1.txt 2>&1 &
T=400 run gpu_sparse > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
for t in "gpu_backward split_query_backward" "gpu_varlen varlen_backward_matches" "gpu_gather gather_backward_matches" "gpu_sparse sparse_backward_matches"; do
  SC=2 T=150 san $t
done | tee $R/san.txt
tar czf $R/logs.tgz /tmp/bench-*.log /tmp/L 2>/dev/null; ls $R
