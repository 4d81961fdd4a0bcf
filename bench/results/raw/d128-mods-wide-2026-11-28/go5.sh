# Call 5 (H200): where the d128 blocks + bias forward's time goes now (128-key tiles), against
# the mask-only kernel on the same blocks: ncu speed of light, warp states, schedulers, pipes.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
B=$here/bin/dmattn-bench
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy"
timeout 150 ncu -k "regex:dmattn_fwd_sm90_bf16_d128_mods$" --launch-skip 2 --launch-count 1 $S --csv $B --out /tmp/n1 --groups llm --only "d128/s8192/blocks128x50%+bias" --reps 3 --impls dmattn > $OUT/ncu-blocks-bias.csv 2>$OUT/e1.txt; echo "ncu blocks+bias rc=$?"
timeout 150 ncu -k "regex:dmattn_fwd_sm90_bf16_d128_mask$" --launch-skip 2 --launch-count 1 $S --csv $B --out /tmp/n2 --groups llm --only "d128/s8192/blocks128x50%" --reps 3 --impls dmattn > $OUT/ncu-blocks.csv 2>$OUT/e2.txt; echo "ncu blocks rc=$?"
wc -l $OUT/*.csv
