# Call 1: main (820d17e) + the indices group's band row. The bench first (alone on the GPU): the
# window lists, their dense form and the band they are (causal, left 1023) against the key-side
# path, 32K d64; then the full gpu_gather (chunked_backward_matches_reference never ran on the
# review's dQ form) beside memcheck/racecheck on forced-chunk gathered backward cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
D=$R/bench; mkdir -p $D
timeout 130 .gpu-pack/bin/dmattn-bench --out $D --groups indices,gather --only "q32768/k32768" --impls dmattn > $R/bench.log 2>&1; echo "bench rc=$?"
grep -E "^(indices|gather)/|^  dmattn" $R/bench.log | head -40
T=420 run gpu_gather > /tmp/t-1.txt 2>&1 &
(SC=6 T=420 san gpu_gather gather_backward_matches_reference) > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
cp $OUT/*.log $R/ 2>/dev/null; true
