//! Shared pieces of the integration tests: random problems, error measures, and the GPU (or the
//! printed reason there is none).
use dmattn::{DType, Device, Forward, Gradients, Tensor, attention};
use proptest::prelude::*;
use rand::Rng;
use rand::rngs::StdRng;
use std::fmt::Debug;
use std::sync::OnceLock;

pub mod select;
pub mod sparse;
pub mod varlen;

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

    /// This case's attention call on `inputs`, configured but not run.
    pub fn call<'a>(&self, i: &'a Inputs) -> dmattn::Attention<'a> {
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
        call
    }

    /// Runs the forward pass of this case on `inputs`.
    pub fn forward(&self, i: &Inputs) -> dmattn::Result<dmattn::Forward> {
        self.forward_by(i, ForwardPath::Fused)
    }

    /// Runs this case's forward pass on `inputs` through `path`.
    pub fn forward_by(&self, i: &Inputs, path: ForwardPath) -> dmattn::Result<dmattn::Forward> {
        path.run(self.call(i))
    }
}

/// The API's two forward passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardPath {
    /// [`dmattn::Attention::forward`].
    Fused,
    /// [`dmattn::Attention::forward_materialized`].
    Materialized,
}

impl ForwardPath {
    pub fn run(self, call: dmattn::Attention) -> dmattn::Result<dmattn::Forward> {
        match self {
            ForwardPath::Fused => call.forward(),
            ForwardPath::Materialized => call.forward_materialized(),
        }
    }

    /// How far this path's logits may stray beyond the fused path's, for `dtype` inputs whose
    /// naive forward is `fwd`. The materialising path stores S = QKᵀ in the element type, as a
    /// framework does, rounding each logit by up to half an ulp of `scale · q·k`: `u · max |raw|`
    /// over the visible scores (`u` = 2^-8 for bf16, 2^-11 for f16). An LSE moves by at most
    /// that, a probability by a factor within `exp(±2 u max|raw|)`. The fused path keeps S in f32.
    pub fn logit_error(self, dtype: DType, fwd: &naive::Fwd) -> f64 {
        let u = match (self, dtype) {
            (ForwardPath::Fused, _) => return 0.0,
            (ForwardPath::Materialized, DType::BF16) => 2f64.powi(-8),
            (ForwardPath::Materialized, DType::F16) => 2f64.powi(-11),
            (_, other) => panic!("no GPU rounding model for {other:?}"),
        };
        let visible = fwd.raw.iter().zip(&fwd.visible).filter(|(_, v)| **v);
        u * visible.map(|(r, _)| r.abs()).fold(0.0, f64::max)
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
/// infinite, anything is NaN or the lengths differ (for LSE, which is -inf on empty rows).
pub fn max_abs_err_inf(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
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

/// The CUDA device, or `None` after printing why GPU tests are skipped. The reason goes straight
/// to stderr, past the test harness's output capture, so a skip is visible in a normal run.
pub fn gpu() -> Option<Device> {
    static DEVICE: OnceLock<Result<Device, String>> = OnceLock::new();
    match DEVICE.get_or_init(|| Device::cuda(0).map_err(|e| e.to_string())) {
        Ok(d) => Some(d.clone()),
        Err(why) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED (no GPU test ran): {why}");
            None
        }
    }
}

/// Tolerance of the GPU paths' 16-bit types: on ‖O − ref‖ / ‖ref‖, and on gradient errors
/// against the size of the sums they are made of.
pub fn gpu_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 5e-3,
        other => panic!("no GPU tolerance for {other:?}"),
    }
}

/// Runs `case` on the CPU reference and, through `path`, on `gpu` from the same inputs, and
/// compares them ([`compare_forward`]).
pub fn check_gpu_forward(case: &Case, path: ForwardPath, gpu: &Device, inputs: &Inputs) -> Result<(), TestCaseError> {
    dmattn::set_output_poisoning(true);
    let want = case.forward(inputs).map_err(|e| TestCaseError::fail(format!("reference: {e}")))?;
    let on_gpu = inputs.to(gpu);
    let got = case.forward_by(&on_gpu, path).map_err(|e| TestCaseError::fail(format!("gpu ({path:?}): {e}")))?;
    // (The naive forward only where the bound needs it.)
    let extra = if path == ForwardPath::Fused {
        0.0
    } else {
        path.logit_error(case.dtype, &naive::forward(&naive::Spec::of(case), &naive::Data::of(inputs)))
    };
    compare_forward(case, path, case.dtype, &got, &want, extra)
}

