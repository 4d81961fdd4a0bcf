# Call 3: the .indices() fix and the summary's early leave on broken lists (this build). The
# bench alone first (indices group in full: random lists 32K and 64K with their dense forms,
# window lists and the band they are; the gather group's 32K rows), then the peers on the same
# cases, then gpu_gather and gpu_sparse side by side.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
D=$R/bench; mkdir -p $D
timeout 120 .gpu-pack/bin/dmattn-bench --out $D --groups indices,gather --only "q32768/k32768,q65536" > $R/bench.log 2>&1; echo "bench rc=$?"
grep -E "^(indices|gather)/|^  dmattn" $R/bench.log | head -60
timeout 150 python3 .gpu-pack/peers.py --cases $D/cases.json --out $D/peers.json --impls flex,sdpa-cudnn,fa2-kept-keys > $R/peers.log 2>&1; echo "peers rc=$?"
tail -n 3 $R/peers.log
T=330 run gpu_gather > /tmp/t-1.txt 2>&1 &
T=330 run gpu_sparse > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
cp $OUT/*.log $R/ 2>/dev/null; true
