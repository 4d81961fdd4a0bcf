//! `cargo xtask gpu-pack`: everything the GPU suite needs, built here, in one folder that runs on
//! a GPU machine with no Rust toolchain (`bash <out>/run.sh`).
use crate::{cargo, root};
use std::path::Path;
use std::process::Stdio;

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs dmattn's packed GPU suite. `run.sh tests` (default), `run.sh bench [dmattn-bench args]`,
# `run.sh all`. Test logs go beside this script; the benchmark's files (cases.json, dmattn.json,
# peers.json and their logs; bench/SCHEMA.md) go to $OUT when set (the device tool's output
# folder), else to results/ beside this script: `cargo xtask bench --from <that folder>` reports them.
set -u
here=$(cd "$(dirname "$0")" && pwd)
logs=$here/logs; mkdir -p "$logs"
results=${OUT:-$here/results}; mkdir -p "$results"
what=${1:-tests}; shift || true
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

pub fn run(out: &Path) -> Result<(), String> {
    let out = root().join(out);
    let bin = out.join("bin");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&bin).map_err(|e| e.to_string())?;

    // Test executables, as cargo reports them.
    let output = cargo()
        .args(["test", "--release", "--workspace", "--no-run", "--message-format=json"])
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err("building the tests failed".into());
    }
    let mut tests = 0;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(exe), Some(true)) = (msg["executable"].as_str(), msg["profile"]["test"].as_bool()) else { continue };
        let target = msg["target"]["name"].as_str().unwrap_or("unknown");
        let package = msg["package_id"].as_str().unwrap_or("").rsplit('/').next().unwrap_or("").split(['#', '@']).next().unwrap_or("");
        let name = format!("test-{package}-{target}");
        std::fs::copy(exe, bin.join(&name)).map_err(|e| format!("{exe}: {e}"))?;
        tests += 1;
    }
    crate::run(cargo().args(["build", "--release", "-p", "dmattn-bench"]))?;
    std::fs::copy(root().join("target/release/dmattn-bench"), bin.join("dmattn-bench")).map_err(|e| e.to_string())?;
    for module in dmattn_ptx_builder::MODULES {
        std::fs::write(out.join(module.file()), crate::ptx::embedded(&module)?).map_err(|e| e.to_string())?;
    }
    std::fs::copy(root().join("bench/peers.py"), out.join("peers.py")).map_err(|e| format!("bench/peers.py: {e}"))?;
    std::fs::write(out.join("run.sh"), RUN_SH).map_err(|e| e.to_string())?;
    println!("packed {tests} test binaries, dmattn-bench and peers.py into {}: run `bash {}/run.sh [tests|bench|all]` on a GPU machine", out.display(), out.display());
    Ok(())
}
