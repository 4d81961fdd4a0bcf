source .gpu-pack/lib.sh
T=440 run gpu_decode packed_decode each_decode_kernel > $OUT/s1.txt 2>&1 &
T=440 run gpu_varlen > $OUT/s2.txt 2>&1 &
(for tool in memcheck racecheck; do timeout 220 compute-sanitizer --tool $tool --print-limit 10 $here/bin/test-tests-gpu_decode each_decode_kernel --test-threads=1 > $OUT/san-$tool.log 2>&1; echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san-$tool.log | tail -1)"; done) > $OUT/s3.txt 2>&1 &
wait
cat $OUT/s1.txt $OUT/s2.txt $OUT/s3.txt
