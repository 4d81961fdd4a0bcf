# Call 4 (612d1cc's build): the gathered backward at 4 (the plan's), 8 and 16 query chunks
# (`DMATTN_BENCH_GATHER_CHUNKS`), twice; per-instruction counts (SASS) of the gathered d128 32K
# backward kernel, and its SM activity.
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
source .gpu-pack/lib.sh >/dev/null 2>&1
B=.gpu-pack/bin/dmattn-bench
timeout 60 $B --out /tmp/smoke --groups gather --only "d128/q8192" --impls dmattn --reps 3 > /tmp/smoke.log 2>&1
echo "smoke rc=$?" | tee $OUT/smoke.txt; grep -q "rc=0" $OUT/smoke.txt || exit 1
for r in 1 2; do for c in 0 8 16 2; do
  DMATTN_BENCH_GATHER_CHUNKS=$c timeout 100 $B --out /tmp/c-$c-$r --groups gather --only "d128/q8192,d128/q32768" --impls dmattn --reps 10 > /tmp/c-$c-$r.log 2>&1
  echo "chunks $c #$r: $(grep -E '^  dmattn +(fwd|bwd)' /tmp/c-$c-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $OUT/chunks.txt
mkdir -p /tmp/o
S="--section SourceCounters --section SpeedOfLight --section WarpStateStats --import-source no"
timeout 200 ncu -k "regex:dmattn_bwd_sm90" --launch-skip 1 --launch-count 1 $S -o /tmp/o/gbwd $B --out /tmp/ns --groups gather --only "d128/q32768" --impls dmattn --reps 1 > /tmp/o/gbwd.log 2>&1; echo "ncu rc=$?"
ncu -i /tmp/o/gbwd.ncu-rep --page source --csv --print-source sass > /tmp/o/gbwd-sass.csv 2>&1
ncu -i /tmp/o/gbwd.ncu-rep --page details --csv > /tmp/o/gbwd-details.csv 2>&1
rm -f /tmp/o/*.ncu-rep; cd /tmp/o && tar czf $OUT/call4.tgz * /tmp/c-*.log