/// A GPU forward (`got`, through `path`, of `dtype` inputs) against the CPU reference's (`want`):
/// O finite (poisoned outputs show unwritten elements) and within [`gpu_tolerance`] by
/// [`rel_err`], LSE within 1e-3 of the largest finite |LSE| and -inf exactly where the
/// reference's is; each bound widened by what the path's rounding adds (`extra`, its
/// [`ForwardPath::logit_error`]: twice it for O, once for LSE). Failures name `what`.
pub fn compare_forward(what: &dyn Debug, path: ForwardPath, dtype: DType, got: &Forward, want: &Forward, extra: f64) -> Result<(), TestCaseError> {
    let (o, o_ref) = (got.out.to_f64_vec().unwrap(), want.out.to_f64_vec().unwrap());
    prop_assert!(o.iter().all(|x| x.is_finite()), "{path:?}: non-finite output (unwritten or NaN) for {what:?}");
    let err = rel_err(&o, &o_ref);
    let tol = gpu_tolerance(dtype) + 2.0 * extra;
    prop_assert!(err <= tol, "{path:?}: out rel err {err:.3e} > {tol:.3e} for {what:?}");
    let (lse, lse_ref) = (got.lse.to_f64_vec().unwrap(), want.lse.to_f64_vec().unwrap());
    let scale = lse_ref.iter().filter(|x| x.is_finite()).fold(1.0f64, |m, x| m.max(x.abs()));
    let lse_err = max_abs_err_inf(&lse, &lse_ref);
    let tol = 1e-3 * scale + extra;
    prop_assert!(lse_err <= tol, "{path:?}: lse max err {lse_err:.3e} > {tol:.3e} for {what:?}");
    Ok(())
}

/// A random output gradient for `case` (in its dtype, on the CPU).
pub fn gpu_dout(case: &Case, seed: u64) -> Tensor {
    let mut rng = seeded_rng(seed);
    let shape = case.q_shape();
    let vals: Vec<f64> = (0..shape.iter().product()).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
    Tensor::from_fn(&shape, case.dtype, &Device::Cpu, |i| vals[i]).unwrap()
}

/// (dq, dk, dv, dbias) of `case` on the inputs' device, the forward run through `path`.
pub fn gradients(case: &Case, path: ForwardPath, inputs: &Inputs, dout: &Tensor, deterministic: bool) -> [Option<Vec<f64>>; 4] {
    let fwd = path.run(case.call(inputs).deterministic(deterministic)).unwrap();
    grads_vec(&fwd.backward(&dout.to_device(&inputs.q.device()).unwrap()).unwrap())
}

/// (dq, dk, dv, dbias) as f64 values, dbias `None` without a bias.
pub type Grads = [Option<Vec<f64>>; 4];

/// Panics unless two runs' gradients are bit for bit the same (deterministic mode), naming the
/// gradient and `what`.
pub fn assert_same_bits(first: &Grads, again: &Grads, what: &dyn Debug) {
    for (name, (a, b)) in ["dq", "dk", "dv", "dbias"].iter().zip(first.iter().zip(again)) {
        let same = match (a, b) {
            (Some(a), Some(b)) => a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            (a, b) => a.is_none() && b.is_none(),
        };
        assert!(same, "{name} differs between deterministic runs for {what:?}");
    }
}

/// A backward pass's gradients as [`Grads`].
pub fn grads_vec(g: &Gradients) -> Grads {
    [Some(&g.dq), Some(&g.dk), Some(&g.dv), g.dbias.as_ref()].map(|t| t.map(|t| t.to_f64_vec().unwrap()))
}

/// `case` at a head dim whose backward may split a key tile's query tiles (for the split tests,
/// which force the split): 32 or 64, whose kernels all may, or 128, whose Hopper kernels may
/// without a bias or softcap (`dmattn_abi::bwd_split_kernel`): a d128 case drops both.
pub fn split_head_dim(case: Case, seed: u64) -> Case {
    match seed / 4 % 3 {
        0 => Case { head_dim: 32, ..case },
        1 => Case { head_dim: 64, ..case },
        _ => Case { head_dim: 128, bias: None, softcap: 0.0, ..case },
    }
}

/// Runs `check` with the backward's query split (`dmattn::force_backward_query_split`) and
/// placement (`dmattn::force_backward_placement`) forced as given (`None`: the plan's own), then
/// lifts both: the hooks are this thread's, and a property's next case must not inherit them.
pub fn with_backward_forced<T>(split: Option<u32>, placed: Option<bool>, check: impl FnOnce() -> T) -> T {
    dmattn::force_backward_query_split(split);
    dmattn::force_backward_placement(placed);
    let out = check();
    dmattn::force_backward_query_split(None);
    dmattn::force_backward_placement(None);
    out
}

