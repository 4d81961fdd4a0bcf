# Call 5: where the landed d64 dense backward's time goes now, beside d128's (ncu at its locked
# clocks, one launch each, PC sampling by SASS instruction), and cuDNN's backward kernels' launch
# shape (threads, registers, shared memory, grid) on the d64 8K row.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
B=.gpu-pack/bin/dmattn-bench
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section SourceCounters --import-source no"
prof() { local tag=$1 k=$2 grp=$3 only=$4; s=$(date +%s)
  timeout 100 ncu -k "regex:$k" --launch-skip 1 --launch-count 1 $S -o /tmp/rep-$tag $B --out /tmp/n-$tag --groups $grp --only "$only" --reps 1 --impls dmattn > $OUT/ncu-$tag.log 2>&1
  echo "ncu $tag rc=$? $(( $(date +%s)-s ))s"
  ncu -i /tmp/rep-$tag.ncu-rep --page details > $R/details-$tag.txt 2>&1
  ncu -i /tmp/rep-$tag.ncu-rep --page source --csv --print-source sass > $R/sass-$tag.csv 2>&1
}
prof bwd-d64 'dmattn_bwd_sm90_bf16_d64$' llm-d64 "d64/s8192/dense"
prof bwd-d128 'dmattn_bwd_sm90_bf16_d128$' llm "d128/s8192/dense"
s=$(date +%s); timeout 90 $B --out /tmp/c --groups llm-d64 --only "d64/s8192/dense" --impls dmattn --reps 1 > /dev/null 2>&1
timeout 90 ncu -k "regex:(?i)(bprop|bwd|backward|dgrad|dq|dkdv)" --launch-count 4 --section LaunchStats --section Occupancy --section SpeedOfLight python3 .gpu-pack/peers.py --cases /tmp/c/cases.json --out /tmp/c/peers.json --impls sdpa-cudnn > $R/ncu-cudnn.txt 2>&1
echo "cudnn rc=$? $(( $(date +%s)-s ))s"
gzip -f $R/sass-*.csv; ls -la $R
