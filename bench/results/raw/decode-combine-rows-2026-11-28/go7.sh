# Call 7 (H200): next-step data for issue 17's window-list ratio: the window-shaped lists'
# forward (32K, w 1024, b1 h2 d64) and the key-side top-1024 forward under ncu (speed of light,
# occupancy, launch stats), dmattn alone, one timed call each after warm-up.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
B=$here/bin/dmattn-bench
timeout 100 ncu -k "regex:fwd_(sm90_)?bf16" --launch-skip 3 --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats --csv $B --out /tmp/n1 --groups indices --only "q32768/k32768/causal+lists1024-window" --reps 3 --impls dmattn > $OUT/ncu-window.csv 2>/tmp/e1; echo "ncu window rc=$?"
timeout 100 ncu -k "regex:fwd_(sm90_)?bf16" --launch-skip 3 --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats --csv $B --out /tmp/n2 --groups gather --only "d64/q32768" --reps 3 --impls dmattn > $OUT/ncu-keyside.csv 2>/tmp/e2; echo "ncu keyside rc=$?"
