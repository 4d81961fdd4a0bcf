# Call 6: SeqLens::from_tensors copies the caller's cu_seqlens (refilled in place afterwards,
# nothing changes); the device-tensor tests of gpu_varlen.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=100 run gpu_varlen from_device_tensor 2>&1 | tee $OUT/tests.txt
