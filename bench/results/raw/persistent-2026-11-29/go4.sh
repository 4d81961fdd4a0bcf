# Call 4: call 3's peers did not come back (too many files); the same-run report again: this
# build's dmattn rows (call 3's cases) and the peers (FlexAttention, cuDNN), all in one archive.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT /tmp/run
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > /tmp/run/gpu.txt
ONLY="s1024/dense,s1024/causal,s8192/dense,s8192/causal,compress,q16384/k16384/causal+window"
timeout 120 .gpu-pack/bin/dmattn-bench --out /tmp/run --groups llm,llm-d64,sparse --only "$ONLY" --impls dmattn --reps 10 > /tmp/run/bench.log 2>&1; echo "bench rc=$?"
timeout 240 python3 .gpu-pack/peers.py --cases /tmp/run/cases.json --out /tmp/run/peers.json --impls flex,sdpa-cudnn > /tmp/run/peers.log 2>&1; echo "peers rc=$?"
tail -n 3 /tmp/run/peers.log
tar czf $R/run.tgz -C /tmp run
