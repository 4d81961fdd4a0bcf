# Call 2: the build to land (L: the backward's parameter copy read with ld.shared, but in the
# Hopper d128 bias kernels): every GPU suite that runs a backward, in parallel; then memcheck
# and racecheck on 10 backward_matches_reference cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
i=0; for t in gpu_backward gpu_gather gpu_varlen gpu_sparse gpu_smoke; do i=$((i+1)); T=420 run $t > /tmp/t-$i.txt 2>&1 & done
wait
cat /tmp/t-*.txt | tee $R/tests.txt
SC=10 T=150 san gpu_backward backward_matches_reference --exact | tee $R/sanitizer.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls $R
