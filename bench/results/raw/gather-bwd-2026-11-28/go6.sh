# Call 6 (56823f4's build): the rest of the GPU suite on the final kernels. Besides the backward
# bias variants (gpu_backward, gpu_gather: call 5), the sm_80 module's backward and forward
# modifier kernels and the sm_90a packed modifier forwards changed in code order (the scores'
# visibility test became `WarpScores::visible_bits`); the sm_90a forward and mask kernels
# changed in register numbering only. Then memcheck and racecheck on every forward kernel.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
( T=560 run gpu_varlen ) > /tmp/t-1.txt 2>&1 &
( T=300 run gpu_decode; T=250 run gpu_forward ) > /tmp/t-2.txt 2>&1 &
( for b in gpu_sparse gpu_interop gpu_select gpu_smoke gpu_materialized readme; do T=250 run $b; done ) > /tmp/t-3.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
SC=2 T=150 san gpu_forward each_forward_kernel | tee $R/san.txt
tar czf $R/logs.tgz /tmp/L 2>/dev/null; ls $R
