# Call 7: F (call 6) under the gathered and packed backward: gpu_varlen's backward tests and
# gpu_gather's backward tests, run side by side.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $R/gpu.txt
T=300 run gpu_varlen backward > $R/t-varlen.txt 2>&1 &
T=300 run gpu_gather backward > $R/t-gather.txt 2>&1 &
wait
cat $R/t-*.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls -la $R
