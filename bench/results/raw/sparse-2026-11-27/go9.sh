source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
B=$here/bin/dmattn-bench
$B --out $OUT --groups sparse --impls dmattn > $OUT/dmattn-bench.log 2>&1; echo bench rc=$?
grep -E "^sparse| (fwd|bwd) " $OUT/dmattn-bench.log
PYTHONUNBUFFERED=1 timeout 330 python3 $here/peers.py --cases $OUT/cases.json --out $OUT/peers.json --impls flex,sdpa-cudnn > $OUT/peers.log 2>&1; echo peers rc=$?
grep -E " (fwd|bwd):" $OUT/peers.log
