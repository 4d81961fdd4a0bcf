# Call 4 (H200): the rest of the GPU suite on this build (456e74c's kernels and host): gpu_varlen,
# gpu_sparse, gpu_interop, gpu_select, gpu_materialized, gpu_smoke, gpu_backward, in three lanes.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=360 run gpu_varlen > $OUT/t-1.txt 2>&1 &
(T=300 run gpu_sparse; T=120 run gpu_interop; T=60 run gpu_smoke) > $OUT/t-2.txt 2>&1 &
(T=300 run gpu_backward; T=120 run gpu_select; T=120 run gpu_materialized) > $OUT/t-3.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
cd $OUT && tar czf logs.tgz *.log t-*.txt && rm -f *.log t-*.txt
