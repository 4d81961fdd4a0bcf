//! `dmattn-bench`: times dmattn (and the cuBLAS materialising baseline) on the benchmark grid,
//! next to the GPU's measured ceilings, and writes `cases.json` + `dmattn.json` (SCHEMA.md) for
//! `bench/peers.py` and `cargo xtask bench`. Runs where there is no Rust toolchain (it is packed
//! by `cargo xtask gpu-pack`).
mod ceiling;
mod data;
mod memory;
mod select;
mod timing;

use clap::{Parser, ValueEnum};
use data::Operands;
use dmattn::{Device, Error, SparseMask, attention};
use dmattn_bench::cases::{Case, CaseSet, Mask, grid};
use dmattn_bench::results::{Ceilings, Pass, Record, Results, Status};
use rand::{SeedableRng, rngs::StdRng};
use select::SelectInputs;
use std::path::PathBuf;
use std::process::ExitCode;
use timing::Timer;

#[derive(Parser)]
#[command(about = "Benchmarks dmattn on the GPU (cases and result format: bench/SCHEMA.md)")]
struct Args {
    /// A few sizes per group and fewer repetitions (about two minutes with the peers).
    #[arg(long)]
    quick: bool,
    /// Timed repetitions per measurement (median reported).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Case groups to run (default: all).
    #[arg(long, value_delimiter = ',')]
    groups: Vec<String>,
    /// Implementations to time.
    #[arg(long, value_delimiter = ',', default_value = "dmattn,cublas-materialized")]
    impls: Vec<Impl>,
    /// Keep only the cases whose id contains one of these strings.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Run the cases of this cases.json instead of the built-in grid.
    #[arg(long)]
    cases: Option<PathBuf>,
    /// Folder for cases.json and dmattn.json.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// Only write cases.json (for running the peers alone); needs no GPU.
    #[arg(long)]
    cases_only: bool,
}

#[derive(Clone, Copy, PartialEq, Debug, ValueEnum)]
enum Impl {
    Dmattn,
    /// dmattn's unfused baseline: S = QKᵀ and PV on cuBLAS, S materialised (forward only).
    CublasMaterialized,
}

impl Impl {
    fn name(self) -> String {
        self.to_possible_value().unwrap().get_name().to_string()
    }
}

/// One forward call of `imp` on operand set `set`.
fn forward(imp: Impl, c: &Case, o: &Operands, set: usize) -> dmattn::Result<dmattn::Forward> {
    let mut call = attention(&o.q[set], &o.k[set], &o.v[set]).causal(c.causal);
    if let Some(m) = &o.mask {
        call = call.mask(m);
    }
    if let Some(s) = &o.sparse {
        call = call.sparse_mask(&s.prepared);
    }
    if let Some(b) = &o.bias {
        call = call.bias(b);
    }
    if let Some(s) = &o.seqlens {
        call = call.seqlens(s);
    }
    if let Some(t) = &o.pages {
        call = call.kv_pages(t);
    }
    match imp {
        Impl::Dmattn => call.forward(),
        Impl::CublasMaterialized => call.forward_materialized(),
    }
}

fn record(c: &Case, imp: Impl, pass: Pass, timed: &dmattn::Result<f64>) -> Record {
    let (status, ms, note) = match timed {
        Ok(ms) => (Status::Ok, Some(*ms), String::new()),
        Err(e) => {
            let status = match e {
                Error::Driver(d) if d.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Status::Oom,
                Error::Unsupported { .. } => Status::Unsupported,
                _ => Status::Error,
            };
            (status, None, e.to_string())
        }
    };
    Record { case: c.id.clone(), implementation: imp.name(), pass, status, ms, note, bytes: None }
}

