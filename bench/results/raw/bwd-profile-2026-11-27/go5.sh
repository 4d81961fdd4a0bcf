source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
B=$here/bin/dmattn-bench
ONLY="d128/s8192/dense,d128/s8192/causal,s8192/blocks128x50%,gather/d128,q16384/k4096/compress4"
for r in 1 2; do
  for v in main nodq; do
    if [ $v = main ]; then X=/tmp/bench-main; else X=$B; fi
    $X --out /tmp/$v$r --groups llm,llm-d64,gather,sparse --only "$ONLY" --impls dmattn > $OUT/$v$r.log 2>&1
    echo "$v/$r: $(grep -E ' bwd ' $OUT/$v$r.log | awk '{print $3}' | tr '\n' ' ')"
  done
done
grep -E '^[a-z].*/' $OUT/nodq1.log | awk '{print $1}' | tr '\n' ' '
