# Call 4: gpu_interop with the graph test's lean case replayed (the harness no longer assumes a
# mask and bias); A/B of small lean calls (the maps' store kernel in place of a host copy).
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
T=150 run gpu_interop 2>&1 | tee $OUT/tests.txt
xz -dc $here/bench-main.xz > /tmp/bench-main; chmod +x /tmp/bench-main
B=$here/bin/dmattn-bench
for v in new main new2 main2 new3 main3; do
  case $v in main*) X=/tmp/bench-main;; *) X=$B;; esac
  timeout 40 $X --out /tmp/$v --groups llm,llm-d64 --only s1024/dense,s1024/causal,s2048/dense --impls dmattn --reps 50 > $OUT/bench-$v.log 2>&1
  echo "$v: $(grep -E ' fwd ' $OUT/bench-$v.log | awk '{print $3}' | tr '\n' ' ')"
done 2>&1 | tee $OUT/ab.txt
