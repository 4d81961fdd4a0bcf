# Call 1: main against the two decoding branches (masked decode batch, alternating twice), then
# every kernel of the masked paged call under ncu at the GPU's own clocks and warm caches, to
# see what lies outside the decoding kernel.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
ab 2 keyfrac main=$here/bin/dmattn-bench late=$(bench_at $here/bench-wip-bias-late.xz) lookup=$(bench_at $here/bench-wip-lookup-in-copies.xz)
B=$here/bin/dmattn-bench
for c in "paged256" "bias"; do
  timeout 120 ncu --clock-control none --cache-control none --launch-skip 8 --launch-count 8 --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum $B --out /tmp/ncu --groups varlen --only "keyfrac10%+varlen64+$c" --reps 3 --impls dmattn > $OUT/ncu-$c.csv 2>/tmp/ncu-$c.err; echo "ncu $c rc=$?"
done
cd $OUT && tar czf logs.tgz bench-*.log && rm -f bench-*.log
