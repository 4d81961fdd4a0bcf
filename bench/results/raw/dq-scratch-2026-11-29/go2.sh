# Call 2 (dq-scratch): gpu_varlen and gpu_sparse in full, and, alongside, memcheck and racecheck
# on small backward cases (split, packed, gathered, sparse, dense).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
T=420 run gpu_varlen > /tmp/t-1.txt 2>&1 &
T=420 run gpu_sparse > /tmp/t-2.txt 2>&1 &
(for t in "gpu_backward split_query_backward" "gpu_backward backward_matches" "gpu_varlen varlen_backward_matches" "gpu_gather gather_backward_matches" "gpu_sparse sparse_backward_matches"; do
  SC=2 T=120 san $t
done > /tmp/t-3.txt 2>&1) &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
tar czf $R/logs.tgz /tmp/L 2>/dev/null; ls $R
