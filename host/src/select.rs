//! Masks made from a bias on its own device (Flash-DMA's `create_mask`): per row, the top-k keys
//! of largest bias or the keys of positive bias, among those an optional mask shows, optionally
//! smoothed over key blocks; as a bool mask, a bit-packed mask or an index list, each of which
//! the attention call takes ([`crate::Attention::mask`], [`crate::SparseMask::packed_bits`],
//! [`crate::Attention::indices`]).
use crate::cpu::pick;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, checked_product};
use std::cmp::Ordering;

/// Starts a key selection over `bias` `[{1|b}, {1|h}, {1|sq}, sk]` (f16, bf16 or f32; f64 on
/// the CPU), run on the bias's device: choose [`SelectKeys::top_k`] or [`SelectKeys::relu`], then
/// an output.
///
/// ```
/// # fn main() -> dmattn::Result<()> {
/// use dmattn::{DType, Device, Tensor, select_keys};
/// // A key-side bias (b1, hk1, one row for every query, 8 keys): keep the top 3 keys.
/// let bias = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.0, 2.0, 7.0, -3.0, 1.0], &[1, 1, 1, 8], &Device::Cpu)?;
/// let top = select_keys(&bias).top_k(3);
/// assert_eq!(top.indices()?.to_vec::<i32>()?, [2, 4, 5]); // 2.0 twice: both fit
/// let keep = top.mask()?; // Bool [1, 1, 1, 8], for `attention(..).mask(&keep)`
/// assert_eq!(keep.dtype(), DType::Bool);
/// # Ok(()) }
/// ```
pub fn select_keys(bias: &Tensor) -> SelectKeys {
    SelectKeys { bias: bias.clone(), mask: None, rule: None, block: None }
}

/// A key selection (see [`select_keys`]). Each row of the output `[b', h', q', sk]` (the bias's
/// and the mask's shapes broadcast together) chooses among its *eligible* keys: those the mask
/// shows (every key without one).
///
/// - **Top-k** ([`SelectKeys::top_k`]): the `k` eligible keys of largest bias; ties go to the
///   lower key, NaN ranks above +inf and -0 equals +0 (as `torch.topk`). A row with fewer
///   than `k` eligible keys keeps them all. Unlike Flash-DMA's `create_mask` (which fills hidden
///   keys with the dtype's minimum first), a visible key whose bias is that minimum or -inf
///   still counts.
/// - **Relu** ([`SelectKeys::relu`]): the eligible keys of bias > 0.
/// - **Block smoothing** ([`SelectKeys::block_size`]): then every block of `n` keys along the
///   row (the last one shorter) is kept whole when more than half of its keys are, else dropped,
///   and hidden keys stay hidden: a top-k row keeps fewer than `2k` keys after it.
///
/// Outputs: [`SelectKeys::mask`] (Bool), [`SelectKeys::packed_mask`] (bits) and
/// [`SelectKeys::indices`] (I32 key lists). The CUDA backend finds the k-th largest bias by a
/// radix select, without sorting, one CTA per row where rows fill the GPU, and over many CTAs a
/// row where rows are few and long (at least 16K keys, no more rows than SMs) or longer than a
/// CTA's shared memory holds (about 600K keys on an H100; with block smoothing, which needs the
/// whole row in one CTA, such rows are an error); its outputs equal the CPU's bit for bit.
#[derive(Clone)]
pub struct SelectKeys {
    bias: Tensor,
    mask: Option<Tensor>,
    rule: Option<Rule>,
    block: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    TopK(usize),
    Relu,
}

/// The output forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output {
    Mask,
    Packed,
    Indices,
}

/// A checked selection: what a backend needs to run it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Output rows `[b, h, q]` and the keys of each.
    pub rows: [usize; 3],
    pub sk: usize,
    /// Keys kept per row (0: relu).
    pub k: usize,
    /// Smoothing block (0: none).
    pub block: usize,
    /// Entries per index list.
    pub width: usize,
}

impl Plan {
    pub(crate) fn row_count(&self) -> usize {
        self.rows.iter().product()
    }

    /// The output's shape.
    pub(crate) fn shape(&self, out: Output) -> Vec<usize> {
        let last = match out {
            Output::Mask => self.sk,
            Output::Packed => self.sk.div_ceil(8),
            Output::Indices => self.width,
        };
        vec![self.rows[0], self.rows[1], self.rows[2], last]
    }
}

impl SelectKeys {
    /// Keeps the `k` eligible keys of largest bias in each row (`k` ≥ 1; more than the row's
    /// keys keeps them all).
    pub fn top_k(mut self, k: usize) -> Self {
        self.rule = Some(Rule::TopK(k));
        self
    }

    /// Keeps the eligible keys of positive bias.
    pub fn relu(mut self) -> Self {
        self.rule = Some(Rule::Relu);
        self
    }

