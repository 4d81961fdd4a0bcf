# Call 7 (H200): the final build (bias heads first at d128 only; a longer shared-bias case):
# gpu_forward and gpu_sparse.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=220 run gpu_forward > $OUT/t-1.txt 2>&1 &
T=220 run gpu_sparse > $OUT/t-2.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
grep -E "shared_bias_heads_first" $OUT/gpu_forward.log | head -3
cd $OUT && tar czf logs.tgz *.log t-*.txt && rm -f *.log t-*.txt
