# Call 4: same-run figures with the peers on the blocked-dQ build (the host fix included): the LLM
# rows (d128, d64), the sparse group's d128 rows, the gather group; dmattn-bench then peers.py.
R=$OUT; mkdir -p /tmp/b
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
[ -d .gpu-pack/bin ] || tar -xJf .gpu-pack/bin.tar.xz -C .gpu-pack
timeout 200 .gpu-pack/bin/dmattn-bench --out /tmp/b --groups llm,llm-d64,sparse,gather --only "d128/s8192,d64/s8192,d128/q8192/k8192/b,d128/q16384/k4096,d128/q16384/k256,d128/q16384/k16384,gather/d" --impls dmattn > /tmp/b/dmattn-bench.log 2>&1; echo "bench rc=$?"
PYTHONUNBUFFERED=1 timeout 330 python3 .gpu-pack/peers.py --cases /tmp/b/cases.json --out /tmp/b/peers.json --impls flex,sdpa-cudnn,sdpa-flash,fa2-kept-keys > /tmp/b/peers.log 2>&1; echo "peers rc=$?"
tar czf $R/b.tgz -C /tmp b; ls $R
