# Call 1 (H100): last session's unrun test edits; the masked decode batch with shuffled pages
# against pages in order (TLB reach?), twice each; ncu --set full of the decoding kernel,
# masked contiguous against masked paged.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=100 run gpu_interop packed_batch > $OUT/t-1.txt 2>&1 &
T=100 run gpu_varlen from_device_tensor > $OUT/t-2.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
B=$here/bin/dmattn-bench
for v in shuf inorder shuf2 inorder2; do
  case $v in inorder*) E=DMATTN_BENCH_PAGES_IN_ORDER=1;; *) E=X=1;; esac
  s=$(date +%s)
  env $E timeout 70 $B --out /tmp/$v --groups varlen --only "keyfrac" --impls dmattn > $OUT/bench-$v.log 2>&1
  echo "$v ($(( $(date +%s)-s ))s): $(grep -E ' fwd ' $OUT/bench-$v.log | awk '{print $1, $3}' | tr '\n' ' ')"
done 2>&1 | tee $OUT/ab.txt
nf() { local tag=$1 only=$2; shift 2; s=$(date +%s); env "$@" timeout 100 ncu --kernel-name regex:"dmattn_decode" --launch-skip 1 --launch-count 1 --set full --import-source no -o $OUT/rep-$tag $B --out /tmp/ncu --groups varlen --only "$only" --reps 2 --impls dmattn > $OUT/ncu-$tag.log 2>&1; echo "ncu $tag rc=$? $(( $(date +%s)-s ))s"; ncu --import $OUT/rep-$tag.ncu-rep --page details > $OUT/details-$tag.txt 2>&1; ncu --import $OUT/rep-$tag.ncu-rep --page source --csv --print-source sass > $OUT/sass-$tag.csv 2>&1; }
nf contig "keyfrac10%+varlen64+bias" X=1
nf paged "keyfrac10%+varlen64+paged256" X=1
nf paged-inorder "keyfrac10%+varlen64+paged256" DMATTN_BENCH_PAGES_IN_ORDER=1
grep -E "Duration|DRAM Throughput|L2 Hit|Registers|Achieved Occupancy|Warp Cycles Per Issued|Memory Throughput|L1/TEX Hit" $OUT/details-*.txt | tee $OUT/ncu-summary.txt
