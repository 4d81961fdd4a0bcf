# Call 5: the suites the persistent change touches beyond gpu_forward/gpu_sparse: gpu_interop
# (CUDA graph replay of a lean d128 causal call: the tile counter zeroed again on each replay)
# and gpu_varlen's packed and paged lean forwards (their barriers moved).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
T=200 run gpu_interop > /tmp/t-1.txt 2>&1 &
T=200 run gpu_varlen lean_packed_forward paged_forward_matches > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
