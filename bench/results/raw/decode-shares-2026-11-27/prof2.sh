source .gpu-pack/lib.sh
B=$here/bin/dmattn-bench
C="keyfrac10%+varlen64+bias"
ncu --kernel-name regex:dmattn --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed --csv --page raw $B --out /tmp/n --groups varlen --only "$C" --reps 2 --impls dmattn > $OUT/ncu-times.csv 2>&1
python3 - <<'P' $OUT/ncu-times.csv
import csv,sys
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>10]
h=rows[0]; ix={k:i for i,k in enumerate(h)}
for r in rows[2:][-3:]:
    print(r[ix['Kernel Name']][:40], r[ix['gpu__time_duration.sum']], r[ix['dram__bytes_read.sum']], r[ix['dram__throughput.avg.pct_of_peak_sustained_elapsed']])
P
for n in 4 16 8; do DMATTN_BENCH_DECODE_CTAS=$n $B --out /tmp/c$n --groups varlen --only "keyfrac" --impls dmattn > $OUT/ctas$n.log 2>&1; echo "ctas $n: $(grep -E ' fwd ' $OUT/ctas$n.log | awk '{print $3}' | tr '\n' ' ')"; done
ncu --kernel-name regex:dmattn_decode --launch-skip 2 --launch-count 1 --set full -o /tmp/rep $B --out /tmp/n2 --groups varlen --only "$C" --reps 2 --impls dmattn > /tmp/ncu-full.log 2>&1; tail -1 /tmp/ncu-full.log
ncu --import /tmp/rep.ncu-rep --page details > $OUT/details.txt 2>&1
ncu --import /tmp/rep.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>&1
python3 $here/stalls.py /tmp/src.csv > $OUT/stalls.txt 2>&1; head -24 $OUT/stalls.txt
xz -c /tmp/src.csv > $OUT/src.csv.xz
