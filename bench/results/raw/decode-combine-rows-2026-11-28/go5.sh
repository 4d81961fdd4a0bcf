# Call 5 (H200): the routing over Flash-DMA's decoding grid: one query over 256-512K keys with a
# top-1024 mask (dma-infer), and over 512K keys with top-32..8192 (dma-infer-window), main
# (gather attention) against this build (the decoding kernel reading the mask's bytes), twice.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
G=dma-infer,dma-infer-window T=120 ab 2 q1/ main=$(bench_at $here/bench-main.xz) new=$here/bin/dmattn-bench
grep -h -E "^(dma|  dmattn)" /tmp/ab-new-1/*.log 2>/dev/null | head -2
cd $OUT && grep -h -B3 "^  dmattn" bench-new-1.log | grep -E "^[a-z]" > ids.txt; tar czf logs.tgz *.log && rm -f *.log
