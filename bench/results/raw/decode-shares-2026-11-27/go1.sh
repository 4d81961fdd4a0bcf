source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
B=$here/bin/dmattn-bench
for r in 1 2; do
  for v in main new; do
    if [ $v = main ]; then X=/tmp/bench-main; else X=$B; fi
    s=$(date +%s)
    $X --out /tmp/$v$r --groups varlen,gather,dma-infer --only "q304,gather/d64/q1/,dma-infer/q1/k524288/" --impls dmattn > $OUT/$v$r.log 2>&1
    echo "$v/$r ($(( $(date +%s)-s ))s): $(grep -E ' fwd ' $OUT/$v$r.log | awk '{print $3}' | tr '\n' ' ')"
  done
done
grep -E "copy speed" $OUT/new1.log | cut -c1-200
T=300 run gpu_decode
