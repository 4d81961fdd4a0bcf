#!/usr/bin/env bash
# What building dmattn's `candle` feature needs on a machine without a CUDA toolkit, from PyPI's
# CUDA 13 wheels: nvcc (candle's kernels are compiled at build time) and the CUDA libraries candle
# links (unversioned names, as the linker wants them; libcuda as a stub generated from cudarc's
# driver declarations: the real one is the GPU machine's driver). Installs into $1 (default
# target/cuda-for-candle) and prints the environment for the build: `eval "$(bash .ci/cuda-for-candle.sh)"`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/target/cuda-for-candle}
mkdir -p "$dir"
if [ ! -x "$dir/nvidia/cu13/bin/nvcc" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --target "$dir" \
    nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.88 \
    nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88 "nvidia-cublas>=13,<14" "nvidia-curand>=10.4,<11" >&2
fi
cuda=$dir/nvidia/cu13
link=$dir/link/lib64
mkdir -p "$link"
for l in cublas cublasLt nvrtc cudart; do ln -sf "$cuda/lib/lib$l.so.13" "$link/lib$l.so"; done
ln -sf "$cuda/lib/libcurand.so.10" "$link/libcurand.so"
cudarc=$(cd "$root" && cargo +stable metadata --format-version 1 | python3 -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc").rsplit("/", 1)[0])')
grep -oP '^\s+fn \Kcu\w+(?=\()' "$cudarc/src/driver/sys/mod.rs" | sort -u | awk '{print "void " $1 "(void) {}"}' > "$link/libcuda-stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$link/libcuda.so" "$link/libcuda-stub.c"
# CUDA_ROOT: where cudarc looks for the libraries (lib64); NVCC and CUDA_COMPUTE_CAP: candle's
# kernels, for the H100/H200 (sm_90; no GPU here to ask).
echo "export NVCC=$cuda/bin/nvcc CUDA_ROOT=$dir/link CUDA_COMPUTE_CAP=\${CUDA_COMPUTE_CAP:-90} CUDAFORGE_THREADS=\$(nproc)"