/// The line printed for each measurement: time, and throughput against the ceilings (for a
/// `prep` record, the bytes of the prepared mask; for a `select` case, GB/s of the bias and mask
/// read, and with the output written against the copy; for a decoding case with a target against
/// the copy, `Case::copy_time_target`, the time to move its bytes at copy speed and the ratio).
fn describe(c: &Case, r: &Record, computed: f64, ceil: &Ceilings) -> String {
    let Some(ms) = r.ms else { return format!("{:?}: {}", r.status, r.note) };
    if r.pass == Pass::Prep {
        return format!("{ms:9.3} ms, {} B prepared ({})", r.bytes.unwrap_or(0), r.note);
    }
    if let Some((read, written)) = c.select_bytes() {
        let gbs = |bytes: f64| bytes / (ms * 1e-3) / 1e9;
        let moved = gbs(read + written);
        return format!("{ms:9.3} ms {:6.0} GB/s read, {moved:.0} GB/s read + written ({:.0}% of copy; {})", gbs(read), 100.0 * moved / ceil.copy_gbps, r.note);
    }
    let ceil_tflops = ceil.matmul_tflops;
    let tf = c.flops(r.pass) / (ms * 1e-3) / 1e12;
    let tc = c.computed_flops(r.pass, computed) / (ms * 1e-3) / 1e12;
    let mut s = format!("{ms:9.3} ms {tf:6.0} TF/s dense-eq ({tc:.0} computed, {:.0}% of matmul)", 100.0 * tc / ceil_tflops);
    if c.is_decode() {
        s += &format!(" {:.0} GB/s", c.fwd_bytes() / (ms * 1e-3) / 1e9);
    }
    if let Some(target) = c.copy_time_target() {
        let copy_ms = c.fwd_bytes() / (ceil.copy_gbps * 1e9) * 1e3;
        s += &format!(", {:.2}x the {copy_ms:.3} ms to move them at copy speed (target <= {target})", ms / copy_ms);
    }
    s
}

