# Call 6: the landed build F (1f1c998; its kernels are L's but for one load in seq::localize, the
# packed-batch path): gpu_varlen's backward tests, then memcheck and racecheck on 10
# backward_matches_reference cases and 4 varlen_backward_matches_reference cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
T=200 run gpu_varlen backward | tee $R/tests.txt
SC=10 T=60 san gpu_backward backward_matches_reference --exact | tee $R/sanitizer.txt
SC=4 T=60 san gpu_varlen varlen_backward_matches_reference --exact | tee -a $R/sanitizer.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls $R
