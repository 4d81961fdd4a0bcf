source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
xz -dc $here/bench-prev.xz > /tmp/bench-prev; chmod +x /tmp/bench-prev
B=$here/bin/dmattn-bench
for r in 1 2; do
  /tmp/bench-prev --out /tmp/a$r --groups sparse --only compress64 --impls dmattn > $OUT/ab-prev$r.log 2>&1
  echo "prev/$r: $(grep -E ' bwd ' $OUT/ab-prev$r.log | awk '{print $3}' | tr '\n' ' ')"
  $B --out /tmp/b$r --groups sparse --only compress64 --impls dmattn > $OUT/ab-new$r.log 2>&1
  echo "new/$r:  $(grep -E ' bwd ' $OUT/ab-new$r.log | awk '{print $3}' | tr '\n' ' ')"
done
T=400 run gpu_backward split_query_backward long_queries &
T=400 run gpu_sparse sparse_split_backward sparse_backward &
T=400 run gpu_gather &
wait
SC=6 T=200 san gpu_backward split_query_backward
