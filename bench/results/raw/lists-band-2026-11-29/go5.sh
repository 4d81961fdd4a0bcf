# Call 5: the review's changes (window lists keep the checks of lists; the property test with
# sinks and compressed causal; 9,000-key rows): the full gpu_gather.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
T=320 run gpu_gather | tee $R/tests.txt
cp $OUT/*.log $R/ 2>/dev/null; true
