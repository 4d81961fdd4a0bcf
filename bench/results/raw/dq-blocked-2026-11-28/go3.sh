# Call 3: after the host fix (a packed batch's blocked dQ accumulator has batch stride 0, as the
# kernels index its sequences): gpu_varlen, then memcheck and racecheck on its backward cases.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
T=420 run gpu_varlen | tee $R/tests.txt
SC=2 T=120 san gpu_varlen varlen_backward_matches varlen_deterministic_backward | tee $R/san.txt
tar czf $R/logs.tgz /tmp/L 2>/dev/null; ls $R
