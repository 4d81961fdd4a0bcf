source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for b in gpu_forward gpu_decode gpu_select gpu_smoke gpu_materialized readme gpu_interop; do T=400 run $b & done
wait
