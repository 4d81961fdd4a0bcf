//! `cargo xtask gpu-pack`: everything the GPU suite needs, built here, in one folder that runs on
//! a GPU machine with no Rust toolchain (`bash <out>/run.sh`).
use crate::{cargo, root};
use std::path::Path;
use std::process::Stdio;

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs dmattn's packed GPU suite. `run.sh tests` (default), `run.sh bench [dmattn-bench args]`,
# `run.sh sanitize` (compute-sanitizer memcheck and racecheck on small cases of every kernel the
# gather, sparse and packed-batch suites launch), `run.sh all` (tests and bench). Test logs go beside this script; the benchmark's files (cases.json, dmattn.json,
# peers.json and their logs; bench/SCHEMA.md) go to $OUT when set (the device tool's output
# folder), else to results/ beside this script: `cargo xtask bench --from <that folder>` reports them.
set -u
here=$(cd "$(dirname "$0")" && pwd)
logs=$here/logs; mkdir -p "$logs"
results=${OUT:-$here/results}; mkdir -p "$results"
what=${1:-tests}; shift || true
# The binaries travel stripped and xz-compressed (each embeds the PTX as text).
if [ -f "$here/bin.tar.xz" ] && [ ! -d "$here/bin" ]; then tar -xJf "$here/bin.tar.xz" -C "$here"; fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader || true
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  for t in "$here"/bin/test-*; do
    name=$(basename "$t")
    start=$(date +%s)
    # A hung GPU test must not eat the whole session: each binary gets ${DMATTN_TEST_TIMEOUT:-400} s.
    timeout "${DMATTN_TEST_TIMEOUT:-400}" "$t" --test-threads=4 > "$logs/$name.log" 2>&1; rc=$?
    # On a GPU machine a skipped GPU test is a failure.
    if grep -q "SKIPPED" "$logs/$name.log"; then rc=99; fi
    printf '%-40s %s (%ss)\n' "$name" "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")" $(( $(date +%s) - start ))
    if [ $rc != 0 ]; then status=1; tail -n 60 "$logs/$name.log"; fi
  done
  # The candle feature's test and example (`gpu-pack --candle`), compressed to travel.
  if [ -f "$here/candle.tar.xz" ]; then
    tar -xJf "$here/candle.tar.xz" -C "$here"
    for t in "$here"/candle/*; do
      name=$(basename "$t")
      timeout "${DMATTN_TEST_TIMEOUT:-400}" "$t" > "$logs/$name.log" 2>&1; rc=$?
      if grep -q "SKIPPED" "$logs/$name.log"; then rc=99; fi
      printf '%-40s %s\n' "$name" "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")"
      if [ $rc != 0 ]; then status=1; fi
      tail -n 3 "$logs/$name.log"
    done
  fi
fi
if [ "$what" = sanitize ]; then
  # Each forward kernel once; a few small property cases each: every gather kernel (compaction, gathers, gathered mask,
  # scatter, index lists, per-query lists sorted and their forward) and the attention kernels they feed, forward and backward; long keys
  # for the compaction's several chunks, the key-side bias read at the listed keys and the split
  # combine; packed batches, their backward and paged K/V; the decoding kernels.
  for tool in memcheck racecheck; do
    for t in "gpu_forward each_forward_kernel" "gpu_gather gather_backward_matches index_lists per_query_lists_match window_lists out_of_range long_keys" "gpu_backward split_query_backward" "gpu_sparse sparse_backward_matches sparse_split_backward" "gpu_select gpu_selection long_rows many_rows wide_selection" "gpu_varlen varlen_backward_matches varlen_masks_in_every_layout paged_forward_matches paged_table_from_device_tensor lean_packed" "gpu_decode each_decode_kernel packed_decode"; do
      set -- $t; bin=$1; shift
      DMATTN_GPU_CASES=${DMATTN_SANITIZE_CASES:-4} timeout "${DMATTN_TEST_TIMEOUT:-400}" compute-sanitizer --tool $tool --print-limit 10 \
        "$here/bin/test-tests-$bin" "$@" --test-threads=1 > "$logs/sanitize-$tool-$bin.log" 2>&1; rc=$?
      summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$logs/sanitize-$tool-$bin.log" | tail -n 1)
      printf '%-40s %s %s\n' "$tool $bin" "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")" "$summary"
      case "$summary" in *"SUMMARY: 0 "*) ;; *) status=1; grep -E "Error:|Race reported" "$logs/sanitize-$tool-$bin.log" | head -n 10;; esac
      [ $rc = 0 ] || status=1
    done
  done
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  "$here/bin/dmattn-bench" --out "$results" "$@" 2>&1 | tee "$results/dmattn-bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  # The PyTorch peers on the same cases, where python3 has torch with CUDA.
  if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    PYTHONUNBUFFERED=1 python3 "$here/peers.py" --cases "$results/cases.json" --out "$results/peers.json" 2>&1 | tee "$results/peers.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  else
    echo "no PyTorch with CUDA: peers not run"
  fi
fi
exit $status
"#;

/// Helpers for a one-call GPU script (`source .gpu-pack/lib.sh`), its logs in `$OUT` (the device
/// tool's output folder): the sessions wrote these again for each call.
const LIB_SH: &str = r#"# Helpers for a one-call GPU script: `source <pack>/lib.sh`, then
#   run BIN [filters]          a test binary (`gpu_decode`): its result line, failures, rc; T: timeout (s, 500)
#   san BIN [filters]          memcheck then racecheck on it; SC: property cases (4), T: timeout
#   bench_at FILE.xz           unpacks another build's dmattn-bench (xz) and prints its path
#   ab ROUNDS ONLY NAME=BENCH.. each bench binary in turn, ROUNDS times, over the cases whose ids
#                              contain ONLY (`--only`), dmattn alone; G: groups (varlen), T: timeout
#                              a process (90); prints one line a process, writes $OUT/ab.txt
# Logs go to $OUT (else logs/ beside this file).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-$here/logs}; mkdir -p "$OUT"
[ -d "$here/bin" ] || tar -xJf "$here/bin.tar.xz" -C "$here"
run() {
  local bin=$1; shift; local s=$(date +%s)
  timeout "${T:-500}" "$here/bin/test-tests-$bin" "$@" --test-threads=4 > "$OUT/$bin.log" 2>&1; local rc=$?
  echo "$bin rc=$rc $(( $(date +%s) - s ))s $(grep -E '^test result' "$OUT/$bin.log" | tail -n 1)"
  grep -E "SKIPPED|FAILED|panicked" "$OUT/$bin.log" | head -n 5
  [ $rc = 0 ] || tail -n 30 "$OUT/$bin.log"
  return $rc
}
san() {
  local bin=$1; shift
  for tool in memcheck racecheck; do
    DMATTN_GPU_CASES=${SC:-4} timeout "${T:-500}" compute-sanitizer --tool $tool --print-limit 10 "$here/bin/test-tests-$bin" "$@" --test-threads=1 > "$OUT/san-$tool-$bin.log" 2>&1
    echo "$tool $bin rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$tool-$bin.log" | tail -n 1)"
  done
}
bench_at() {
  local to=/tmp/$(basename "$1" .xz); xz -dc "$1" > "$to" && chmod +x "$to" && echo "$to"
}
ab() {
  local rounds=$1 only=$2; shift 2
  for r in $(seq "$rounds"); do
    for pair in "$@"; do
      local name=${pair%%=*} bin=${pair#*=} s=$(date +%s)
      timeout "${T:-90}" "$bin" --out "/tmp/ab-$name-$r" --groups "${G:-varlen}" --only "$only" --impls dmattn > "$OUT/bench-$name-$r.log" 2>&1
      echo "$name #$r ($(( $(date +%s) - s ))s): $(grep -E '^  dmattn' "$OUT/bench-$name-$r.log" | awk '{print $2, $3}' | tr '\n' ' ')"
    done
  done | tee "$OUT/ab.txt"
}
"#;

pub fn run(out: &Path, candle: bool, ptx: bool) -> Result<(), String> {
    let out = root().join(out);
    let bin = out.join("bin");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&bin).map_err(|e| e.to_string())?;

    let mut tests = 0;
    for (name, exe) in build_tests(&["--workspace"]).map_err(|e| format!("building the tests failed: {e}"))? {
        std::fs::copy(&exe, bin.join(&name)).map_err(|e| format!("{exe}: {e}"))?;
        tests += 1;
    }
    if candle {
        pack_candle(&out)?;
    }
    crate::run(cargo().args(["build", "--release", "-p", "dmattn-bench"]))?;
    std::fs::copy(root().join("target/release/dmattn-bench"), bin.join("dmattn-bench")).map_err(|e| e.to_string())?;
    // Each binary embeds the PTX as text (26 MB): stripped and compressed, the pack travels
    // within the device tool's 64 MiB.
    strip_and_compress(&out, "bin")?;
    // The PTX text, for ptxas or cuobjdump there (`--ptx`): gzipped it is 18 MB, which with
    // the binaries passes the device tool's 64 MiB.
    if ptx {
        for module in dmattn_ptx_builder::MODULES {
            let path = out.join(module.file());
            std::fs::write(&path, crate::ptx::embedded(&module)?).map_err(|e| e.to_string())?;
            crate::run(std::process::Command::new("gzip").arg("-9f").arg(&path))?;
        }
    }
    std::fs::copy(root().join("bench/peers.py"), out.join("peers.py")).map_err(|e| format!("bench/peers.py: {e}"))?;
    std::fs::write(out.join("run.sh"), RUN_SH).map_err(|e| e.to_string())?;
    std::fs::write(out.join("lib.sh"), LIB_SH).map_err(|e| e.to_string())?;
    println!("packed {tests} test binaries{}, dmattn-bench (in bin.tar.xz), peers.py and lib.sh into {}: run `bash {}/run.sh [tests|bench|all]` on a GPU machine, or a script that sources lib.sh", if candle { " (and the candle feature's)" } else { "" }, out.display(), out.display());
    Ok(())
}

/// Builds the tests `cargo test --release --no-run <args>` selects: (name, path) of each
/// executable, as cargo reports them.
fn build_tests(args: &[&str]) -> Result<Vec<(String, String)>, String> {
    let output = cargo()
        .args(["test", "--release", "--no-run", "--message-format=json"])
        .args(args)
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(format!("cargo test {} exited with {}", args.join(" "), output.status));
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(exe), Some(true)) = (msg["executable"].as_str(), msg["profile"]["test"].as_bool()) else { continue };
        let target = msg["target"]["name"].as_str().unwrap_or("unknown");
        let package = msg["package_id"].as_str().unwrap_or("").rsplit('/').next().unwrap_or("").split(['#', '@']).next().unwrap_or("");
        found.push((format!("test-{package}-{target}"), exe.to_string()));
    }
    Ok(found)
}

/// The `candle` feature's test and example, built on their own (they link the CUDA libraries,
/// and ~50 MB each with candle's kernels), stripped and xz-compressed into `candle.tar.xz`.
fn pack_candle(out: &Path) -> Result<(), String> {
    let features = ["--features", "candle"];
    let mut files = build_tests(&["-p", "dmattn", "--test", "candle_op", "--features", "candle"])
        .map_err(|e| format!("building the candle test failed (did you `eval \"$(bash .ci/cuda-for-candle.sh)\"`?): {e}"))?;
    crate::run(cargo().args(["build", "--release", "-p", "dmattn", "--example", "candle_train"]).args(features))?;
    let dir = out.join("candle");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    files.push(("example-candle_train".into(), root().join("target/release/examples/candle_train").display().to_string()));
    for (name, exe) in files {
        std::fs::copy(&exe, dir.join(&name)).map_err(|e| format!("{exe}: {e}"))?;
    }
    strip_and_compress(out, "candle")
}

/// Strips every binary in `out/<dir>` and replaces the folder with `out/<dir>.tar.xz`, which
/// `run.sh` unpacks.
fn strip_and_compress(out: &Path, dir: &str) -> Result<(), String> {
    let path = out.join(dir);
    for entry in std::fs::read_dir(&path).map_err(|e| e.to_string())? {
        crate::run(std::process::Command::new("strip").arg(entry.map_err(|e| e.to_string())?.path()))?;
    }
    let archive = out.join(format!("{dir}.tar.xz"));
    crate::run(std::process::Command::new("tar").env("XZ_OPT", "-3 -T0").arg("-cJf").arg(archive).arg("-C").arg(out).arg(dir))?;
    std::fs::remove_dir_all(&path).map_err(|e| e.to_string())
}
