# Call 2 (H100): A/B of the masked decode batch (main vs pages a tile ahead + 8-byte pack); ncu of
# the decoding kernel contiguous / paged / paged with pages in order, new and main; the key-side
# mask layouts (the pack's 8-byte path) run and under memcheck.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
B=$here/bin/dmattn-bench
for v in new main new2 main2; do
  case $v in main*) X=/tmp/bench-main;; *) X=$B;; esac
  s=$(date +%s)
  timeout 65 $X --out /tmp/$v --groups varlen --only "keyfrac" --impls dmattn > $OUT/bench-$v.log 2>&1
  echo "$v ($(( $(date +%s)-s ))s): $(grep -E ' fwd ' $OUT/bench-$v.log | awk '{print $3}' | tr '\n' ' ')"
  grep -E "copy speed" $OUT/bench-$v.log | sed 's/.*GB\/s, //'
done 2>&1 | tee $OUT/ab.txt
nc() { local tag=$1 X=$2 only=$3; shift 3; s=$(date +%s); env "$@" timeout 60 ncu --kernel-name regex:"dmattn_decode|dmattn_mask_pack_keys|dmattn_combine" --launch-count 6 --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active --csv --page raw $X --out /tmp/ncu --groups varlen --only "$only" --reps 2 --impls dmattn > $OUT/ncu-$tag.csv 2>&1; echo "ncu $tag rc=$? $(( $(date +%s)-s ))s"; }
nc new-contig $B "keyfrac10%+varlen64+bias" X=1
nc new-paged $B "paged256" X=1
nc new-paged-inorder $B "paged256" DMATTN_BENCH_PAGES_IN_ORDER=1
nc main-paged /tmp/bench-main "paged256" X=1
python3 - $OUT/ncu-*.csv <<'P' | tee $OUT/ncu.txt
import csv,sys
for f in sys.argv[1:]:
    rows=[r for r in csv.reader(open(f)) if len(r)>5]
    if not rows: print(f, 'no rows'); continue
    h=rows[0]; ix={k:i for i,k in enumerate(h)}
    for r in rows[2:]:
        print(f.split('/')[-1], r[ix['Kernel Name']][:34], *(r[ix[m]] for m in ['gpu__time_duration.sum','dram__bytes_read.sum','launch__registers_per_thread','sm__warps_active.avg.pct_of_peak_sustained_active']))
P
T=90 run gpu_varlen varlen_masks_in_every_layout 2>&1 | tee $OUT/tests.txt
DMATTN_GPU_CASES=4 timeout 90 compute-sanitizer --tool memcheck --print-limit 10 $here/bin/test-tests-gpu_varlen varlen_masks_in_every_layout --test-threads=1 > $OUT/san-memcheck.log 2>&1; echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/san-memcheck.log | tail -1)" | tee -a $OUT/tests.txt
