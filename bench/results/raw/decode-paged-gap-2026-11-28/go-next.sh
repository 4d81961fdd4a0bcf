# Next session's first call (not run): branch wip-bias-late against main on the masked decode
# batch, then gpu_decode on the branch's build. Before it, here:
#   cargo +stable xtask gpu-pack                         # on main
#   tar -xJf .gpu-pack/bin.tar.xz -C /tmp bin/dmattn-bench && xz -c /tmp/bin/dmattn-bench > /tmp/bench-main.xz
#   git checkout wip-bias-late && git merge main && cargo +stable xtask gpu-pack
#   cp /tmp/bench-main.xz bench/results/raw/decode-paged-gap-2026-11-28/go-next.sh .gpu-pack/
# then `run` with carry [".gpu-pack"], kind nvidia-h100-x1: bash .gpu-pack/go-next.sh
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
ab 2 keyfrac main=$(bench_at $here/bench-main.xz) late=$here/bin/dmattn-bench
T=300 run gpu_decode
