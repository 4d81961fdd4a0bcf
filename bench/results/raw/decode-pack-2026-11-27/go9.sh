# Final call: H100 A/B of the masked decode batch (main vs the pack's 8-byte loads, every word's
# loads together), gpu_decode (page sizes 1-256), sanitizer on the key-side pack (16 heads: the
# 8-byte path), ncu of the pack.
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
T=230 run gpu_decode 2>&1 | tee $OUT/tests.txt
SC=4 T=70 san gpu_varlen varlen_masks_in_every_layout 2>&1 | tee -a $OUT/tests.txt
timeout 40 ncu --kernel-name regex:dmattn_mask_pack_keys --launch-count 3 --metrics gpu__time_duration.sum,dram__bytes_read.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,launch__registers_per_thread --csv --page raw $B --out /tmp/ncu --groups varlen --only "keyfrac10%+varlen64+bias" --reps 2 --impls dmattn > $OUT/ncu-new.txt 2>&1
python3 - $OUT/ncu-new.txt <<'P' | tee $OUT/ncu.txt
import csv,sys
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>10]
h=rows[0]; ix={k:i for i,k in enumerate(h)}
for r in rows[2:]:
    print(r[ix['Kernel Name']][:30], r[ix['gpu__time_duration.sum']], r[ix['dram__bytes_read.sum']], r[ix['l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum']], r[ix['launch__registers_per_thread']])
P
