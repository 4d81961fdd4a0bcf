here=$(pwd)/.gpu-pack
[ -d $here/bin ] || tar -xJf $here/bin.tar.xz -C $here
run() { local bin=$1; shift; local s=$(date +%s); timeout ${T:-500} $here/bin/test-tests-$bin "$@" --test-threads=4 > $OUT/$bin.log 2>&1; local rc=$?; echo "$bin rc=$rc $(( $(date +%s)-s ))s $(grep -E '^test result' $OUT/$bin.log | tail -1)"; grep -E "SKIPPED|FAILED|panicked" $OUT/$bin.log | head -5; [ $rc = 0 ] || tail -30 $OUT/$bin.log; }
san() { local bin=$1; shift; for tool in memcheck racecheck; do DMATTN_GPU_CASES=${SC:-4} timeout ${T:-500} compute-sanitizer --tool $tool --print-limit 10 $here/bin/test-tests-$bin "$@" --test-threads=1 > $OUT/san-$tool-$bin.log 2>&1; echo "$tool $bin rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san-$tool-$bin.log | tail -1)"; done; }
