# Call 3 (2026-11-30, 21st session): SM clock and power while each build's backward runs (d128
# dense 16K, 30 reps), L (main), D1k (diagnostic: Sᵀ's A = dK's accumulator bits), K (K's
# fragments in registers) and cuDNN; then PC sampling of L's d128 dense 8K kernel.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader > $R/gpu.txt
L=$(bench_at .gpu-pack/L-bench.xz); D1k=$(bench_at .gpu-pack/bench-D1k.xz); K=.gpu-pack/bin/dmattn-bench
Q="clocks.sm,power.draw,clocks_event_reasons.active"
nvidia-smi --query-gpu=$Q --format=csv,noheader >> $R/gpu.txt 2>&1 || Q="clocks.sm,power.draw"
sample() { # NAME CMD...: runs CMD with nvidia-smi sampling every 50 ms; prints median clock/power under load
  local n=$1; shift
  nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits -lms 50 > $OUT/smi-$n.csv 2>&1 & local pid=$!
  "$@" > $OUT/run-$n.log 2>&1; local rc=$?; kill $pid; wait $pid 2>/dev/null
  python3 - "$n" "$OUT/smi-$n.csv" "$rc" <<'PY'
import sys,statistics as st
n,f,rc=sys.argv[1:4]; rows=[l.split(',') for l in open(f) if l.count(',')>=1]
load=[(float(r[0]),float(r[1]),r[2].strip() if len(r)>2 else '') for r in rows if r[1].strip().replace('.','',1).isdigit() and float(r[1])>250]
if not load: print(n,'rc',rc,'no samples under load'); sys.exit()
c=[x[0] for x in load]; p=[x[1] for x in load]; rs={}
for x in load: rs[x[2]]=rs.get(x[2],0)+1
print(f"{n} rc={rc} samples={len(load)} clock MHz median {st.median(c):.0f} min {min(c):.0f} max {max(c):.0f}; power W median {st.median(p):.0f} max {max(p):.0f}; reasons {rs}")
PY
}
for r in 1 2; do for pair in L=$L D1k=$D1k K=$K; do
  n=${pair%%=*}; b=${pair#*=}
  sample $n-$r $b --out /tmp/s-$n --groups llm --only "d128/s16384/dense" --impls dmattn --reps 30
  echo "   $(grep -E '^  dmattn +bwd' $OUT/run-$n-$r.log | awk '{print $2, $3}')"
done; done | tee $R/ab.txt
sample cudnn python3 .gpu-pack/peers.py --cases /tmp/s-L/cases.json --out /tmp/s-L/peers.json --impls sdpa-cudnn | tee -a $R/ab.txt
cp /tmp/s-L/peers.json $OUT/ 2>/dev/null; grep -E "bwd" $OUT/run-cudnn.log | head -3 | tee -a $R/ab.txt
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section SourceCounters --import-source no"
s=$(date +%s); timeout 200 ncu -k "regex:dmattn_bwd_sm90_bf16_d128$" --launch-skip 1 --launch-count 1 $S -o /tmp/rep-d128 $L --out /tmp/n-d128 --groups llm --only "d128/s8192/dense" --reps 1 --impls dmattn > $OUT/ncu.log 2>&1
echo "ncu rc=$? $(( $(date +%s)-s ))s" | tee -a $R/ab.txt
ncu -i /tmp/rep-d128.ncu-rep --page details > $R/details-L-d128.txt 2>&1
ncu -i /tmp/rep-d128.ncu-rep --page source --csv --print-source sass | gzip > $R/sass-L-d128.csv.gz
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
