# Next session's first call (not run): branch wip-bias-late against main on the masked decode
# batch, then gpu_decode on the branch. Before it, here:
#   git checkout wip-bias-late && cargo +stable xtask gpu-pack && \
#     tar -xJf .gpu-pack/bin.tar.xz -C /tmp bin/dmattn-bench && xz -c /tmp/bin/dmattn-bench > /tmp/bench-late.xz
#   git checkout main && cargo +stable xtask gpu-pack   # main's tests and bench, or the branch's if it wins
#   cp /tmp/bench-late.xz .gpu-pack/ && cp bench/results/raw/decode-paged-gap-2026-11-28/go-next.sh .gpu-pack/
# then `run` with carry [".gpu-pack"], kind nvidia-h100-x1: bash .gpu-pack/go-next.sh
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
ab 2 keyfrac main=$here/bin/dmattn-bench late=$(bench_at $here/bench-late.xz)
T=300 run gpu_decode
