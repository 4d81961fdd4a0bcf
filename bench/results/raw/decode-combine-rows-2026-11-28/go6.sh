# Call 6 (H200): the review's follow-ups: a fixed-length decoding call's mask through a strided
# and an expanded view, two deterministic backwards of one decoding forward, and the paged-mask
# error checked before any mask is prepared; with the decoding kernel tests.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=200 run gpu_decode fixed_key_side_mask_views paged_masks_outside strided_key_side each_decode_kernel | tee $OUT/tests.txt
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
