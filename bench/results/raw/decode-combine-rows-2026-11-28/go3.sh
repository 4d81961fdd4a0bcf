# Call 3 (H200): the combine for few rows (a CTA a row) on top of call 1's build. Tests:
# gpu_decode, gpu_forward and gpu_gather whole; memcheck/racecheck of decode_long_keys (one
# query over 200K keys: the new combine over up to 128 splits). Then the 512K decode, main
# against this build three times; the masked decode batch (old combine, refactored) twice;
# every kernel of the 512K call under ncu; its host time; the case with the peers.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=330 run gpu_decode > $OUT/t-1.txt 2>&1 &
(T=200 run gpu_forward; T=300 run gpu_gather) > $OUT/t-2.txt 2>&1 &
(SC=4 T=200 san gpu_decode decode_long_keys) > $OUT/t-3.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
M=$(bench_at $here/bench-main.xz)
G=gather ab 3 q1/ main=$M new=$here/bin/dmattn-bench
cp $OUT/ab.txt $OUT/ab-gather.txt
ab 2 keyfrac main=$M new=$here/bin/dmattn-bench
B=$here/bin/dmattn-bench
timeout 100 ncu --clock-control none --cache-control none --launch-skip 6 --launch-count 8 --csv --metrics gpu__time_duration.sum,launch__grid_size $B --out /tmp/ncu --groups gather --only q1/ --reps 3 --impls dmattn > $OUT/ncu-new.csv 2>/tmp/ncu.err; echo "ncu rc=$?"
DMATTN_BENCH_HOST=1 timeout 100 $B --out /tmp/h --groups gather --only q1/ --impls dmattn > /tmp/host.out 2> $OUT/host.log; echo "host rc=$?"; grep -E '^  dmattn' /tmp/host.out; tail -3 $OUT/host.log
mkdir -p $OUT/peers && OUT=$OUT/peers timeout 200 bash .gpu-pack/run.sh bench --groups gather --only q1/ > $OUT/peers/run.txt 2>&1; echo "bench rc=$?"
grep -E "^  [a-z]" $OUT/peers/run.txt | head -20
cd $OUT && tar czf logs.tgz *.log t-*.txt peers && rm -rf *.log t-*.txt peers
