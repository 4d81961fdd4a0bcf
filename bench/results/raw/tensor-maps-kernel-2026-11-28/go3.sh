# Call 3: tensor maps written by a kernel (graph captures take the lean bulk-copy forward):
# gpu_interop (graph replay with a lean d128 case), gpu_forward, gpu_decode (the shipped decoding
# kernel with pages of 1 and 4) and memcheck/racecheck of the lean forward, in parallel; then an
# A/B of small and 8K lean calls against main's binary.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for b in gpu_interop gpu_forward gpu_decode; do T=300 run $b > $OUT/t-$b.txt 2>&1 & done
(SC=4 T=120 san gpu_forward lean_forward_matches_reference > $OUT/t-san.txt 2>&1) &
wait
cat $OUT/t-*.txt | tee $OUT/tests.txt
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
B=$here/bin/dmattn-bench
for v in new main new2 main2; do
  case $v in main*) X=/tmp/bench-main;; *) X=$B;; esac
  s=$(date +%s)
  timeout 50 $X --out /tmp/$v --groups llm --only s1024/dense,s1024/causal,s8192/dense --impls dmattn > $OUT/bench-$v.log 2>&1
  echo "$v ($(( $(date +%s)-s ))s): $(grep -E ' (fwd|bwd) ' $OUT/bench-$v.log | awk '{print $2":"$3}' | tr '\n' ' ')"
done 2>&1 | tee $OUT/ab.txt
