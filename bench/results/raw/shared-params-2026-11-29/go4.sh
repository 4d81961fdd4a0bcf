# Call 4: F (the landed build: L with the Hopper d128 bias kernels' reads generic, main's PTX
# there) against M (main cd3f900), alternating twice; F's gpu_backward and gpu_sparse; then
# where F's d64 dense backward's time goes (ncu at its locked clocks, one launch, PC sampling by
# SASS instruction), beside call 4 of bwd-exp2-2026-11-29.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench; M=$(bench_at .gpu-pack/bench-M.xz)
ONLY="d128/s8192/dense,d128/s8192/blocks128x50%+bias,d64/s8192/dense,d64/s8192/causal,d64/s8192/blocks128x50%+bias"
for r in 1 2; do for pair in M=$M F=$B; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 60 $b --out /tmp/ab-$n-$r --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(fwd|bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-M-1.log | awk '{print $1}' > $R/case-ids.txt
T=220 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=220 run gpu_sparse > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section SourceCounters --import-source no"
s=$(date +%s)
timeout 150 ncu -k "regex:dmattn_bwd_sm90_bf16_d64$" --launch-skip 1 --launch-count 1 $S -o /tmp/rep-d64 $B --out /tmp/n-d64 --groups llm-d64 --only "d64/s8192/dense" --reps 1 --impls dmattn > $OUT/ncu-d64.log 2>&1
echo "ncu rc=$? $(( $(date +%s)-s ))s"
ncu -i /tmp/rep-d64.ncu-rep --page details > $R/details-bwd-d64.txt 2>&1
ncu -i /tmp/rep-d64.ncu-rep --page source --csv --print-source sass > $R/sass-bwd-d64.csv 2>&1
gzip -f $R/sass-*.csv; cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
