# Call 7: the landed commit's own build (its stage copy's address arithmetic was reordered
# after call 6: the transposed kernels' PTX differs from call 6's only in the order of three
# instructions): the lean d128 property test and backward_matches_reference, then one round of
# main (C) against it.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
T=170 run gpu_backward lean_d128 backward_matches_reference | tee $R/tests.txt
C=$(bench_at .gpu-pack/bench-C.xz); F=.gpu-pack/bin/dmattn-bench
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s8192/causal"
for pair in C=$C F=$F; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 40 $b --out /tmp/ab-$n --groups llm --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n.log 2>&1
  echo "$n rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n.log | awk '{print $2, $3}' | tr '\n' ' ')"
done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-C.log | awk '{print $1}' > $R/case-ids.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
