//! `cargo xtask <task>`: the project's tasks.
mod bench;
mod demo;
mod pack;
mod plot;
mod ptx;
mod ptxas;
mod ptxdiff;
mod report;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::{Command, ExitCode};

#[derive(Parser)]
#[command(about = "dmattn project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Masked, biased, causal attention on the GPU if there is one (else the CPU), checked
    /// against the f64 reference.
    Demo,
    /// Rebuilds the committed PTX modules (host/ptx) from the kernel sources with the pinned
    /// nightly (installed through rustup where missing).
    Ptx {
        /// Only check that the committed modules are that build, byte for byte.
        #[arg(long)]
        check: bool,
    },
    /// Compares the committed PTX (host/ptx, after `ptx`) with the modules committed at `--base`,
    /// kernel by kernel: unchanged, renumbered (registers and labels only), reordered, or the
    /// instruction counts and opcodes that changed.
    PtxDiff {
        #[arg(long, default_value = "HEAD")]
        base: String,
    },
    /// Assembles the PTX with ptxas for each architecture (the Hopper module for sm_90a) and
    /// fails on register spills.
    Ptxas {
        /// The ptxas to use (default: $PTXAS, `ptxas` on PATH, or the one in Python's
        /// nvidia-cuda-nvcc-cu12 package).
        #[arg(long)]
        ptxas: Option<PathBuf>,
        #[arg(long, value_delimiter = ',', default_value = "sm_80,sm_90")]
        arch: Vec<String>,
    },
    /// Builds the test and bench binaries and writes a folder that runs the GPU suite on a
    /// machine with a GPU and no Rust toolchain: `bash <out>/run.sh [tests|bench|all]`, or a
    /// script of one's own that sources `<out>/lib.sh` (`run`, `san`, `ab` helpers).
    GpuPack {
        #[arg(long, default_value = ".gpu-pack")]
        out: PathBuf,
        /// Also the `candle` feature's test and example (built apart: they link CUDA, which the
        /// rest of the suite does not), after `eval "$(bash .ci/cuda-for-candle.sh)"`.
        #[arg(long)]
        candle: bool,
        /// Also the PTX text of each module, gzipped (18 MB: the pack then passes the device
        /// tool's 64 MiB).
        #[arg(long)]
        ptx: bool,
    },
    /// Times dmattn, its cuBLAS baseline and the PyTorch peers on this machine's GPU and writes
    /// markdown tables and a plot under bench/results/ (case grid and files: bench/SCHEMA.md).
    Bench {
        /// A few sizes per group (about two minutes).
        #[arg(long)]
        quick: bool,
        /// Case groups (default: all).
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
        /// Report the run in these folders (cases.json, dmattn.json, peers.json, e.g. from the
        /// packed `run.sh bench` on a GPU machine; several when a grid was split across runs)
        /// instead of measuring here.
        #[arg(long, value_delimiter = ',')]
        from: Vec<PathBuf>,
        /// Where the tables, plot and raw files go.
        #[arg(long, default_value = "bench/results")]
        results: PathBuf,
        /// TrueType font for the plot's text (default: DejaVu Sans or Liberation Sans if installed).
        #[arg(long)]
        font: Option<PathBuf>,
    },
}

/// The workspace root (xtask's parent).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Runs `cmd` in the workspace root, failing with its status.
fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.current_dir(root()).status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{cmd:?} failed: {status}")) }
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn main() -> ExitCode {
    // `cargo xtask ptx` builds the kernels, and rustc calls this program back as their linker.
    if let Some(code) = dmattn_ptx_builder::link_if_invoked() {
        return code;
    }
    let result = match Cli::parse().task {
        Task::Demo => demo::run(),
        Task::Ptx { check } => ptx::run(check),
        Task::PtxDiff { base } => ptxdiff::run(&base),
        Task::Ptxas { ptxas, arch } => ptxas::run(ptxas, &arch),
        Task::GpuPack { out, candle, ptx } => pack::run(&out, candle, ptx),
        Task::Bench { quick, groups, from, results, font } => bench::run(&bench::Options { quick, groups, from, results, font }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
