# Call 2: call 1's per-kernel durations again (they did not come back: 8 files at most), and
# per-instruction counts and stall samples (SASS) of the gathered d128 32K backward kernel and
# of the dense d128 4K one, to see where the gathered kernel's extra instructions are.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
B=.gpu-pack/bin/dmattn-bench
mkdir -p /tmp/o
for c in gather:d128/q32768 gather:d128/q8192 gather:d64/q32768 llm:d128/s4096/dense; do
  g=${c%%:*}; o=${c#*:}; n=$(echo $o | tr / -)
  timeout 200 ncu --metrics gpu__time_duration.sum --csv $B --out /tmp/n-$n --groups $g --only "$o" --impls dmattn --reps 1 > /tmp/o/times-$n.csv 2> /tmp/o/times-$n.err
  echo "ncu times $c rc=$?"
done
S="--section SourceCounters --section InstructionStats --section WarpStateStats --import-source no"
timeout 200 ncu -k "regex:dmattn_bwd_sm90" --launch-skip 1 --launch-count 1 $S -o /tmp/o/gbwd $B --out /tmp/ns --groups gather --only "d128/q32768" --impls dmattn --reps 1 > /tmp/o/gbwd.log 2>&1; echo "ncu gather rc=$?"
timeout 200 ncu -k "regex:dmattn_bwd_sm90_bf16_d128$" --launch-skip 1 --launch-count 1 $S -o /tmp/o/dbwd $B --out /tmp/nd --groups llm --only "d128/s4096/dense" --impls dmattn --reps 1 > /tmp/o/dbwd.log 2>&1; echo "ncu dense rc=$?"
for r in gbwd dbwd; do
  ncu -i /tmp/o/$r.ncu-rep --page source --csv --print-source sass > /tmp/o/$r-sass.csv 2> /tmp/o/$r-sass.err; echo "source $r rc=$? $(wc -l < /tmp/o/$r-sass.csv)"
  ncu -i /tmp/o/$r.ncu-rep --page details --csv > /tmp/o/$r-details.csv 2>&1
  ncu -i /tmp/o/$r.ncu-rep --page raw --csv > /tmp/o/$r-raw.csv 2>&1
done
rm -f /tmp/o/*.ncu-rep
cd /tmp/o && tar czf $OUT/call2.tgz * && ls -la $OUT
