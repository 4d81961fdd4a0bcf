# Call 2: where the time goes, main's kernels (G = eb43c39): ncu (its locked clocks) with PC
# sampling by SASS instruction, warp states, schedulers and pipes, one launch each: the d64
# warp-specialised modifier forward on 50 % blocks + bias and the mask-only one on the same
# blocks (8K), the d64 dense backward (8K, 128-row tile) and the d128 dense backward (4K).
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
G=$(bench_at .gpu-pack/bench-G.xz)
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SourceCounters --import-source no"
prof() { local tag=$1 k=$2 grp=$3 only=$4; s=$(date +%s)
  timeout 150 ncu -k "regex:$k" --launch-skip 1 --launch-count 1 $S -o /tmp/rep-$tag $G --out /tmp/n-$tag --groups $grp --only "$only" --reps 1 --impls dmattn > $OUT/ncu-$tag.log 2>&1
  echo "ncu $tag rc=$? $(( $(date +%s)-s ))s"
  ncu -i /tmp/rep-$tag.ncu-rep --page details > $OUT/details-$tag.txt 2>&1
  ncu -i /tmp/rep-$tag.ncu-rep --page source --csv --print-source sass > $OUT/sass-$tag.csv 2>&1
}
prof fwd-bias dmattn_fwd_sm90_bf16_d64_mods_ws llm-d64 "d64/s8192/blocks128x50%+bias"
prof fwd-mask 'dmattn_fwd_sm90_bf16_d64_mask$' llm-d64 "d64/s8192/blocks128x50%"
prof bwd-d64 'dmattn_bwd_sm90_bf16_d64$' llm-d64 "d64/s8192/dense"
prof bwd-d128 'dmattn_bwd_sm90_bf16_d128$' llm "d128/s4096/dense"
ls -la $OUT
cd /tmp && tar czf $R/prof.tgz L 2>/dev/null; ls -la $R
