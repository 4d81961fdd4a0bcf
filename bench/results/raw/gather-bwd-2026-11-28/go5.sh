# Call 5: beside call 3, the key-side bias folded into the scores from the CTA's f32 row (scaled once,
# `smem::store_bias_row`, `Step::init_columns`), and dS summed for it in a loop with no dbias stores
# (`Step::ds_of`). Smoke; call 3's build (612d1cc) and this one, twice (gather group); gpu_backward and gpu_gather;
# memcheck and racecheck on four key-side bias property cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
timeout 60 $B --out /tmp/smoke --groups gather --only "d128/q8192" --impls dmattn --reps 3 > /tmp/smoke.log 2>&1
echo "smoke rc=$? $(grep -E '^  dmattn' /tmp/smoke.log | awk '{print $2, $3}' | tr '\n' ' ')" | tee $R/smoke.txt
grep -q "rc=0" $R/smoke.txt || exit 1
H3=$(bench_at .gpu-pack/bench-c3.xz)
ONLY="d64/q16384,d64/q32768,d128/q8192,d128/q32768"
for r in 1 2; do for pair in call3=$H3 new=$B; do
  n=${pair%%=*}; b=${pair#*=}
  timeout 150 $b --out /tmp/ab-$n-$r --groups gather --only "$ONLY" --impls dmattn --reps 10 > /tmp/bench-$n-$r.log 2>&1
  echo "$n #$r: $(grep -E '^  dmattn +(fwd|bwd)' /tmp/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
T=400 run gpu_backward > /tmp/t-1.txt 2>&1 &
T=400 run gpu_gather > /tmp/t-2.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
SC=4 T=200 san gpu_backward key_side_bias | tee $R/san.txt
tar czf $R/logs.tgz /tmp/bench-*.log /tmp/L 2>/dev/null; ls $R
mkdir -p /tmp/o
S="--section SourceCounters --section SpeedOfLight --import-source no"
timeout 200 ncu -k "regex:dmattn_bwd_sm90" --launch-skip 1 --launch-count 1 $S -o /tmp/o/gbwd $B --out /tmp/ns --groups gather --only "d128/q32768" --impls dmattn --reps 1 > /tmp/o/gbwd.log 2>&1; echo "ncu rc=$?"
ncu -i /tmp/o/gbwd.ncu-rep --page source --csv --print-source sass > /tmp/o/gbwd-sass.csv 2>&1
rm -f /tmp/o/*.ncu-rep; tar czf $R/call5-ncu.tgz -C /tmp/o .
