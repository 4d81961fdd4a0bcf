# Call 4 (H100): the backward's buffer check now reads a key-side mask left as bytes: gpu_varlen's
# key-side layouts (a decoding batch's backward among them), gpu_interop, the strided-mask test.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=220 run gpu_varlen varlen_masks_in_every_layout > $OUT/t-1.txt 2>&1 &
T=220 run gpu_interop > $OUT/t-2.txt 2>&1 &
T=220 run gpu_decode strided_key_side each_decode_kernel > $OUT/t-3.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
cd $OUT && tar czf logs.tgz *.log t-*.txt && rm -f *.log t-*.txt
