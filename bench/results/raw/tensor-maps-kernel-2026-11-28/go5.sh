# Call 5: a packed batch's forward captured on SeqLens whose work order is not built yet (the
# capture runs the grid's order); gpu_interop whole, and packed forwards (the order's eager path)
# in parallel.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=150 run gpu_interop > $OUT/t-interop.txt 2>&1 &
DMATTN_GPU_CASES=400 T=150 run gpu_varlen varlen_forward_matches_reference > $OUT/t-varlen.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
