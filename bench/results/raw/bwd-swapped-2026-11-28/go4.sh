# Call 4: call 3's transposed step issued dQ after dV and dK and waited for all three before
# dQ's additions (8-12 % slower than main). Now dQ is issued before dK, and its additions go
# out while dK computes. Smoke; main against this build twice; only if this build's backward
# totals are below main's, the backward and sparse suites and memcheck/racecheck.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 40 $here/bin/dmattn-bench --out /tmp/smoke --groups llm --only "d128/s1024/dense" --impls dmattn --reps 3 > $OUT/smoke.log 2>&1
echo "smoke rc=$? $(grep -E '^  dmattn +bwd' $OUT/smoke.log)" | tee $OUT/smoke.txt
grep -q "rc=0" $OUT/smoke.txt || exit 1
H=$(bench_at $here/bench-main.xz)
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s8192/causal,d128/s16384/causal"
for r in 1 2; do for pair in main=$H new=$here/bin/dmattn-bench; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 90 $b --out /tmp/ab-$n-$r --groups llm --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $OUT/ab.txt
sum() { grep "^$1 " $OUT/ab.txt | awk '{for(i=3;i<=NF;i++) if($i=="bwd") s+=$(i+1)} END {print s}'; }
M=$(sum main); N=$(sum new); echo "bwd totals main $M new $N" | tee -a $OUT/ab.txt
if awk "BEGIN {exit !($N < $M)}"; then
  T=280 run gpu_backward > $OUT/t-1.txt 2>&1 &
  T=280 run gpu_sparse > $OUT/t-2.txt 2>&1 &
  wait
  cat $OUT/t-*.txt | tee $OUT/tests.txt
  T=60 san gpu_backward lean_d128_small | tee $OUT/san.txt
fi
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
