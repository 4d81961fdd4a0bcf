# Call 5: this build with the peers in one run: the gathered rows, d64 dense and causal (the
# kernels ptxas no longer serialises), compressed causal and its dense-mask form.
R=$OUT; OUT=/tmp/L; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
[ -d .gpu-pack/bin ] || tar -xJf .gpu-pack/bin.tar.xz -C .gpu-pack
D=$R/run; mkdir -p $D
timeout 200 .gpu-pack/bin/dmattn-bench --out $D --groups gather,llm-d64,sparse --only "gather/,d64/s8192/dense,d64/s8192/causal,compress" > $R/dmattn-bench.log 2>&1; echo "bench rc=$?"
timeout 280 python3 .gpu-pack/peers.py --cases $D/cases.json --out $D/peers.json --impls flex,sdpa-cudnn,sdpa-flash,fa2-kept-keys > $R/peers.log 2>&1; echo "peers rc=$?"
tail -5 $R/peers.log; ls $D
