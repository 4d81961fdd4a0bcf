# Call 4 (after call 3 found dQ wrong under head chunks: the backward wrote a contiguous dQ into their strided view; now the Hopper conversion writes through the view's strides and the portable path copies into place): the gathered backward in query chunks by heads (the plan now: 4 for the h16 hk4 rows)
# against by rows (DMATTN_BENCH_GATHER_CHUNKS=4, the plan before), alternating twice, one
# binary; then gpu_gather in full (its backward property tests force chunks by heads and rows)
# and, alongside, memcheck and racecheck on six backward property cases (four forced into chunks).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
for r in 1 2; do for mode in rows4 plan; do
  case $mode in rows4) e="DMATTN_BENCH_GATHER_CHUNKS=4";; plan) e="X=1";; heads2) e="DMATTN_BENCH_GATHER_CHUNKS=2 DMATTN_BENCH_GATHER_BY_HEADS=1";; esac
  [ $r = 2 ] && [ $mode = heads2 ] && continue
  env $e timeout 100 $B --out /tmp/ab-$mode-$r --groups gather --only "d128/q8192,d128/q32768" --impls dmattn --reps 10 > /tmp/bench-$mode-$r.log 2>&1
  echo "$mode #$r rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' /tmp/bench-$mode-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
T=400 run gpu_gather > /tmp/t-1.txt 2>&1 &
(SC=6 T=300 san gpu_gather gather_backward_matches_reference > /tmp/t-2.txt 2>&1) &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
tar czf $R/logs.tgz /tmp/bench-*.log /tmp/L 2>/dev/null; ls $R
