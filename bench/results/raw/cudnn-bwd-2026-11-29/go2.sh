# Call 2: what the proxy fence compiles to and whether it waits for in-flight global reductions
# (micro/fence.ptx: SASS of five fence forms; k_time: clock64 around the fence after n
# reductions a lane, 264 CTAs contending), then two diagnostic builds against main, alternating
# twice: X0 without the step-start proxy fence, X1 without the one before dQ/dV/dK (both wrong,
# for timing only).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
PTXAS=$(command -v ptxas || ls /usr/local/cuda*/bin/ptxas | head -n 1); OBJ=$(dirname $PTXAS)/cuobjdump
$PTXAS -arch=sm_90a .gpu-pack/micro/fence.ptx -o /tmp/fence.cubin && $OBJ -sass /tmp/fence.cubin > $R/fence-sass.txt 2>&1
echo "sass rc=$? $(grep -c MEMBAR $R/fence-sass.txt) MEMBAR lines"
timeout 60 python3 .gpu-pack/micro/fence_time.py /tmp/fence.cubin 2>&1 | tee $R/fence-time.txt
M=$(bench_at .gpu-pack/bench-M.xz); X0=$(bench_at .gpu-pack/bench-X0.xz); X1=$(bench_at .gpu-pack/bench-X1.xz)
ONLY="d128/s4096/dense,d128/s8192/dense,d128/s8192/causal,d64/s8192/dense,d64/s8192/causal"
for r in 1 2; do for pair in M=$M X0=$X0 X1=$X1; do
  n=${pair%%=*}; b=${pair#*=}; s=$(date +%s)
  timeout 40 $b --out /tmp/ab-$n-$r --groups llm,llm-d64 --only "$ONLY" --impls dmattn --reps 10 > $OUT/bench-$n-$r.log 2>&1
  echo "$n #$r rc=$? $(( $(date +%s) - s ))s: $(grep -E '^  dmattn +(bwd)' $OUT/bench-$n-$r.log | awk '{print $2, $3}' | tr '\n' ' ')"
done; done | tee $R/ab.txt
grep -E '^[a-z0-9-]+/' $OUT/bench-M-1.log | awk '{print $1}' > $R/case-ids.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
