source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
B=$here/bin/dmattn-bench
for v in new main; do
  if [ $v = main ]; then X=/tmp/bench-main; else X=$B; fi
  s=$(date +%s)
  timeout 170 $X --out /tmp/$v --groups varlen --only "keyfrac" --impls dmattn > $OUT/h100-$v.log 2>&1
  echo "$v ($(( $(date +%s)-s ))s): $(grep -E ' fwd ' $OUT/h100-$v.log | awk '{print $3}' | tr '\n' ' ')"
  grep -E "copy speed" $OUT/h100-$v.log | sed 's/.*GB\/s, //'
done
