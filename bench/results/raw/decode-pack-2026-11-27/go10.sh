# Last short call: the shipped pack (8-byte loads, a word at a time) under memcheck on the key-side
# mask layouts (16 heads: the 8-byte path; 8 over a decoding batch), and 400 packed decode cases
# (page sizes 1-256).
source .gpu-pack/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
DMATTN_GPU_CASES=4 timeout 75 compute-sanitizer --tool memcheck --print-limit 10 $here/bin/test-tests-gpu_varlen varlen_masks_in_every_layout --test-threads=1 > $OUT/san-memcheck.log 2>&1; echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/san-memcheck.log | tail -1)" | tee $OUT/tests.txt
DMATTN_GPU_CASES=400 T=55 run gpu_decode packed_decode_matches_reference 2>&1 | tee -a $OUT/tests.txt