/// `case` with a key-side bias (`[1|b, 1|hk|h, 1, sk]`) at a head dim whose Hopper backward sums
/// the dbias of such a bias over a CTA's whole walk where every head of its kv group reads one row
/// (64 or 128), its keys rounded up to a multiple of 8 so that the bias rows copy in 16-byte
/// pieces (the case's mask keeps its broadcast).
pub fn key_side_bias(case: Case, seed: u64) -> Case {
    let sk = case.seqlen_k.next_multiple_of(8);
    let heads = [1, case.kv_heads, case.heads][(seed / 2 % 3) as usize];
    let batch = if seed / 6 % 2 == 0 { 1 } else { case.batch };
    let mask = case.mask.map(|[b, h, q, k]| [b, h, q, if k == 1 { 1 } else { sk }]);
    Case { head_dim: if seed % 2 == 0 { 64 } else { 128 }, seqlen_k: sk, bias: Some([batch, heads, 1, sk]), mask, ..case }
}

/// The backward pass of `case` on `gpu` (after a forward through `path`) against the CPU
/// reference's, on inputs and an output gradient drawn from `seed`: every gradient finite,
/// present exactly where the reference's is, and within [`gpu_tolerance`] (widened by twice the
/// path's [`ForwardPath::logit_error`]) of the size of the sums it is made of.
pub fn check_gpu_backward(case: &Case, path: ForwardPath, gpu: &Device, seed: u64, deterministic: bool) -> Result<(), TestCaseError> {
    dmattn::set_output_poisoning(true);
    let inputs = case.inputs(&mut seeded_rng(seed));
    let dout = gpu_dout(case, seed ^ 0x5EED);
    let want = gradients(case, ForwardPath::Fused, &inputs, &dout, false);
    let got = gradients(case, path, &inputs.to(gpu), &dout, deterministic);
    // Errors are measured against the size of the sums each gradient is made of (see
    // `naive::backward_magnitudes`): cancellation can make a gradient far smaller than the
    // rounding a 16-bit backward (dS and P rounded, delta from the rounded O) necessarily makes.
    let (spec, data) = (naive::Spec::of(case), naive::Data::of(&inputs));
    let nf = naive::forward(&spec, &data);
    let mags = gradient_sizes(&spec, &data, &nf, &dout);
    // The backward recomputes P from the forward's LSE: what the path's rounding moved it by.
    let tol = gpu_tolerance(case.dtype) + 2.0 * path.logit_error(case.dtype, &nf);
    compare_gradients(case, &got, &want, &mags, tol)
}

/// The size of the sums each gradient (dq, dk, dv, dbias) of `spec` on `data` is made of, for
/// the output gradient `dout` ([`naive::backward_magnitudes`]): what [`compare_gradients`]
/// measures errors against.
pub fn gradient_sizes(spec: &naive::Spec, data: &naive::Data, nf: &naive::Fwd, dout: &Tensor) -> Grads {
    let m = naive::backward_magnitudes(spec, data, nf, &dout.to_f64_vec().unwrap());
    [Some(m.dq), Some(m.dk), Some(m.dv), m.dbias]
}

/// GPU gradients (dq, dk, dv, dbias) against the reference's: each finite, present exactly
/// where the reference's is, and within `tol` of the size of the sums it is made of (`mags`,
/// from [`naive::backward_magnitudes`]). Failures name `what`.
pub fn compare_gradients(what: &dyn Debug, got: &Grads, want: &Grads, mags: &Grads, tol: f64) -> Result<(), TestCaseError> {
    for (name, ((g, w), m)) in ["dq", "dk", "dv", "dbias"].iter().zip(got.iter().zip(want).zip(mags)) {
        let (Some(g), Some(w), Some(m)) = (g, w, m) else {
            prop_assert!(g.is_none() && w.is_none(), "{name}: present on one side only for {what:?}");
            continue;
        };
        prop_assert!(g.iter().all(|x| x.is_finite()), "{name}: non-finite (unwritten or NaN) for {what:?}");
        let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
        let (err, size) = (norm(&mut g.iter().zip(w).map(|(a, b)| a - b)), norm(&mut m.iter().copied()));
        prop_assert!(err <= tol * size, "{name}: error {:.3e} of magnitude {size:.3e} ({:.3e}) for {what:?}", err, err / size);
    }
    Ok(())
}

/// Proptest strategy: a broadcast shape for a mask or bias of `case`.
pub fn broadcast_shape(b: usize, h: usize, hk: usize, sq: usize, sk: usize) -> impl Strategy<Value = [usize; 4]> {
    (any::<bool>(), prop::sample::select(vec![1, hk, h]), any::<bool>(), prop_oneof![4 => Just(true), 1 => Just(false)])
        .prop_map(move |(fb, hh, fq, fk)| [if fb { b } else { 1 }, hh, if fq { sq } else { 1 }, if fk { sk } else { 1 }])
}

