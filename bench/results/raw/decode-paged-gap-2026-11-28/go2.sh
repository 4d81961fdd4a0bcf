# Call 2 (H100): the decoding kernel's CTAs heaviest first (work order) against main, the masked
# decode batch, alternating twice; gpu_decode whole (half its packed cases ordered), and its
# packed property test under memcheck and racecheck.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
B=$here/bin/dmattn-bench
for v in new main new2 main2; do
  case $v in main*) X=/tmp/bench-main;; *) X=$B;; esac
  s=$(date +%s)
  timeout 70 $X --out /tmp/$v --groups varlen --only "keyfrac" --impls dmattn > $OUT/bench-$v.log 2>&1
  echo "$v ($(( $(date +%s)-s ))s): $(grep -E ' fwd ' $OUT/bench-$v.log | awk '{print $1, $3}' | tr '\n' ' ')"
done 2>&1 | tee $OUT/ab.txt
T=330 run gpu_decode > $OUT/t-1.txt 2>&1 &
SC=6 T=300 san gpu_decode packed_decode_matches_reference > $OUT/t-2.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
cd $OUT && tar czf logs.tgz *.log && rm -f *.log t-*.txt
