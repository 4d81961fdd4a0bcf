# Call 7: after a review: the packed graph test captures before and after an eager call; the
# cu_seqlens refill waits for its copy.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=90 run gpu_interop packed_batch > $OUT/t-1.txt 2>&1 &
T=90 run gpu_varlen from_device_tensor > $OUT/t-2.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
