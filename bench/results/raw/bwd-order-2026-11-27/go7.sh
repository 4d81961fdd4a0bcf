source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
T=450 run gpu_backward &
T=450 run gpu_sparse &
T=450 run gpu_gather &
wait
SC=4 T=200 san gpu_backward placed_backward
