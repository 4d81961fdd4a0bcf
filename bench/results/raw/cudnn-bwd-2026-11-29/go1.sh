# Call 1: cuDNN's backward kernels at d64 and d128 (b2 h32 hk8 8K dense, H200): SASS with
# per-instruction counters, so that how it sends dQ (per-thread REDG, bulk UBLKRED, TMA
# UTMAREDG) and which products it issues (HGMMA shapes, register-sourced A) can be read.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
B=$(bench_at .gpu-pack/bench-M.xz)
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section SourceCounters --section InstructionStats --section MemoryWorkloadAnalysis --import-source no"
for d in d64 d128; do s=$(date +%s)
  g=llm; [ $d = d64 ] && g=llm-d64
  timeout 60 $B --out /tmp/c-$d --groups $g --only "$d/s8192/dense" --impls dmattn --reps 1 > $OUT/b-$d.log 2>&1
  timeout 150 ncu -k "regex:(?i)bprop" --launch-skip 1 --launch-count 1 $S -o /tmp/cu-$d python3 .gpu-pack/peers.py --cases /tmp/c-$d/cases.json --out /tmp/c-$d/peers.json --impls sdpa-cudnn > $R/ncu-$d.log 2>&1
  echo "$d rc=$? $(( $(date +%s)-s ))s"
  ncu -i /tmp/cu-$d.ncu-rep --page details > $R/details-$d.txt 2>&1
  ncu -i /tmp/cu-$d.ncu-rep --page source --csv --print-source sass > $R/sass-$d.csv 2>&1
  python3 - $R/sass-$d.csv > $R/ops-$d.txt <<'PY'
import csv, sys, re, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((i for i, r in enumerate(rows) if 'Source' in r), None)
if hdr is None: print('no header'); print(rows[:5]); sys.exit()
h = rows[hdr]; src = h.index('Source')
ex = next((i for i, c in enumerate(h) if c.startswith('Instructions Executed')), None)
ops = collections.Counter(); execd = collections.Counter()
for r in rows[hdr + 1:]:
    if len(r) <= src: continue
    op = r[src].split()[0] if r[src].split() else ''
    if op.startswith('@'): op = r[src].split()[1]
    ops[op] += 1
    if ex is not None:
        try: execd[op] += float(r[ex].replace(',', ''))
        except: pass
print('static count, executed (warp-level) per opcode')
for op, n in sorted(ops.items(), key=lambda x: -execd[x[0]]): print(f'{op:40s} {n:6d} {execd[op]:14.0f}')
print('\nlines with RED / ATOM / BLK / TMA / HGMMA / BAR / SYNCS:')
for r in rows[hdr + 1:]:
    if len(r) > src and re.search(r'RED|ATOM|BLK|UTMA|HGMMA|BAR|SYNCS|ARRIVE|SETMAXREG|WARPGROUP', r[src]): print(r[src])
PY
  gzip -f $R/sass-$d.csv
done
ls -la $R