fn mask_pattern() -> impl Strategy<Value = MaskPattern> {
    prop_oneof![
        2 => (0usize..4).prop_map(|i| MaskPattern::Random([0.0, 0.3, 0.7, 0.97][i])),
        3 => (0usize..3).prop_map(|i| MaskPattern::Blocks([0.2, 0.5, 0.8][i])),
        1 => Just(MaskPattern::EmptyRows(0.6)),
    ]
}

fn gpu_seqlen(max: usize) -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1usize..=max, 1 => prop::sample::select(vec![1, 63, 64, 65, 127, 128, 129, 192, 257.min(max)])]
}

/// Random GPU cases over every axis the kernels specialise or branch on (16-bit dtype, head
/// dim, batch, GQA group, odd lengths up to `max_seqlen`, causal, softcap, scale, mask and bias
/// broadcasts and patterns), each with a seed for its input values.
pub fn gpu_cases(max_seqlen: usize) -> impl Strategy<Value = (Case, u64)> {
    (
        (prop::sample::select(vec![DType::BF16, DType::F16]), prop::sample::select(vec![32usize, 64, 96, 128, 192, 256])),
        (1usize..=2, 1usize..=2, prop::sample::select(vec![1usize, 2, 3])),
        (gpu_seqlen(max_seqlen), gpu_seqlen(max_seqlen)),
        (any::<bool>(), prop_oneof![3 => Just(0.0), 1 => Just(20.0)], prop::option::weighted(0.2, 0.05f64..0.5)),
        (any::<bool>(), any::<bool>(), mask_pattern(), any::<u64>()),
    )
        .prop_flat_map(|((dtype, d), (b, hk, group), (sq, sk), (causal, softcap, scale), (has_mask, has_bias, pat, seed))| {
            let h = hk * group;
            let shape = move |on: bool| {
                if on { broadcast_shape(b, h, hk, sq, sk).prop_map(Some).boxed() } else { Just(None).boxed() }
            };
            (shape(has_mask), shape(has_bias)).prop_map(move |(mask, bias)| {
                (Case { mask, mask_pattern: pat, bias, causal, softcap, scale, dtype, ..Case::new(b, sq, sk, h, hk, d) }, seed)
            })
        })
}

