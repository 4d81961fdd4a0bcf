# Call 4: a compressed band's row division by multiply and shift (mask::Divisor) instead of a
# div.u32 per row per tile. A/B against call 3's build (bench-before-div), alternating twice, on
# the compressed-causal rows and their dense-mask forms (d128 and d64, cf 4 and 64); then
# gpu_sparse, gpu_forward and gpu_backward side by side.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
M=$(bench_at .gpu-pack/bench-before-div.xz)
for r in 1 2; do for pair in before=$M div=$B; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 100 $b --out /tmp/ab-$n-$r --groups sparse --only "compress" --impls dmattn --reps 10 > /tmp/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$?: $(grep -E '^sparse/|^  dmattn +(fwd|bwd)' /tmp/bench-$n-$r.log | awk '/^sparse/{printf "%s ", $1} /dmattn/{printf "%s %s ", $2, $3}')"
done; done | tee $R/ab.txt
T=330 run gpu_sparse > /tmp/t-1.txt 2>&1 &
T=330 run gpu_forward > /tmp/t-2.txt 2>&1 &
T=330 run gpu_backward > /tmp/t-3.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
tar czf $R/logs.tgz /tmp/bench-*.log 2>/dev/null; cp $OUT/*.log $R/ 2>/dev/null; true
