# Call 7 (review): dQ's conversions take dq's own strides in both paths (the Hopper one through
# `broadcast_view`, the portable one converting flat and copying rows into a strided view), so
# the gathered backward no longer plans the inner call twice to choose. Fewer property cases
# (device time left): gpu_backward, gpu_varlen and gpu_gather's backward tests, in parallel.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
DMATTN_GPU_CASES=200 T=170 run gpu_backward > /tmp/t-1.txt 2>&1 &
DMATTN_GPU_CASES=200 T=170 run gpu_gather backward > /tmp/t-2.txt 2>&1 &
DMATTN_GPU_CASES=100 T=170 run gpu_varlen backward > /tmp/t-3.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
