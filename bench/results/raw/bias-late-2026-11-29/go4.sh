# Call 4: the build to land (G: F plus d64's warp-specialised modifier kernel, `_mods_ws`, for
# fixed-length calls over 16 key tiles or more; the two-CTA kernel keeps the shorter ones).
# gpu_forward (its modifier property test forces either d64 kernel), memcheck and racecheck on
# each forward kernel and the shared-bias cases; F (call 3's build) once on the d64 rows, then
# G on the blocks + bias and Flash-DMA training rows with FlexAttention in the same run.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
T=200 run gpu_forward | tee $R/tests.txt
SC=3 T=120 san gpu_forward each_forward_kernel | tee $R/san.txt
SC=3 T=100 san gpu_forward shared_bias | tee -a $R/san.txt
F=$(bench_at .gpu-pack/bench-F.xz); G=.gpu-pack/bin/dmattn-bench
ONLY="s1024/blocks128x50%+bias,s4096/blocks128x50%+bias,s8192/blocks128x50%+bias,s16384/blocks128x50%+bias,dma-train/q1024/k,dma-train/q4096/k,dma-train/q16384/k"
timeout 100 $F --out /tmp/F --groups llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-F.log 2>&1; echo "F rc=$?"
timeout 120 $G --out /tmp/G --groups llm,llm-d64,dma-train --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-G.log 2>&1; echo "G rc=$?"
timeout 150 python3 .gpu-pack/peers.py --cases /tmp/G/cases.json --out /tmp/G/peers.json --impls flex > $OUT/peers.log 2>&1; echo "peers rc=$?"
grep -E '^(llm|dma-train)/|^  dmattn +fwd' $OUT/bench-F.log $OUT/bench-G.log | awk '{print}' > $R/fwd.txt
cd /tmp && tar czf $R/logs.tgz L F G 2>/dev/null; true
