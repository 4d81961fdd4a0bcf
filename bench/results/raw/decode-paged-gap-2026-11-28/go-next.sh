# Next session's first call (not run): the two untested decoding branches against main on the
# masked decode batch, alternating twice. Before it, here (each branch: merge main, then pack):
#   for b in wip-bias-late wip-lookup-in-copies; do git checkout $b && git merge -q main && \
#     cargo +stable xtask gpu-pack && tar -xJf .gpu-pack/bin.tar.xz -C /tmp bin/dmattn-bench && \
#     xz -c /tmp/bin/dmattn-bench > /tmp/bench-$b.xz; done
#   git checkout main && cargo +stable xtask gpu-pack && cp /tmp/bench-wip-*.xz .gpu-pack/
#   cp bench/results/raw/decode-paged-gap-2026-11-28/go-next.sh .gpu-pack/
# then `run` with carry [".gpu-pack"], kind nvidia-h100-x1: bash .gpu-pack/go-next.sh
# The winner (if any) then needs its own pack and `run gpu_decode`, `run gpu_varlen paged`, and
# `san gpu_decode each_decode_kernel` before it lands (both change the decoding kernel only).
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
ab 2 keyfrac main=$here/bin/dmattn-bench late=$(bench_at $here/bench-wip-bias-late.xz) lookup=$(bench_at $here/bench-wip-lookup-in-copies.xz)
