# Call 6: the d64 gathered rows (b1 h2 hk1, top-1024, 16K and 32K), whose backward the plan splits
# (one f32 dK/dV): against 2 query-head chunks and 2 / 4 row chunks (forced), alternating twice.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
for r in 1 2; do for mode in plan heads2 rows4; do
  case $mode in plan) e="X=1";; heads2) e="DMATTN_BENCH_GATHER_CHUNKS=2 DMATTN_BENCH_GATHER_BY_HEADS=1";; rows4) e="DMATTN_BENCH_GATHER_CHUNKS=4";; esac
  env $e timeout 60 $B --out /tmp/ab-$mode-$r --groups gather --only "d64/q16384,d64/q32768" --impls dmattn --reps 10 > /tmp/bench-$mode-$r.log 2>&1
  echo "$mode #$r rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' /tmp/bench-$mode-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
