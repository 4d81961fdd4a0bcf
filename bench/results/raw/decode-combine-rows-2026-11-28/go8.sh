# Call 8 (H200): a warp-specialised mask-only forward at d64 (wip-d64-mask-ws: the d128 one's
# kernel on a 128 x 128 tile, two consumer warpgroups): gpu_forward and gpu_sparse whole, then
# the window-shaped lists (32K, w 1024, and their dense form) and the 50 % 128-block d64 8K
# calls (with and without bias: the bias one keeps the modifier kernel), head against it, twice.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=150 run gpu_forward > $OUT/t-1.txt 2>&1 &
T=150 run gpu_sparse > $OUT/t-2.txt 2>&1 &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
H=$(bench_at $here/bench-head.xz)
for r in 1 2; do for pair in head=$H new=$here/bin/dmattn-bench; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 60 $b --out /tmp/ab-$n-$r --groups indices,llm-d64 --only "lists1024-window,d64/s8192/blocks128x50%" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $OUT/ab.txt
grep -E "^[a-z]+/" $OUT/bench-new-1.log > $OUT/ids.txt
cd $OUT && tar czf logs.tgz *.log t-*.txt && rm -f *.log t-*.txt
