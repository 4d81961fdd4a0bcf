# Call 2: H100 A/B of the masked decode batch (main vs the pack's 8-byte loads), ncu of the
# pack, then gpu_varlen and the sanitizer on the key-side pack.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
B=$here/bin/dmattn-bench
for v in new main new2 main2; do
  case $v in main*) X=/tmp/bench-main;; *) X=$B;; esac
  s=$(date +%s)
  timeout 100 $X --out /tmp/$v --groups varlen --only "keyfrac" --impls dmattn > $OUT/bench-$v.log 2>&1
  echo "$v ($(( $(date +%s)-s ))s): $(grep -E ' fwd ' $OUT/bench-$v.log | awk '{print $3}' | tr '\n' ' ')"
  grep -E "copy speed" $OUT/bench-$v.log | sed 's/.*GB\/s, //'
done 2>&1 | tee $OUT/ab.txt
for v in new main; do
  case $v in main*) X=/tmp/bench-main;; *) X=$B;; esac
  timeout 60 ncu --kernel-name regex:dmattn_mask_pack_keys --launch-count 3 --metrics gpu__time_duration.sum,dram__bytes_read.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum --csv --page raw $X --out /tmp/ncu-$v --groups varlen --only "keyfrac10%+varlen64+bias" --reps 2 --impls dmattn > $OUT/ncu-$v.txt 2>&1
  echo "ncu $v rc=$?"; grep -E "mask_pack" $OUT/ncu-$v.txt | head -3
done 2>&1 | tee -a $OUT/ab.txt
