//! Shared pieces of the integration tests: random problems, error measures, and the GPU (or the
//! printed reason there is none).
use dmattn::{DType, Device, Tensor, attention};
use proptest::prelude::*;
use rand::Rng;
use rand::rngs::StdRng;
use std::sync::OnceLock;

/// One attention problem: sizes, which operands exist (with their broadcast shapes), options.
#[derive(Clone, Debug)]
pub struct Case {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Broadcast shape of the mask, e.g. `[1, heads, seqlen_q, seqlen_k]`.
    pub mask: Option<[usize; 4]>,
    pub mask_pattern: MaskPattern,
    pub bias: Option<[usize; 4]>,
    pub causal: bool,
    pub scale: Option<f64>,
    pub softcap: f64,
    pub dtype: DType,
}

/// How mask values are drawn.
#[derive(Clone, Copy, Debug)]
pub enum MaskPattern {
    /// Each element true with this probability.
    Random(f64),
    /// 64x64 blocks entirely true or false (probability of true), with random holes in the true
    /// ones: exercises empty, partial and full tiles.
    Blocks(f64),
    /// Random, with every third query row entirely false.
    EmptyRows(f64),
}

/// The tensors of a case, on one device.
pub struct Inputs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub mask: Option<Tensor>,
    pub bias: Option<Tensor>,
}

impl Case {
    pub fn new(batch: usize, seqlen_q: usize, seqlen_k: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        Case {
            batch,
            seqlen_q,
            seqlen_k,
            heads,
            kv_heads,
            head_dim,
            mask: None,
            mask_pattern: MaskPattern::Random(0.7),
            bias: None,
            causal: false,
            scale: None,
            softcap: 0.0,
            dtype: DType::F32,
        }
    }

    pub fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_q, self.heads, self.head_dim]
    }

    pub fn kv_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_k, self.kv_heads, self.head_dim]
    }

    /// Fresh random inputs (normal-ish q/k/v, bias in [-2, 2]), on the CPU in `self.dtype`.
    pub fn inputs(&self, rng: &mut StdRng) -> Inputs {
        let dev = Device::Cpu;
        let mut rand_tensor = |shape: &[usize], dt: DType, amp: f64| {
            let n: usize = shape.iter().product();
            let vals: Vec<f64> = (0..n).map(|_| amp * (rng.random::<f64>() + rng.random::<f64>() + rng.random::<f64>() - 1.5)).collect();
            Tensor::from_fn(shape, dt, &dev, |i| vals[i]).unwrap()
        };
        let q = rand_tensor(&self.q_shape(), self.dtype, 2.0);
        let k = rand_tensor(&self.kv_shape(), self.dtype, 2.0);
        let v = rand_tensor(&self.kv_shape(), self.dtype, 2.0);
        let bias = self.bias.map(|s| rand_tensor(&s, self.dtype, 2.0));
        let mask = self.mask.map(|s| {
            let n: usize = s.iter().product();
            let vals: Vec<bool> = match self.mask_pattern {
                MaskPattern::Random(p) => (0..n).map(|_| rng.random_bool(p)).collect(),
                MaskPattern::EmptyRows(p) => (0..n).map(|i| (i / s[3]) % s[2].max(1) % 3 != 0 && rng.random_bool(p)).collect(),
                MaskPattern::Blocks(p) => {
                    let blocks_k = s[3].div_ceil(64);
                    let nb = s[0] * s[1] * s[2].div_ceil(64) * blocks_k;
                    let on: Vec<bool> = (0..nb).map(|_| rng.random_bool(p)).collect();
                    let dense: Vec<bool> = (0..nb).map(|_| rng.random_bool(0.5)).collect();
                    (0..n)
                        .map(|i| {
                            let (j, r, bh) = (i % s[3], (i / s[3]) % s[2], i / (s[3] * s[2]));
                            let blk = (bh * s[2].div_ceil(64) + r / 64) * blocks_k + j / 64;
                            on[blk] && (dense[blk] || rng.random_bool(0.8))
                        })
                        .collect()
                }
            };
            Tensor::from_vec(vals, &s, &dev).unwrap()
        });
        Inputs { q, k, v, mask, bias }
    }

    /// Runs the forward pass of this case on `inputs`.
    pub fn forward(&self, i: &Inputs) -> dmattn::Result<dmattn::Forward> {
        let mut call = attention(&i.q, &i.k, &i.v).causal(self.causal).softcap(self.softcap);
        if let Some(s) = self.scale {
            call = call.scale(s);
        }
        if let Some(m) = &i.mask {
            call = call.mask(m);
        }
        if let Some(b) = &i.bias {
            call = call.bias(b);
        }
        call.forward()
    }
}

impl Inputs {
    /// The same inputs on `device` (and, for floats, in `dtype`).
    pub fn to(&self, device: &Device) -> Inputs {
        let mv = |t: &Tensor| t.to_device(device).unwrap();
        Inputs { q: mv(&self.q), k: mv(&self.k), v: mv(&self.v), mask: self.mask.as_ref().map(mv), bias: self.bias.as_ref().map(mv) }
    }
}

/// `‖a − b‖₂ / ‖b‖₂`, infinite if anything is NaN or the lengths differ (NaN never passes).
/// Where `b` is all zero, the absolute norm of `a`.
pub fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() || a.iter().chain(b).any(|x| x.is_nan()) {
        return f64::INFINITY;
    }
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
    let den: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    if den == 0.0 { num } else { num / den }
}

/// Largest `|a − b|` over elements where both are finite, infinite where exactly one of them is
/// infinite or anything is NaN (for LSE, which is -inf on empty rows).
pub fn max_abs_err_inf(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).fold(0.0f64, |m, (&x, &y)| {
        if x.is_nan() || y.is_nan() {
            f64::INFINITY
        } else if x.is_infinite() || y.is_infinite() {
            if x == y { m } else { f64::INFINITY }
        } else {
            m.max((x - y).abs())
        }
    })
}

/// The CUDA device, or `None` after printing once why GPU tests are skipped.
pub fn gpu() -> Option<Device> {
    static DEVICE: OnceLock<Option<Device>> = OnceLock::new();
    DEVICE
        .get_or_init(|| match Device::cuda(0) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("SKIPPED: GPU tests need a CUDA device: {e}");
                None
            }
        })
        .clone()
}

/// Proptest strategy: a broadcast shape for a mask or bias of `case`.
pub fn broadcast_shape(b: usize, h: usize, hk: usize, sq: usize, sk: usize) -> impl Strategy<Value = [usize; 4]> {
    (any::<bool>(), prop::sample::select(vec![1, hk, h]), any::<bool>(), prop_oneof![4 => Just(true), 1 => Just(false)])
        .prop_map(move |(fb, hh, fq, fk)| [if fb { b } else { 1 }, hh, if fq { sq } else { 1 }, if fk { sk } else { 1 }])
}

pub fn seeded_rng(seed: u64) -> StdRng {
    use rand::SeedableRng;
    StdRng::seed_from_u64(seed)
}

/// A generator seeded afresh each run (from `DMATTN_SEED` to reproduce a failure); the seed is
/// printed so a failing run can be replayed.
pub fn fresh_rng(test: &str) -> StdRng {
    let seed = std::env::var("DMATTN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    eprintln!("{test}: DMATTN_SEED={seed}");
    seeded_rng(seed)
}
