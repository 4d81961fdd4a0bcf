# Call 3 (H100): a paged key's address from its row in the page pool (pages that are runs of
# rows) against the work-order build (f73ee06), the masked decode batch, alternating twice;
# gpu_decode whole and gpu_varlen's paged tests (half their pools padded: the general page
# addressing); a small paged decoding call under memcheck and racecheck.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
xz -dc $here/bench-order.xz > /tmp/bench-order; chmod +x /tmp/bench-order
B=$here/bin/dmattn-bench
for v in new order new2 order2; do
  case $v in order*) X=/tmp/bench-order;; *) X=$B;; esac
  s=$(date +%s)
  timeout 70 $X --out /tmp/$v --groups varlen --only "keyfrac" --impls dmattn > $OUT/bench-$v.log 2>&1
  echo "$v ($(( $(date +%s)-s ))s): $(grep -E ' fwd ' $OUT/bench-$v.log | awk '{print $1, $3, $15}' | tr '\n' ' ')"
done 2>&1 | tee $OUT/ab.txt
T=300 run gpu_decode > $OUT/t-1.txt 2>&1 &
T=300 run gpu_varlen paged > $OUT/t-2.txt 2>&1 &
SC=2 T=140 san gpu_varlen paged_table_from_device_tensor > $OUT/t-3.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
cd $OUT && tar czf logs.tgz *.log && rm -f *.log t-*.txt
