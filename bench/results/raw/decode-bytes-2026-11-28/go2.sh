# Call 2 (H100): the decoding kernel reading a packed batch's key-side bool mask as bytes (no
# pack launch), on top of wip-bias-late: gpu_decode and gpu_varlen whole, memcheck/racecheck of
# the decoding kernels, then the masked decode batch, late (fdb7a74) against this build, twice;
# then the new call's kernels under ncu (GPU clocks, warm caches) and its host time per call.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=300 run gpu_decode > $OUT/t-1.txt 2>&1 &
T=330 run gpu_varlen > $OUT/t-2.txt 2>&1 &
(SC=4 T=150 san gpu_decode each_decode_kernel; SC=3 T=100 san gpu_decode strided_key_side) > $OUT/t-3.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
ab 2 keyfrac late=$(bench_at $here/bench-late.xz) bytes=$here/bin/dmattn-bench
B=$here/bin/dmattn-bench
timeout 100 ncu --clock-control none --cache-control none --launch-skip 6 --launch-count 6 --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum $B --out /tmp/ncu --groups varlen --only "keyfrac10%+varlen64+paged256" --reps 3 --impls dmattn > $OUT/ncu-paged256.csv 2>/tmp/ncu.err; echo "ncu rc=$?"
DMATTN_BENCH_HOST=1 timeout 100 $B --out /tmp/h --groups varlen --only "keyfrac10%+varlen64+paged256" --impls dmattn > /tmp/host.out 2> $OUT/host.log; echo "host rc=$?"; grep -E '^  dmattn' /tmp/host.out
cd $OUT && tar czf logs.tgz *.log t-*.txt && rm -f *.log t-*.txt