    /// Only keys `mask` shows are eligible: a Bool mask `[{1|b}, {1|h}, {1|sq}, {1|sk}]`
    /// broadcastable with the bias, on its device. A key-side bias with a per-query mask gives
    /// per-query rows (Flash-DMA's top-k within an incoming 4-D mask).
    pub fn within(mut self, mask: &Tensor) -> Self {
        self.mask = Some(mask.clone());
        self
    }

    /// Smooths the selection over blocks of `n` keys (`n` ≥ 1) by majority vote.
    pub fn block_size(mut self, n: usize) -> Self {
        self.block = Some(n);
        self
    }

    /// The selection as a Bool mask `[b', h', q', sk]` (true = kept).
    pub fn mask(&self) -> Result<Tensor> {
        self.run(Output::Mask)
    }

    /// The selection bit-packed, U8 `[b', h', q', ceil(sk / 8)]` in the layout
    /// [`crate::SparseMask::packed_bits`] takes (key `j` is bit `j % 8` of byte `j / 8`): an eighth
    /// of the bool mask's bytes.
    pub fn packed_mask(&self) -> Result<Tensor> {
        self.run(Output::Packed)
    }

    /// The kept keys of each row in ascending order, then -1: I32 `[b', h', q', w]`, what
    /// [`crate::Attention::indices`] takes. `w` is `k`, or with block smoothing
    /// `max(k, min(2k, sk))` (a smoothed row keeps fewer than `2k` keys). Top-k only: a relu
    /// selection keeps a number of keys known only after it ran.
    pub fn indices(&self) -> Result<Tensor> {
        self.run(Output::Indices)
    }

    fn run(&self, out: Output) -> Result<Tensor> {
        let plan = self.plan(out)?;
        match self.bias.device() {
            Device::Cpu => cpu_output(&plan, out, &self.bias, self.mask.as_ref()),
            Device::Cuda(dev) => crate::cuda::select_keys(&dev, &plan, out, &self.bias, self.mask.as_ref()),
        }
    }

    /// Checks the selection (typed errors naming the argument) and sizes it.
    pub(crate) fn plan(&self, out: Output) -> Result<Plan> {
        let k = match self.rule {
            None => {
                return Err(Error::Param { arg: "select_keys", reason: "choose a rule: .top_k(k) or .relu()".into() });
            }
            Some(Rule::TopK(0)) => {
                return Err(Error::Param { arg: "k", reason: "top_k needs k >= 1".into() });
            }
            Some(Rule::TopK(k)) => k,
            Some(Rule::Relu) if out == Output::Indices => {
                return Err(Error::Param {
                    arg: "indices",
                    reason: "index lists need a top_k selection (a relu selection keeps a data-dependent number of keys): use .mask() or .packed_mask()".into(),
                });
            }
            Some(Rule::Relu) => 0,
        };
        let block = match self.block {
            Some(0) => {
                return Err(Error::Param { arg: "block_size", reason: "must be at least 1".into() });
            }
            b => b.unwrap_or(0),
        };
        let bias = &self.bias;
        if !bias.dtype().is_float() {
            return Err(Error::DType { arg: "bias", expected: "f16, bf16, f32 or f64".into(), got: bias.dtype() });
        }
        let b = shape4(bias, "bias", "[{1|b}, {1|h}, {1|sq}, sk]")?;
        let mut shape = b;
        if let Some(m) = &self.mask {
            if m.dtype() != DType::Bool {
                return Err(Error::DType { arg: "mask", expected: "Bool".into(), got: m.dtype() });
            }
            if !m.device().same(&bias.device()) {
                return Err(Error::Device { arg: "mask", expected: format!("{} (the device of bias)", bias.device()), got: m.device().to_string() });
            }
            let s = shape4(m, "mask", &format!("broadcastable with the bias's {b:?}"))?;
            for d in 0..4 {
                if s[d] != b[d] && s[d] != 1 && b[d] != 1 {
                    return Err(Error::Shape { arg: "mask", expected: format!("a shape broadcastable with the bias's {b:?}"), got: s.to_vec() });
                }
                shape[d] = s[d].max(b[d]);
            }
            // The bias's own elements fit in usize; a broadcast with the mask (zero-stride views
            // are cheap) may not: the selection's [rows, sk] flags must.
            if checked_product(&shape).is_none() {
                return Err(Error::Shape { arg: "mask", expected: format!("a shape broadcastable with the bias's {b:?}, the broadcast's elements within usize"), got: s.to_vec() });
            }
        }
        let sk = shape[3];
        // k is the caller's (past the row's keys it keeps them all): saturating, and index lists
        // `width` entries wide must fit in usize.
        let width = if block > 0 { k.max(k.saturating_mul(2).min(sk)) } else { k };
        if out == Output::Indices && checked_product(&[4, width, shape[0], shape[1], shape[2]]).is_none() {
            return Err(Error::Param { arg: "k", reason: format!("index lists of {width} i32 entries for {:?} rows: their bytes overflow usize", &shape[..3]) });
        }
        Ok(Plan { rows: [shape[0], shape[1], shape[2]], sk, k, block, width })
    }
}

