# Call 3 (H100): the masked decode batch (contiguous and paged) with the peers in the same run,
# on this build (930f371): run.sh bench, then `cargo xtask bench --from` here.
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
bash .gpu-pack/run.sh bench --groups varlen --only keyfrac > /tmp/run.log 2>&1; echo "bench rc=$?"
grep -E "^  (dmattn|flex|sdpa|fa2)" /tmp/run.log | head -20
tail -5 /tmp/run.log
