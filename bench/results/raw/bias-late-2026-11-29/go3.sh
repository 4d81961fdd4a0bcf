# Call 3: the build to land (F: the bias added after the scores' product in the warp-specialised
# modifier kernel; d64 keeps its two-CTA modifier kernel). The forward, sparse, decoding and
# interop suites; memcheck and racecheck on the modifier kernels; then the blocks + bias rows
# with FlexAttention in the same run.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
T=200 run gpu_forward > /tmp/t-1.txt 2>&1 &
T=200 run gpu_sparse > /tmp/t-2.txt 2>&1 &
wait
T=150 run gpu_decode > /tmp/t-3.txt 2>&1 &
T=150 run gpu_interop > /tmp/t-4.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
SC=3 T=120 san gpu_forward each_forward_kernel | tee $R/san.txt
SC=3 T=100 san gpu_forward shared_bias | tee -a $R/san.txt
B=.gpu-pack/bin/dmattn-bench
timeout 120 $B --out $R/run --groups llm,llm-d64 --only "s4096/blocks128x50%,s8192/blocks128x50%,s16384/blocks128x50%" --impls dmattn --reps 10 > $R/bench.log 2>&1; echo "bench rc=$?"
timeout 150 python3 .gpu-pack/peers.py --cases $R/run/cases.json --out $R/run/peers.json --impls flex > $R/peers.log 2>&1; echo "peers rc=$?"
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; true