/// `t`'s shape as four non-zero dims.
fn shape4(t: &Tensor, arg: &'static str, expected: &str) -> Result<[usize; 4]> {
    let s = <[usize; 4]>::try_from(t.shape()).map_err(|_| Error::Shape { arg, expected: expected.into(), got: t.shape().to_vec() })?;
    if s.contains(&0) {
        return Err(Error::Shape { arg, expected: format!("{expected} with no empty dimension"), got: s.to_vec() });
    }
    Ok(s)
}

/// The order top-k ranks bias values in: NaN above everything, -0 equal to +0.
fn rank(a: f64, b: f64) -> Ordering {
    let key = |v: f64| (v.is_nan(), if v.is_nan() { 0.0 } else { v });
    let (ka, kb) = (key(a), key(b));
    ka.0.cmp(&kb.0).then(ka.1.partial_cmp(&kb.1).expect("not NaN"))
}

/// The kept flags of every row, `[rows, sk]` row-major: the reference the GPU is tested
/// against (a sort per row).
pub(crate) fn kept_rows(plan: &Plan, bias: &Tensor, mask: Option<&Tensor>) -> Result<Vec<bool>> {
    let (bs, bv) = (bias.shape().to_vec(), bias.to_f64_vec()?);
    let m = match mask {
        Some(m) => Some((m.shape().to_vec(), m.to_f64_vec()?)),
        None => None,
    };
    let at = |s: &[usize], b: usize, h: usize, q: usize, j: usize| ((pick(s[0], b) * s[1] + pick(s[1], h)) * s[2] + pick(s[2], q)) * s[3] + pick(s[3], j);
    let [nb, nh, nq] = plan.rows;
    let sk = plan.sk;
    let mut out = vec![false; plan.row_count() * sk];
    for (r, row) in out.chunks_mut(sk).enumerate() {
        let (b, h, q) = (r / (nh * nq), (r / nq) % nh, r % nq);
        let value = |j: usize| bv[at(&bs, b, h, q, j)];
        let eligible: Vec<bool> = (0..sk).map(|j| m.as_ref().is_none_or(|(s, v)| v[at(s, b, h, q, j)] != 0.0)).collect();
        if plan.k == 0 {
            for j in 0..sk {
                row[j] = eligible[j] && value(j) > 0.0;
            }
        } else {
            let mut keys: Vec<usize> = (0..sk).filter(|&j| eligible[j]).collect();
            keys.sort_by(|&a, &c| rank(value(c), value(a)).then(a.cmp(&c)));
            for &j in keys.iter().take(plan.k) {
                row[j] = true;
            }
        }
        if plan.block > 0 {
            for (lo, block) in (0..sk).step_by(plan.block).zip(row.chunks_mut(plan.block)) {
                let majority = 2 * block.iter().filter(|&&x| x).count() > block.len();
                for (j, x) in block.iter_mut().enumerate() {
                    *x = majority && eligible[lo + j];
                }
            }
        }
    }
    debug_assert!(nb * nh * nq * sk == out.len());
    Ok(out)
}

/// The CPU backend: [`kept_rows`] in the output's form.
fn cpu_output(plan: &Plan, out: Output, bias: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    let kept = kept_rows(plan, bias, mask)?;
    let shape = plan.shape(out);
    let cpu = Device::Cpu;
    match out {
        Output::Mask => Tensor::from_fn(&shape, DType::Bool, &cpu, |i| kept[i] as u8 as f64),
        Output::Packed => {
            let row_bytes = plan.sk.div_ceil(8);
            let bytes: Vec<u8> = kept
                .chunks(plan.sk)
                .flat_map(|row| (0..row_bytes).map(move |byte| (0..8).fold(0u8, |v, b| v | ((row.get(8 * byte + b) == Some(&true)) as u8) << b)))
                .collect();
            Tensor::from_fn(&shape, DType::U8, &cpu, |i| bytes[i] as f64)
        }
        Output::Indices => {
            let mut lists = Vec::with_capacity(plan.row_count() * plan.width);
            for row in kept.chunks(plan.sk) {
                let keys: Vec<i32> = (0..plan.sk).filter(|&j| row[j]).map(|j| j as i32).collect();
                debug_assert!(keys.len() <= plan.width);
                lists.extend(keys.iter().copied().chain(std::iter::repeat(-1)).take(plan.width));
            }
            Tensor::from_vec(lists, &shape, &cpu)
        }
    }
}
