//! `cargo xtask bench`: times dmattn, its cuBLAS baseline and (where PyTorch with CUDA is
//! installed) the PyTorch peers on this machine's GPU, then writes the tables and the plot under
//! `bench/results/`. `--from DIR` reports a run made elsewhere: the packed `run.sh bench` on a GPU
//! machine without Rust writes the same files.
use crate::report::{self, Run};
use crate::{cargo, root};
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Options {
    pub quick: bool,
    pub groups: Vec<String>,
    pub from: Vec<PathBuf>,
    pub results: PathBuf,
    pub font: Option<PathBuf>,
}

pub fn run(o: &Options) -> Result<(), String> {
    let dirs = if o.from.is_empty() {
        let d = root().join("target/bench-run");
        measure(&d, o)?;
        vec![d]
    } else {
        o.from.clone()
    };
    write_report(&dirs, &root().join(&o.results), o.font.as_deref())
}

/// Whether `python3` has PyTorch with a CUDA device.
fn torch_with_cuda() -> bool {
    Command::new("python3")
        .args(["-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn measure(dir: &Path, o: &Options) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    let mut bench = cargo();
    bench.args(["run", "--release", "-p", "dmattn-bench", "--", "--out"]).arg(dir);
    if o.quick {
        bench.arg("--quick");
    }
    if !o.groups.is_empty() {
        bench.arg("--groups").arg(o.groups.join(","));
    }
    crate::run(&mut bench)?;
    if !torch_with_cuda() {
        println!("no PyTorch with CUDA here: the report has dmattn's figures only");
        return Ok(());
    }
    let mut peers = Command::new("python3");
    peers.arg(root().join("bench/peers.py")).arg("--cases").arg(dir.join("cases.json")).arg("--out").arg(dir.join("peers.json"));
    // A failing peer script still leaves the cases it finished (it writes after each case).
    if let Err(e) = crate::run(&mut peers) {
        eprintln!("warning: {e}; reporting what peers.json holds");
    }
    Ok(())
}

fn write_report(dirs: &[PathBuf], results: &Path, font: Option<&Path>) -> Result<(), String> {
    let run = Run::load(dirs)?;
    // The raw files beside the report, one folder per run folder.
    let _ = std::fs::remove_dir_all(results.join("raw"));
    for (i, dir) in dirs.iter().enumerate() {
        let raw = results.join("raw").join(format!("run{}", i + 1));
        std::fs::create_dir_all(&raw).map_err(|e| format!("{}: {e}", raw.display()))?;
        for name in ["cases.json", "dmattn.json", "peers.json", "dmattn-bench.log", "peers.log"] {
            let src = dir.join(name);
            if src.exists() {
                std::fs::copy(&src, raw.join(name)).map_err(|e| format!("{}: {e}", src.display()))?;
            }
        }
    }
    const PLOT: &str = "time-vs-seqlen.png";
    crate::plot::draw(&run, &results.join(PLOT), font)?;
    let md = results.join("README.md");
    std::fs::write(&md, report::markdown(&run, Some(PLOT))).map_err(|e| format!("{}: {e}", md.display()))?;
    println!("wrote {} and {}", md.display(), results.join(PLOT).display());
    for (case, pass, d, peer, ms) in report::behind(&run).iter().take(3) {
        println!("behind: {case} {pass:?}: dmattn {d:.3} ms vs {peer} {ms:.3} ms");
    }
    Ok(())
}
