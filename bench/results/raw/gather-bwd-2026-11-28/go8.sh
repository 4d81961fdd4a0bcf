# Result (call 9, ab-blocks-bias-call9.txt): no better; the change (bias_rows constant without a softcap in
# Step::scores) was reverted, not committed. The blocks + bias backward stays 2.5-4 % slower than main.
# Call 9: call 7's A/B found the blocks + bias backward (a bias with rows) 2.5-3 % slower since
# 612d1cc: the bias tile's row step had become a runtime value. Now constant where the variant has
# no softcap. main (8edbb36) against this build on those rows and one gathered row; then the
# backward property tests that cover the bias variants, fewer cases (time left: ~4 device-minutes).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
xz -dc .gpu-ab/bench-main.xz > /tmp/b-main; chmod +x /tmp/b-main; B=.gpu-pack/bin/dmattn-bench
for n in main new main new; do b=/tmp/b-main; [ $n = new ] && b=$B
  timeout 40 $b --out /tmp/x --groups llm,llm-d64,gather --only "d128/s8192/blocks128x50%+bias,d64/s8192/blocks128x50%+bias,d128/q8192" --impls dmattn --reps 10 > /tmp/x.log 2>&1
  echo "$n rc=$?: $(grep -E '^  dmattn +(fwd|bwd)' /tmp/x.log | awk '{print $2, $3}' | tr '\n' ' ')"
done | tee $R/ab.txt
DMATTN_GPU_CASES=500 T=100 run gpu_backward key_side_bias backward_matches_reference > /tmp/t-1.txt 2>&1 &
DMATTN_GPU_CASES=300 T=100 run gpu_gather gather_backward long_keys chunked > /tmp/t-2.txt 2>&1 &
wait; cat /tmp/t-*.txt | tee $R/tests.txt
