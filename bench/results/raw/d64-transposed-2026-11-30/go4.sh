# Call 4: E8 (an eighth of the transposed step's exponentials on exp2_poly, d64 and d128)
# against N (34f2a72), alternating twice; then N's d128 and d64 dense 8K backward kernels under
# ncu with clocks not locked (the cycles to set beside cuDNN's from call 2).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
E8=$(bench_at .gpu-pack/bench-E8.xz); N=.gpu-pack/bin/dmattn-bench
ONLY="d128/s8192/dense,d128/s8192/causal,d128/s16384/dense,d64/s4096/dense,d64/s8192/dense,d64/s8192/causal,d64/s16384/dense"
for r in 1 2; do for pair in N=$N E8=$E8; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 70 $b --out /tmp/ab-$n --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-N-1.log | awk '{print $1}' > $R/case-ids.txt
M=gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_elapsed.avg
for c in d128-s8192-dense d64-s8192-dense; do
  timeout 60 ncu --clock-control none -k regex:dmattn_bwd --metrics $M --csv --log-file $OUT/ncu-$c.csv $N --cases .gpu-pack/cc/cc-$c/cases.json --out /tmp/n-$c --impls dmattn --reps 1 > $OUT/ncu-$c.log 2>&1; echo "ncu $c rc=$?"
done
cat $OUT/ncu-*.csv > $R/ncu-dmattn-dense.csv
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
