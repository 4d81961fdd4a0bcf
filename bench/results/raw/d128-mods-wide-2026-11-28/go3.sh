# Call 3: the rest of the GPU suite on this build (727fdeb's kernels): gpu_varlen, gpu_gather,
# gpu_select, gpu_smoke, gpu_materialized, the host's unit tests and the README's example.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=400 run gpu_varlen > $OUT/t-1.txt 2>&1 &
T=400 run gpu_gather > $OUT/t-2.txt 2>&1 &
T=400 run gpu_select > $OUT/t-3.txt 2>&1 &
( T=400 run gpu_smoke; T=400 run gpu_materialized; T=400 run readme; T=400 run dmattn_tests ) > $OUT/t-4.txt 2>&1 &
( s=$(date +%s); timeout 300 $here/bin/test-host-dmattn --test-threads=4 > $OUT/host.log 2>&1; echo "host-dmattn rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' $OUT/host.log | tail -n 1)" ) > $OUT/t-5.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
cd $OUT && tar czf logs.tgz *.log t-*.txt && rm -f *.log t-*.txt
# Call 4 (same pack): OUT=$OUT/peers bash .gpu-pack/run.sh bench --groups llm,llm-d64 --only "d128/s8192,d64/s8192"
