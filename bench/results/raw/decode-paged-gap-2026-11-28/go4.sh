# Call 4 (H100): the tests with padded page pools (half the paged cases; the general page
# addressing on every paged kernel) on the shipped kernels, and the GPU selection's 32-bit
# limits (typed errors, k past the row's keys).
# First, ncu's per-instruction stall samples of the decoding kernel, masked contiguous and
# masked paged, for the paged call's 5-7 % (call 3 ruled out the addresses' arithmetic).
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
B=$here/bin/dmattn-bench
ns() { local tag=$1 only=$2; s=$(date +%s); timeout 100 ncu --kernel-name regex:"dmattn_decode" --launch-skip 1 --launch-count 1 --section SourceCounters --section WarpStateStats --section SchedulerStats --import-source no -o /tmp/rep-$tag $B --out /tmp/ncu --groups varlen --only "$only" --reps 2 --impls dmattn > /tmp/ncu-$tag.log 2>&1; echo "ncu $tag rc=$? $(( $(date +%s)-s ))s"; ncu --import /tmp/rep-$tag.ncu-rep --page source --csv --print-source sass > /tmp/sass-$tag.csv 2>&1; ncu --import /tmp/rep-$tag.ncu-rep --page details > /tmp/details-$tag.txt 2>&1; }
ns contig "keyfrac10%+varlen64+bias"
ns paged "keyfrac10%+varlen64+paged256"
(cd /tmp && tar czf $OUT/ncu.tgz sass-*.csv details-*.txt)
T=280 run gpu_decode packed_decode > $OUT/t-1.txt 2>&1 &
T=280 run gpu_varlen paged > $OUT/t-2.txt 2>&1 &
T=120 run gpu_select errors_are_typed > $OUT/t-3.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
cd $OUT && tar czf logs.tgz *.log && rm -f *.log t-*.txt
