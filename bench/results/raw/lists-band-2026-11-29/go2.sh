# Call 2: window-shaped lists prepared as their band (2a93708). The bench alone first (indices
# and gather groups at 32K: window lists now a band, against the key-side path); then the full
# gpu_gather (window_lists_prepare_as_their_band: 2,000 cases) beside memcheck/racecheck on six of
# its cases (dmattn_indices_row_bits summing rows up, the band kernels after it).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
D=$R/bench; mkdir -p $D
timeout 130 .gpu-pack/bin/dmattn-bench --out $D --groups indices,gather --only "q32768/k32768" --impls dmattn > $R/bench.log 2>&1; echo "bench rc=$?"
grep -E "^(indices|gather)/|^  dmattn" $R/bench.log | head -40
T=480 run gpu_gather > /tmp/t-1.txt 2>&1 &
(SC=6 T=480 san gpu_gather window_lists) > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
cp $OUT/*.log $R/ 2>/dev/null; true
