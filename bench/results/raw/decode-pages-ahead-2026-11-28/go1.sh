# Call 1: H100 A/B of the masked decode batch (main vs pages looked up a tile ahead + the pack's
# 8-byte loads), then gpu_decode whole (page sizes 1-256).
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
B=$here/bin/dmattn-bench
for v in new main new2 main2; do
  case $v in main*) X=/tmp/bench-main;; *) X=$B;; esac
  s=$(date +%s)
  timeout 65 $X --out /tmp/$v --groups varlen --only "keyfrac" --impls dmattn > $OUT/bench-$v.log 2>&1
  echo "$v ($(( $(date +%s)-s ))s): $(grep -E ' fwd ' $OUT/bench-$v.log | awk '{print $3}' | tr '\n' ' ')"
  grep -E "copy speed" $OUT/bench-$v.log | sed 's/.*GB\/s, //'
done 2>&1 | tee $OUT/ab.txt
T=280 run gpu_decode 2>&1 | tee $OUT/tests.txt