/// Times `prepare` of a sparse case's mask (median, like the calls) and records the prepared
/// form's bytes and dmattn's estimate of the speedup it buys.
fn time_prepare(c: &Case, sparse: &data::Sparse, timer: &Timer, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Record {
    let timed = timer.median_ms(stream, |_| sparse.mask.prepare(c.seqlen_q, c.seqlen_k).map(drop));
    let mut r = record(c, Impl::Dmattn, Pass::Prep, &timed);
    if r.status == Status::Ok {
        r.bytes = Some(sparse.prepared.memory_bytes() as u64);
        r.note = match sparse.prepared.estimated_speedup() {
            Ok(x) => format!("estimated speedup {x:.2}x"),
            Err(e) => format!("estimated speedup: {e}"),
        };
    }
    r
}

/// For a `key_topk` case, how dmattn runs its query-broadcast mask, read from a copy prepared
/// outside the timed calls (each timed call prepares the mask it is given itself): the keys gather
/// attention takes per plane (`PreparedMask::gathered_keys`), or that it does not.
fn gather_note(c: &Case, o: &Operands) -> Option<String> {
    let mask = o.mask.as_ref().filter(|_| matches!(c.mask, Some(Mask::KeyTopk { .. })))?;
    Some(match SparseMask::dense(mask).prepare(c.seqlen_q, c.seqlen_k) {
        Ok(p) => match p.gathered_keys() {
            Ok(Some(n)) => format!("gather attention over {n} keys per plane"),
            Ok(None) => "not run as gather attention".into(),
            Err(e) => format!("reading the gathered width back: {e}"),
        },
        Err(e) => format!("preparing a copy of the mask: {e}"),
    })
}

/// A `select` case (no attention): `select_keys` timed over the rotated bias sets, then one more
/// call whose checked rows must be the host's top-k (else the record is an error, its time in the
/// note): dmattn's one `fwd` record.
fn time_select(c: &Case, device: &Device, rng: &mut StdRng, timer: &Timer, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Record {
    let inputs = match SelectInputs::new(c, device, rng) {
        Ok(i) => i,
        Err(e) => return record(c, Impl::Dmattn, Pass::Fwd, &Err(e)),
    };
    let timed = timer.median_ms(stream, |i| inputs.call(c, i % inputs.sets()).map(drop));
    let mut r = record(c, Impl::Dmattn, Pass::Fwd, &timed);
    if let Some(ms) = r.ms {
        let sets = format!("{} bias set{}", inputs.sets(), if inputs.sets() > 1 { "s" } else { "" });
        match inputs.check(c) {
            Ok(checked) => r.note = format!("{sets}; {checked}"),
            Err(e) => (r.status, r.ms, r.note) = (Status::Error, None, format!("failed the check: {e} (timed {ms:.3} ms)")),
        }
    }
    r
}

/// Adds `extra` to a record's note.
fn add_note(r: &mut Record, extra: Option<&str>) {
    if let Some(extra) = extra {
        r.note = if r.note.is_empty() { extra.to_string() } else { format!("{}; {extra}", r.note) };
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    // Plan comparisons in one run (dmattn's testing hooks): `DMATTN_BENCH_GATHER_CHUNKS=n`, a
    // gathered backward in n query chunks (by rows, or by query heads with
    // `DMATTN_BENCH_GATHER_BY_HEADS=1`); `DMATTN_BENCH_BWD_PLACED=0|1`, the backward's
    // placement off or on wherever it could run; `DMATTN_BENCH_DECODE_CTAS=n`, decoding splits
    // for about n CTAs an SM.
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<usize>().ok());
    dmattn::force_gather_query_chunks(env("DMATTN_BENCH_GATHER_CHUNKS"), env("DMATTN_BENCH_GATHER_BY_HEADS").is_some_and(|v| v != 0));
    dmattn::force_decode_ctas_per_sm(env("DMATTN_BENCH_DECODE_CTAS"));
    dmattn::force_backward_placement(env("DMATTN_BENCH_BWD_PLACED").map(|v| v != 0));
    let mut cases = match &args.cases {
        Some(path) => serde_json::from_str::<CaseSet>(&std::fs::read_to_string(path)?)?.cases,
        None => grid(args.quick, &args.groups),
    };
    if !args.only.is_empty() {
        cases.retain(|c| args.only.iter().any(|s| c.id.contains(s.as_str())));
    }
    let timer = Timer { warmup: 3, reps: if args.quick { 7 } else { args.reps } };
    let set = CaseSet { dtype: "bf16".into(), warmup: timer.warmup, reps: timer.reps, cases };
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("cases.json"), serde_json::to_string_pretty(&set)?)?;
    if args.cases_only {
        return Ok(());
    }

    let dev = match Device::cuda(0)? {
        Device::Cuda(d) => d,
        Device::Cpu => unreachable!("Device::cuda returns a CUDA device"),
    };
    let ceil = ceiling::measure(&dev, &timer)?;
    println!("GPU: {}", dev.name());
    println!("ceilings: bf16 matmul {:.0} TFLOP/s (cuBLAS 8192^3), copy {:.0} GB/s", ceil.matmul_tflops, ceil.copy_gbps);
    let mut results = Results {
        tool: "dmattn-bench".into(),
        gpu: dev.name().into(),
        date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        versions: [("dmattn".to_string(), env!("CARGO_PKG_VERSION").to_string())].into(),
        ceilings: Some(ceil),
        computed_fraction: Default::default(),
        results: vec![],
        runs: vec![],
        mask_memory: vec![],
    };

    let device = Device::Cuda(dev.clone());
    let stream = dev.stream();
    if set.cases.iter().any(|c| c.group == "sparse") {
        println!("\nmask memory (b1 h1, prepared once; dense bool for comparison):");
        results.mask_memory = memory::table(&device, stream);
        for m in &results.mask_memory {
            println!("  {}", memory::describe(m));
        }
        std::fs::write(args.out.join("dmattn.json"), serde_json::to_string_pretty(&results)?)?;
    }
    let mut rng = StdRng::seed_from_u64(rand::random());
    for c in &set.cases {
        if c.is_select() {
            let within = match c.mask {
                Some(Mask::Select { within_causal: true, .. }) => format!(" within causal [1, 1, {}, {}]", c.seqlen_q, c.seqlen_k),
                _ => String::new(),
            };
            println!("\n{} (bias {:?}{within}, {:?})", c.id, c.select_bias_shape(), c.mask.unwrap());
            if args.impls.contains(&Impl::Dmattn) {
                let r = time_select(c, &device, &mut rng, &timer, stream);
                println!("  {:<20} fwd {}", Impl::Dmattn.name(), describe(c, &r, 1.0, &ceil));
                results.results.push(r);
                std::fs::write(args.out.join("dmattn.json"), serde_json::to_string_pretty(&results)?)?;
            }
            continue;
        }
        match &c.seqlens {
            Some(p) => {
                let range = |lens: &[usize]| format!("{}..={}", lens.iter().min().unwrap_or(&0), lens.iter().max().unwrap_or(&0));
                let n = p.lens_q.len();
                let pages = p.page_size.map_or(String::new(), |ps| format!("; k, v in {ps}-key pages"));
                println!("\n{} (packed: {n} sequences, q {} k {}; h{} hk{} d{} total q{} k{}{pages})", c.id, range(&p.lens_q), range(&p.lens_k), c.heads, c.kv_heads, c.head_dim, c.seqlen_q, c.seqlen_k);
            }
            None => println!("\n{} (b{} h{} hk{} d{} sq{} sk{})", c.id, c.batch, c.heads, c.kv_heads, c.head_dim, c.seqlen_q, c.seqlen_k),
        }
        let ops = match Operands::new(c, &device, &mut rng) {
            Ok(o) => o,
            Err(e) => {
                println!("  inputs: {e}");
                let failed = Err(e);
                results.results.extend(args.impls.iter().map(|&imp| record(c, imp, Pass::Fwd, &failed)));
                continue;
            }
        };
        results.computed_fraction.insert(c.id.clone(), ops.computed_fraction);
        let gather = gather_note(c, &ops);
        if let Some(g) = &gather {
            println!("  {g}");
        }
        if let Some(sparse) = ops.sparse.as_ref().filter(|_| args.impls.contains(&Impl::Dmattn)) {
            let r = time_prepare(c, sparse, &timer, stream);
            println!("  {:<20} prep {}", Impl::Dmattn.name(), describe(c, &r, ops.computed_fraction, &ceil));
            results.results.push(r);
        }
        for &imp in &args.impls {
            let fwd = timer.median_ms(stream, |i| forward(imp, c, &ops, i % ops.sets()).map(drop));
            let mut r = record(c, imp, Pass::Fwd, &fwd);
            add_note(&mut r, gather.as_deref());
            println!("  {:<20} fwd {}", imp.name(), describe(c, &r, ops.computed_fraction, &ceil));
            results.results.push(r);
            if !(c.backward && imp == Impl::Dmattn) {
                continue;
            }
            let bwd = (0..ops.sets()).map(|s| forward(imp, c, &ops, s)).collect::<dmattn::Result<Vec<_>>>().and_then(|fwds| {
                timer.median_ms(stream, |i| fwds[i % fwds.len()].backward(&ops.dout[i % fwds.len()]).map(drop))
            });
            let mut r = record(c, imp, Pass::Bwd, &bwd);
            add_note(&mut r, gather.as_deref());
            println!("  {:<20} bwd {}", imp.name(), describe(c, &r, ops.computed_fraction, &ceil));
            results.results.push(r);
        }
        // Written after every case, so that a run cut short still leaves its results.
        std::fs::write(args.out.join("dmattn.json"), serde_json::to_string_pretty(&results)?)?;
    }
    // Timings of a kernel the driver spilled are not the kernel's. (The driver compiles each
    // kernel when first launched: these are the ones the run used.)
    let kernels = dev.compiled_kernel_resources()?;
    let spilled: Vec<String> = kernels.iter().filter(|k| k.local_bytes > 0).map(|k| format!("{} ({} B)", k.name, k.local_bytes)).collect();
    println!("\nkernels: {} compiled by the driver for this run, {} using local memory {spilled:?}", kernels.len(), spilled.len());
    println!("wrote {}", args.out.join("dmattn.json").display());
    Ok(())
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dmattn-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
