source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
B=$here/bin/dmattn-bench
ONLY="llm/d128/s8192/blocks128x50%,bcsr128x50%,bitset128x50%,compress4-dense,gather/d128"
G=llm,sparse,gather
for r in 1 2; do
  /tmp/bench-main --out /tmp/a$r --groups $G --only "$ONLY" --impls dmattn > $OUT/ab-main$r.log 2>&1
  echo "main/$r: $(grep -E ' bwd ' $OUT/ab-main$r.log | awk '{print $3}' | tr '\n' ' ')"
  $B --out /tmp/b$r --groups $G --only "$ONLY" --impls dmattn > $OUT/ab-new$r.log 2>&1
  echo "new/$r:  $(grep -E ' bwd ' $OUT/ab-new$r.log | awk '{print $3}' | tr '\n' ' ')"
done
grep -E "^(llm|sparse|gather)" $OUT/ab-new1.log
