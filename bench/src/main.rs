//! `dmattn-bench`: times dmattn's forward on the GPU against the measured ceilings. Runs where
//! there is no Rust toolchain (it is packed by `cargo xtask gpu-pack`).
mod ceiling;
mod timing;

use clap::Parser;
use dmattn::{DType, Device, Tensor, attention};
use rand::{Rng, SeedableRng, rngs::StdRng};
use timing::Timer;

#[derive(Parser)]
#[command(about = "Benchmarks dmattn on the GPU")]
struct Args {
    /// Fewer sizes and repetitions (under a minute).
    #[arg(long)]
    quick: bool,
    /// Timed repetitions per case (median reported).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Head dims to run.
    #[arg(long, value_delimiter = ',', default_value = "64,128")]
    head_dims: Vec<usize>,
    /// Sequence lengths to run (default: 1K-16K, or 1K and 8K with --quick).
    #[arg(long, value_delimiter = ',')]
    seqlens: Vec<usize>,
}

/// How keys are hidden in a case.
#[derive(Clone, Copy, Debug, PartialEq)]
enum MaskKind {
    None,
    /// Random 128x128 blocks (FlexAttention's block size), this fraction visible, all or
    /// nothing per block.
    Blocks(f64),
}

#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    seqlen: usize,
    head_dim: usize,
    causal: bool,
    mask: MaskKind,
    bias: bool,
}

impl Case {
    /// Dense-equivalent forward FLOPs (two matmuls), halved under causal as FlashAttention counts.
    fn flops(&self) -> f64 {
        let f = 4.0 * (self.batch * self.heads) as f64 * (self.seqlen as f64).powi(2) * self.head_dim as f64;
        if self.causal { f / 2.0 } else { f }
    }

    fn label(&self) -> String {
        let mut s = String::from(if self.causal { "causal" } else { "dense" });
        if let MaskKind::Blocks(p) = self.mask {
            s += &format!("+mask{:.0}%", p * 100.0);
        }
        if self.bias {
            s += "+bias";
        }
        s
    }
}

/// Random inputs (never zeros) on the GPU.
struct Operands {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Option<Tensor>,
    bias: Option<Tensor>,
}

fn random(shape: &[usize], dtype: DType, dev: &Device, rng: &mut StdRng) -> dmattn::Result<Tensor> {
    let seed: u64 = rng.random();
    let t = Tensor::from_fn(shape, dtype, &Device::Cpu, |i| {
        let x = (i as u64 ^ seed).wrapping_mul(0x9E3779B97F4A7C15);
        ((x >> 40) as f64 / (1u64 << 24) as f64) - 0.5
    })?;
    t.to_device(dev)
}

fn operands(c: &Case, dev: &Device, rng: &mut StdRng) -> dmattn::Result<Operands> {
    let dt = DType::BF16;
    let (q_shape, kv_shape) = ([c.batch, c.seqlen, c.heads, c.head_dim], [c.batch, c.seqlen, c.kv_heads, c.head_dim]);
    let mask = match c.mask {
        MaskKind::None => None,
        MaskKind::Blocks(p) => {
            const BLOCK: usize = 128;
            let nb = c.seqlen.div_ceil(BLOCK);
            let keep: Vec<bool> = (0..c.batch * nb * nb).map(|_| rng.random_bool(p)).collect();
            let s = c.seqlen;
            let m = Tensor::from_fn(&[c.batch, 1, s, s], DType::Bool, &Device::Cpu, |i| {
                let (j, r, b) = (i % s, (i / s) % s, i / (s * s));
                keep[(b * nb + r / BLOCK) * nb + j / BLOCK] as u8 as f64
            })?;
            Some(m.to_device(dev)?)
        }
    };
    let bias = if c.bias { Some(random(&[c.batch, 1, c.seqlen, c.seqlen], dt, dev, rng)?) } else { None };
    Ok(Operands { q: random(&q_shape, dt, dev, rng)?, k: random(&kv_shape, dt, dev, rng)?, v: random(&kv_shape, dt, dev, rng)?, mask, bias })
}

fn forward(c: &Case, o: &Operands) -> dmattn::Result<dmattn::Forward> {
    let mut call = attention(&o.q, &o.k, &o.v).causal(c.causal);
    if let Some(m) = &o.mask {
        call = call.mask(m);
    }
    if let Some(b) = &o.bias {
        call = call.bias(b);
    }
    call.forward()
}

fn main() -> dmattn::Result<()> {
    let args = Args::parse();
    let dev = match Device::cuda(0) {
        Ok(Device::Cuda(d)) => d,
        Ok(Device::Cpu) => unreachable!(),
        Err(e) => {
            eprintln!("dmattn-bench needs a CUDA device: {e}");
            std::process::exit(2);
        }
    };
    let timer = Timer { warmup: 3, reps: if args.quick { 5 } else { args.reps } };
    let ceil = ceiling::measure(&dev, &timer)?;
    println!("GPU: {}", dev.name());
    println!("ceilings: bf16 matmul {:.0} TFLOP/s (cuBLAS 8192^3), copy {:.0} GB/s", ceil.matmul_tflops, ceil.copy_gbps);
    let device = Device::Cuda(dev.clone());
    let mut rng = StdRng::seed_from_u64(rand::random());
    let seqlens: &[usize] = match (&args.seqlens[..], args.quick) {
        ([], true) => &[1024, 8192],
        ([], false) => &[1024, 2048, 4096, 8192, 16384],
        (given, _) => given,
    };
    println!("\n| case | d | seqlen | fwd ms | fwd TFLOP/s | % of matmul | bwd ms | bwd/fwd |\n|---|---|---|---|---|---|---|---|");
    for &d in &args.head_dims {
        for &s in seqlens {
            let base = Case { batch: 2, heads: 32, kv_heads: 8, seqlen: s, head_dim: d, causal: false, mask: MaskKind::None, bias: false };
            let variants = [
                base,
                Case { causal: true, ..base },
                Case { mask: MaskKind::Blocks(0.5), ..base },
                Case { mask: MaskKind::Blocks(0.5), bias: true, ..base },
            ];
            for c in variants {
                // Rotate enough operand sets that they do not all sit in L2.
                let set_bytes = 2 * c.batch * c.seqlen * (c.heads + 2 * c.kv_heads) * c.head_dim;
                let sets: Vec<Operands> = (0..(256usize << 20).div_ceil(set_bytes).clamp(1, 4))
                    .map(|_| operands(&c, &device, &mut rng))
                    .collect::<dmattn::Result<_>>()?;
                let ms = timer.median_ms(dev.stream(), |i| forward(&c, &sets[i % sets.len()]).map(|_| ()))?;
                let tf = c.flops() / (ms * 1e-3) / 1e12;
                let fwds: Vec<dmattn::Forward> = sets.iter().map(|o| forward(&c, o)).collect::<dmattn::Result<_>>()?;
                let douts: Vec<Tensor> = sets.iter().map(|o| random(o.q.shape(), DType::BF16, &device, &mut rng)).collect::<dmattn::Result<_>>()?;
                let bwd = timer.median_ms(dev.stream(), |i| fwds[i % sets.len()].backward(&douts[i % sets.len()]).map(|_| ()))?;
                println!(
                    "| {} | {} | {} | {:.3} | {:.0} | {:.0}% | {:.3} | {:.2} |",
                    c.label(), d, s, ms, tf, 100.0 * tf / ceil.matmul_tflops, bwd, bwd / ms
                );
            }
        }
    }
    Ok(())
}
