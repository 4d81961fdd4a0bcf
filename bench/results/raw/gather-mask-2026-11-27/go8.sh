source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
B=$here/bin/dmattn-bench
for r in 1 2; do
  for v in main new; do
    if [ $v = main ]; then X=/tmp/bench-main; else X=$B; fi
    $X --out /tmp/$v$r --groups gather,indices --only "gather/,lists1024-random/" --impls dmattn > $OUT/gm-$v$r.log 2>&1
    echo "$v/$r: $(grep -E ' bwd ' $OUT/gm-$v$r.log | awk '{print $3}' | tr '\n' ' ')"
  done
done
grep -E '^[a-z].*/' $OUT/gm-new1.log | awk '{print $1}' | tr '\n' ' '; echo
for f in $OUT/gm-main2.log $OUT/gm-new2.log; do timeout 120 ncu --kernel-name regex:dmattn_gather_mask --launch-skip 1 --launch-count 1 --metrics gpu__time_duration.sum $([ $f = $OUT/gm-main2.log ] && echo /tmp/bench-main || echo $B) --out /tmp/n --groups gather --only gather/d128/q8192 --impls dmattn --reps 1 2>&1 | grep -E "gpu__time_duration|dmattn_gather_mask" | head -2; done
T=400 run gpu_gather
SC=3 T=150 san gpu_gather gather_backward_matches_reference