/// A proptest runner for GPU properties: `DMATTN_GPU_CASES` cases (default `default_cases`),
/// no failure files written.
pub fn gpu_runner(default_cases: u32) -> proptest::test_runner::TestRunner {
    use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
    let cases = std::env::var("DMATTN_GPU_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default_cases);
    TestRunner::new(Config { cases, failure_persistence: Some(Box::new(FileFailurePersistence::Off)), ..Config::default() })
}

/// Checks `property` on [`gpu_cases`]`(max_seqlen)` with a [`gpu_runner`]`(default_cases)`,
/// panicking with proptest's report (the minimal failing case) if it fails.
pub fn gpu_property(default_cases: u32, max_seqlen: usize, property: impl Fn((Case, u64)) -> Result<(), TestCaseError>) {
    // Proptest seeds its generator afresh each run; each case's values come from its own seed.
    if let Err(e) = gpu_runner(default_cases).run(&gpu_cases(max_seqlen), property) {
        panic!("{e}");
    }
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

/// `‖a − b‖₂ / max(‖b‖₂, floor)`: relative where `b` is large, absolute (scaled by `1/floor`)
/// where it is small, for gradients that may legitimately be (nearly) zero. Infinite if anything
/// is NaN or the lengths differ.
pub fn rel_err_floor(a: &[f64], b: &[f64], floor: f64) -> f64 {
    if a.len() != b.len() || a.iter().chain(b).any(|x| x.is_nan()) {
        return f64::INFINITY;
    }
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
    let den: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    num / den.max(floor)
}

impl Inputs {
    /// The same values rounded to `dtype` (q, k, v and bias; the mask is shared), on the CPU.
    pub fn cast(&self, dtype: DType) -> Inputs {
        let cast = |t: &Tensor| {
            let vals = t.to_f64_vec().unwrap();
            Tensor::from_fn(t.shape(), dtype, &Device::Cpu, |i| vals[i]).unwrap()
        };
        Inputs { q: cast(&self.q), k: cast(&self.k), v: cast(&self.v), mask: self.mask.clone(), bias: self.bias.as_ref().map(cast) }
    }
}

/// Compares the forward pass of `case` on `inputs` (through the public API) with
/// [`naive::forward`]: O by [`rel_err`] (at most `tol`), LSE element-wise (within
/// `tol · max(1, |lse|)`, -inf exactly where the naive LSE is), and checks O is finite and
/// exactly 0 on rows with no visible key. `Err` says what differs, naming the case.
pub fn check_forward(case: &Case, inputs: &Inputs, tol: f64) -> Result<(), String> {
    let fwd = case.forward(inputs).map_err(|e| format!("{case:?}: forward failed: {e}"))?;
    let spec = naive::Spec::of(case);
    let want = naive::forward(&spec, &naive::Data::of(inputs));
    if fwd.out.shape() != case.q_shape() || fwd.lse.shape() != [case.batch, case.heads, case.seqlen_q] {
        return Err(format!("{case:?}: out {:?} / lse {:?} have the wrong shapes", fwd.out.shape(), fwd.lse.shape()));
    }
    let out = fwd.out.to_f64_vec().unwrap();
    let lse = fwd.lse.to_f64_vec().unwrap();
    if let Some(x) = out.iter().position(|x| !x.is_finite()) {
        return Err(format!("{case:?}: O[{x}] = {} is not finite", out[x]));
    }
    let e = rel_err(&out, &want.out);
    if e > tol {
        return Err(format!("{case:?}: O rel err {e:e} > {tol:e}"));
    }
    if lse.len() != want.lse.len() {
        return Err(format!("{case:?}: {} LSE values, expected {}", lse.len(), want.lse.len()));
    }
    for (r, (&got, &exp)) in lse.iter().zip(&want.lse).enumerate() {
        let ok = if exp == f64::NEG_INFINITY { got == f64::NEG_INFINITY } else { (got - exp).abs() <= tol * exp.abs().max(1.0) };
        if !ok {
            return Err(format!("{case:?}: LSE row {r} (b, h, i flattened) = {got}, expected {exp}"));
        }
    }
    let (sq, h, d) = (case.seqlen_q, case.heads, case.head_dim);
    for (r, &exp) in want.lse.iter().enumerate() {
        if exp == f64::NEG_INFINITY {
            let (b, hh, i) = (r / (h * sq), (r / sq) % h, r % sq);
            let row = &out[((b * sq + i) * h + hh) * d..][..d];
            if row.iter().any(|&x| x != 0.0) {
                return Err(format!("{case:?}: row (b {b}, h {hh}, i {i}) sees no key but O = {row:?}"));
            }
        }
    }
    Ok(())
}

/// Random values in [-1, 1) with the shape of `case`'s output, for a linear loss `Σ out·W`
/// (whose gradient with respect to `out` is `W`).
pub fn random_dout(case: &Case, rng: &mut StdRng) -> Vec<f64> {
    let n: usize = case.q_shape().iter().product();
    (0..n).map(|_| 2.0 * rng.random::<f64>() - 1.0).collect()
}

/// Compares the backward pass of `case` on `inputs` given `dout` (through the public API, dout
/// in the dtype of q) with [`naive::backward`]: every gradient by [`rel_err_floor`] with floor 1
/// (gradients can legitimately be ~0, e.g. dbias broadcast over keys), at most `tol`; dbias
/// present exactly when there is a bias, in its shape.
pub fn check_backward(case: &Case, inputs: &Inputs, dout: &[f64], tol: f64) -> Result<(), String> {
    let fwd = case.forward(inputs).map_err(|e| format!("{case:?}: forward failed: {e}"))?;
    let dout_t = Tensor::from_fn(&case.q_shape(), inputs.q.dtype(), &Device::Cpu, |i| dout[i]).unwrap();
    let g = fwd.backward(&dout_t).map_err(|e| format!("{case:?}: backward failed: {e}"))?;
    let spec = naive::Spec::of(case);
    let data = naive::Data::of(inputs);
    let nf = naive::forward(&spec, &data);
    let want = naive::backward(&spec, &data, &nf, &dout_t.to_f64_vec().unwrap());
    let cmp = |name: &str, t: &Tensor, shape: &[usize], exp: &[f64]| -> Result<(), String> {
        if t.shape() != shape {
            return Err(format!("{case:?}: {name} has shape {:?}, expected {shape:?}", t.shape()));
        }
        let e = rel_err_floor(&t.to_f64_vec().unwrap(), exp, 1.0);
        if e > tol { Err(format!("{case:?}: {name} err {e:e} > {tol:e} against the naive backward")) } else { Ok(()) }
    };
    cmp("dq", &g.dq, &case.q_shape(), &want.dq)?;
    cmp("dk", &g.dk, &case.kv_shape(), &want.dk)?;
    cmp("dv", &g.dv, &case.kv_shape(), &want.dv)?;
    match (&g.dbias, &want.dbias, case.bias) {
        (None, None, None) => Ok(()),
        (Some(t), Some(exp), Some(shape)) => cmp("dbias", t, &shape, exp),
        (got, _, _) => Err(format!("{case:?}: dbias is {got:?} but the bias is {:?}", case.bias)),
    }
}

/// A naive attention written independently of dmattn's reference, for the tests to compare
/// against: every broadcast operand is expanded explicitly to `[b, h, sq, sk]` (axis by axis),
/// the full score matrix is materialised, and the backward pass works on whole matrices
/// (dP = dO·Vᵀ, dS = P∘(dP − rowsum(dO∘O)), …). Everything in f64.
pub mod naive {
    use super::{Case, Inputs};

    /// Sizes and options of a problem, the default scale resolved.
    #[derive(Clone, Debug)]
    pub struct Spec {
        pub b: usize,
        pub sq: usize,
        pub sk: usize,
        pub h: usize,
        pub hk: usize,
        pub d: usize,
        pub mask: Option<[usize; 4]>,
        pub bias: Option<[usize; 4]>,
        pub causal: bool,
        pub scale: f64,
        pub softcap: f64,
    }

    impl Spec {
        pub fn of(c: &Case) -> Spec {
            Spec {
                b: c.batch,
                sq: c.seqlen_q,
                sk: c.seqlen_k,
                h: c.heads,
                hk: c.kv_heads,
                d: c.head_dim,
                mask: c.mask,
                bias: c.bias,
                causal: c.causal,
                scale: c.scale.unwrap_or(1.0 / (c.head_dim as f64).sqrt()),
                softcap: c.softcap,
            }
        }

        /// Number of elements of a `[b, h, sq, sk]` matrix.
        pub fn full_len(&self) -> usize {
            self.b * self.h * self.sq * self.sk
        }

        /// Key head of query head `hh`.
        pub fn kv_head(&self, hh: usize) -> usize {
            hh / (self.h / self.hk)
        }

        /// Offset of row (b, i, head) of a `[b, s, heads, d]` tensor.
        fn row(&self, b: usize, i: usize, s: usize, heads: usize, head: usize) -> usize {
            ((b * s + i) * heads + head) * self.d
        }
    }

    /// The operands as f64 in row-major order.
    #[derive(Clone, Debug)]
    pub struct Data {
        pub q: Vec<f64>,
        pub k: Vec<f64>,
        pub v: Vec<f64>,
        pub mask: Option<Vec<bool>>,
        pub bias: Option<Vec<f64>>,
    }

    impl Data {
        pub fn of(i: &Inputs) -> Data {
            Data {
                q: i.q.to_f64_vec().unwrap(),
                k: i.k.to_f64_vec().unwrap(),
                v: i.v.to_f64_vec().unwrap(),
                mask: i.mask.as_ref().map(|m| m.to_f64_vec().unwrap().into_iter().map(|x| x != 0.0).collect()),
                bias: i.bias.as_ref().map(|b| b.to_f64_vec().unwrap()),
            }
        }
    }

    /// Which source head expanded head `hh` reads, for an operand with `n` heads.
    fn head_source(n: usize, h: usize, hk: usize, hh: usize) -> usize {
        if n == 1 {
            0
        } else if n == h {
            hh
        } else {
            assert_eq!(n, hk, "a broadcast head dim must be 1, kv_heads or heads");
            hh / (h / hk)
        }
    }

    /// Repeats axis `axis` of `src` (shape `shape`) to length `len`, new index `t` taking old
    /// index `from(t)`; updates `shape`.
    fn expand_axis<T: Copy>(src: &[T], shape: &mut [usize; 4], axis: usize, len: usize, from: impl Fn(usize) -> usize) -> Vec<T> {
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let old = shape[axis];
        let mut out = Vec::with_capacity(outer * len * inner);
        for o in 0..outer {
            for t in 0..len {
                let s = from(t);
                assert!(s < old);
                out.extend_from_slice(&src[(o * old + s) * inner..][..inner]);
            }
        }
        shape[axis] = len;
        out
    }

    /// Sums axis `axis` of `src` (shape `shape`) down to length `len`, old index `t` adding into
    /// new index `to(t)`; updates `shape`.
    fn sum_axis(src: &[f64], shape: &mut [usize; 4], axis: usize, len: usize, to: impl Fn(usize) -> usize) -> Vec<f64> {
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let old = shape[axis];
        let mut out = vec![0.0; outer * len * inner];
        for o in 0..outer {
            for t in 0..old {
                let dst = (o * len + to(t)) * inner;
                for x in 0..inner {
                    out[dst + x] += src[(o * old + t) * inner + x];
                }
            }
        }
        shape[axis] = len;
        out
    }

    /// A broadcast operand of shape `shape` expanded to `[b, h, sq, sk]`.
    pub fn expand<T: Copy>(spec: &Spec, shape: [usize; 4], src: &[T]) -> Vec<T> {
        assert_eq!(src.len(), shape.iter().product::<usize>());
        let pick = |n: usize| move |t: usize| if n == 1 { 0 } else { t };
        let mut s = shape;
        let x = expand_axis(src, &mut s, 3, spec.sk, pick(shape[3]));
        let x = expand_axis(&x, &mut s, 2, spec.sq, pick(shape[2]));
        let x = expand_axis(&x, &mut s, 1, spec.h, |hh| head_source(shape[1], spec.h, spec.hk, hh));
        expand_axis(&x, &mut s, 0, spec.b, pick(shape[0]))
    }

    /// The adjoint of [`expand`]: a `[b, h, sq, sk]` array summed onto the broadcast `shape`.
    pub fn reduce(spec: &Spec, shape: [usize; 4], full: &[f64]) -> Vec<f64> {
        assert_eq!(full.len(), spec.full_len());
        let pick = |n: usize| move |t: usize| if n == 1 { 0 } else { t };
        let mut s = [spec.b, spec.h, spec.sq, spec.sk];
        let x = sum_axis(full, &mut s, 0, shape[0], pick(shape[0]));
        let x = sum_axis(&x, &mut s, 1, shape[1], |hh| head_source(shape[1], spec.h, spec.hk, hh));
        let x = sum_axis(&x, &mut s, 2, shape[2], pick(shape[2]));
        sum_axis(&x, &mut s, 3, shape[3], pick(shape[3]))
    }

    /// `[b, h, sq, sk]`: whether key j is visible to query i (mask and causal).
    pub fn visible(spec: &Spec, data: &Data) -> Vec<bool> {
        let mask = match (spec.mask, &data.mask) {
            (Some(s), Some(m)) => expand(spec, s, m),
            _ => vec![true; spec.full_len()],
        };
        (0..spec.full_len())
            .map(|x| {
                let (j, i) = (x % spec.sk, (x / spec.sk) % spec.sq);
                // Bottom-right aligned: j <= i + sk - sq.
                mask[x] && (!spec.causal || j + spec.sq <= i + spec.sk)
            })
            .collect()
    }

    /// `[b, h, sq]`: whether each query row sees at least one key.
    pub fn row_has_key(spec: &Spec, data: &Data) -> Vec<bool> {
        visible(spec, data).chunks(spec.sk).map(|r| r.iter().any(|&v| v)).collect()
    }

    /// The forward pass and its intermediate matrices.
    pub struct Fwd {
        /// `[b, sq, h, d]`.
        pub out: Vec<f64>,
        /// `[b, h, sq]`, -inf on rows that see no key.
        pub lse: Vec<f64>,
        /// `[b, h, sq, sk]`: `scale · q·k` (before softcap).
        pub raw: Vec<f64>,
        /// `[b, h, sq, sk]`: probabilities, 0 where hidden.
        pub p: Vec<f64>,
        pub visible: Vec<bool>,
    }

    pub fn forward(spec: &Spec, data: &Data) -> Fwd {
        let (sq, sk, h, hk, d) = (spec.sq, spec.sk, spec.h, spec.hk, spec.d);
        let visible = visible(spec, data);
        let bias = match (spec.bias, &data.bias) {
            (Some(s), Some(b)) => expand(spec, s, b),
            _ => vec![0.0; spec.full_len()],
        };
        let mut raw = vec![0.0; spec.full_len()];
        let mut logits = vec![f64::NEG_INFINITY; spec.full_len()];
        for b in 0..spec.b {
            for hh in 0..h {
                for i in 0..sq {
                    let q = &data.q[spec.row(b, i, sq, h, hh)..][..d];
                    for j in 0..sk {
                        let k = &data.k[spec.row(b, j, sk, hk, spec.kv_head(hh))..][..d];
                        let x = ((b * h + hh) * sq + i) * sk + j;
                        raw[x] = spec.scale * q.iter().zip(k).map(|(a, c)| a * c).sum::<f64>();
                        let capped = if spec.softcap > 0.0 { spec.softcap * (raw[x] / spec.softcap).tanh() } else { raw[x] };
                        if visible[x] {
                            logits[x] = capped + bias[x];
                        }
                    }
                }
            }
        }
        let mut p = vec![0.0; spec.full_len()];
        let mut lse = vec![f64::NEG_INFINITY; spec.b * h * sq];
        for (r, row) in logits.chunks(sk).enumerate() {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                continue;
            }
            let sum: f64 = row.iter().map(|&l| (l - m).exp()).sum();
            lse[r] = m + sum.ln();
            for j in 0..sk {
                p[r * sk + j] = (row[j] - m).exp() / sum;
            }
        }
        let mut out = vec![0.0; spec.b * sq * h * d];
        for b in 0..spec.b {
            for hh in 0..h {
                for i in 0..sq {
                    let o = spec.row(b, i, sq, h, hh);
                    for j in 0..sk {
                        let pij = p[((b * h + hh) * sq + i) * sk + j];
                        let v = &data.v[spec.row(b, j, sk, hk, spec.kv_head(hh))..][..d];
                        for c in 0..d {
                            out[o + c] += pij * v[c];
                        }
                    }
                }
            }
        }
        Fwd { out, lse, raw, p, visible }
    }

    /// Gradients in the operands' shapes; dbias summed onto the bias shape.
    #[derive(Clone, Debug)]
    pub struct Grads {
        pub dq: Vec<f64>,
        pub dk: Vec<f64>,
        pub dv: Vec<f64>,
        pub dbias: Option<Vec<f64>>,
    }

    /// The backward pass given `dout` `[b, sq, h, d]`, with whole matrices per (batch, head).
    pub fn backward(spec: &Spec, data: &Data, fwd: &Fwd, dout: &[f64]) -> Grads {
        let (sq, sk, h, hk, d) = (spec.sq, spec.sk, spec.h, spec.hk, spec.d);
        let mut dq = vec![0.0; data.q.len()];
        let mut dk = vec![0.0; data.k.len()];
        let mut dv = vec![0.0; data.v.len()];
        let mut ds_full = vec![0.0; spec.full_len()];
        for b in 0..spec.b {
            for hh in 0..h {
                let kvh = spec.kv_head(hh);
                let m = |i: usize, j: usize| ((b * h + hh) * sq + i) * sk + j;
                // dP = dO·Vᵀ   [sq, sk]
                let mut dp = vec![0.0; sq * sk];
                for i in 0..sq {
                    let g = &dout[spec.row(b, i, sq, h, hh)..][..d];
                    for j in 0..sk {
                        let v = &data.v[spec.row(b, j, sk, hk, kvh)..][..d];
                        dp[i * sk + j] = g.iter().zip(v).map(|(a, c)| a * c).sum();
                    }
                }
                // Dᵢ = rowsum(dO ∘ O)
                let delta: Vec<f64> = (0..sq)
                    .map(|i| {
                        let r = spec.row(b, i, sq, h, hh);
                        dout[r..r + d].iter().zip(&fwd.out[r..r + d]).map(|(a, c)| a * c).sum()
                    })
                    .collect();
                // dS = P ∘ (dP − D);  dRaw = dS ∘ softcap'(raw)
                let mut draw = vec![0.0; sq * sk];
                for i in 0..sq {
                    for j in 0..sk {
                        let ds = fwd.p[m(i, j)] * (dp[i * sk + j] - delta[i]);
                        ds_full[m(i, j)] = ds;
                        let dcap = if spec.softcap > 0.0 { 1.0 - (fwd.raw[m(i, j)] / spec.softcap).tanh().powi(2) } else { 1.0 };
                        draw[i * sk + j] = ds * dcap;
                    }
                }
                // dQ = scale · dRaw·K;  dK += scale · dRawᵀ·Q;  dV += Pᵀ·dO
                for i in 0..sq {
                    let qr = spec.row(b, i, sq, h, hh);
                    for j in 0..sk {
                        let kr = spec.row(b, j, sk, hk, kvh);
                        let w = spec.scale * draw[i * sk + j];
                        let pij = fwd.p[m(i, j)];
                        for c in 0..d {
                            dq[qr + c] += w * data.k[kr + c];
                            dk[kr + c] += w * data.q[qr + c];
                            dv[kr + c] += pij * dout[qr + c];
                        }
                    }
                }
            }
        }
        let dbias = spec.bias.map(|s| reduce(spec, s, &ds_full));
        Grads { dq, dk, dv, dbias }
    }

    /// The backward pass with every term made non-negative (|q|, |k|, |dO|, and
    /// `P (|dP| + |delta|)` for dS): the size of the sums each gradient is made of. Rounding in
    /// a low-precision backward is proportional to these, not to the gradient itself, which
    /// cancellation can make arbitrarily small; tests bound GPU errors by them.
    pub fn backward_magnitudes(spec: &Spec, data: &Data, fwd: &Fwd, dout: &[f64]) -> Grads {
        let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
        let (mut d, o, g) = (data.clone(), abs(&fwd.out), abs(dout));
        (d.q, d.k, d.v) = (abs(&d.q), abs(&d.k), abs(&d.v));
        // With |O| and |dO|, delta and dP are sums of magnitudes, and dP + delta bounds
        // |dP - delta|; backward() subtracts, so flip delta's sign through -|O|.
        let neg_o: Vec<f64> = o.iter().map(|x| -x).collect();
        let f = Fwd { out: neg_o, lse: fwd.lse.clone(), raw: fwd.raw.clone(), p: fwd.p.clone(), visible: fwd.visible.clone() };
        let mut grads = backward(spec, &d, &f, &g);
        for v in [&mut grads.dq, &mut grads.dk, &mut grads.dv].into_iter().chain(grads.dbias.as_mut()) {
            v.iter_mut().for_each(|x| *x = x.abs());
        }
        grads
    }
}
