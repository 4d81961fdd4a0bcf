# Call 6: the GPU suite on the build to land (Z of call 4), test binaries four at a time; memcheck and
# racecheck on a forward modifier case and a backward case.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
mkdir -p .gpu-pack/bin && for f in .gpu-pack/xz/*.xz; do xz -dc $f > .gpu-pack/bin/$(basename $f .xz); chmod +x .gpu-pack/bin/$(basename $f .xz); done
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
( T=330 run gpu_backward ) > /tmp/t-1.txt 2>&1 &
( T=330 run gpu_gather ) > /tmp/t-2.txt 2>&1 &
( T=250 run gpu_forward; T=200 run gpu_sparse ) > /tmp/t-3.txt 2>&1 &
( T=250 run gpu_varlen; T=100 run gpu_interop; T=60 run gpu_smoke ) > /tmp/t-4.txt 2>&1 &
( T=300 run gpu_decode; SC=2 T=90 san gpu_forward each_forward_kernel ) > /tmp/t-5.txt 2>&1 &
wait
cat /tmp/t-*.txt | tee $R/tests.txt
cd /tmp && tar czf $R/logs.tgz L 2>/dev/null; ls $R
