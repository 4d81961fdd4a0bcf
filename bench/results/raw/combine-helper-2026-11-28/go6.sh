# Call 6: the split-KV combine kernels' weighted accumulation as one helper (`add_weighted`;
# the sm_80 PTX of dmattn_fwd_combine_{bf16,f16} and dmattn_combine_rows_bf16 changed, block
# order only). The decoding and forward suites (split-KV calls combine) in parallel.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=280 run gpu_decode > $OUT/t-1.txt 2>&1 &
T=280 run gpu_forward > $OUT/t-2.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
