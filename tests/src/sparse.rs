//! Sparse masks for the tests: a description of a [`dmattn::SparseMask`] (its parametric
//! constructors and its data parts with their values), the mask built from it on a device, random
//! descriptions, and what a description means worked out here, independently of dmattn, straight
//! from the documented rules: the band around the (bottom-right or compressed) diagonal, sink
//! keys, the bit order of packed bytes, block bitsets, BCSR rows, dense masks rounded up to
//! blocks, and the head broadcast of mask planes. The meaning is a dense `[b, h, sq, sk]`
//! visibility, which the tests hand to dmattn's dense-mask path (the reference) as the mask the
//! sparse one must equal.
use crate::{Case, ForwardPath, Inputs, compare_forward, compare_gradients, gpu_dout, grads_vec, naive, seeded_rng};
use dmattn::{DType, Device, PreparedMask, SparseMask, Tensor};
use proptest::prelude::*;
use rand::Rng;
use rand::rngs::StdRng;
use std::fmt;

/// One parametric constructor of [`SparseMask`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BandCtor {
    All,
    Causal,
    Window(Option<usize>, Option<usize>),
    CausalWindow(usize),
    CompressCausal(usize),
}

impl BandCtor {
    pub fn build(self) -> SparseMask {
        match self {
            BandCtor::All => SparseMask::all(),
            BandCtor::Causal => SparseMask::causal(),
            BandCtor::Window(l, r) => SparseMask::window(l, r),
            BandCtor::CausalWindow(l) => SparseMask::causal_window(l),
            BandCtor::CompressCausal(cf) => SparseMask::compress_causal(cf),
        }
    }

    /// `(left, right, compress factor)` as the constructors' docs define them.
    fn edges(self) -> (Option<usize>, Option<usize>, Option<usize>) {
        match self {
            BandCtor::All => (None, None, None),
            BandCtor::Causal => (None, Some(0), None),
            BandCtor::Window(l, r) => (l, r, None),
            BandCtor::CausalWindow(l) => (Some(l), Some(0), None),
            BandCtor::CompressCausal(cf) => (None, Some(0), Some(cf)),
        }
    }
}

/// One data part of a mask, with its values (row-major).
#[derive(Clone)]
pub enum DataPart {
    /// Bool `[{1|b}, {1|hk|h}, {1|sq}, {1|sk}]`.
    Dense { shape: [usize; 4], keep: Vec<bool> },
    /// U8 `[{1|b}, {1|hk|h}, {1|sq}, ceil(sk / 8)]`, key `j` at bit `j % 8` of byte `j / 8`.
    Packed { shape: [usize; 4], bytes: Vec<u8> },
    /// Bool `[{1|b}, {1|hk|h}, ceil(sq / block), ceil(sk / block)]`.
    Bitset { shape: [usize; 4], kept: Vec<bool>, block: usize },
    /// A dense bool mask (shape as `Dense`) rounded up to `block`-sized blocks.
    DenseBlocks { shape: [usize; 4], keep: Vec<bool>, block: usize },
    /// I32 `row_ptr` `[pb, ph, ceil(sq / block) + 1]`, `col_idx` `[pb, ph, nnz]`.
    Bcsr { planes: [usize; 2], block: usize, row_ptr: Vec<i32>, col_idx: Vec<i32>, nnz: usize },
}

impl fmt::Debug for DataPart {
    /// A summary: the kind, shape and how many entries are set (the values come from the seed).
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let on = |v: &[bool]| v.iter().filter(|&&x| x).count();
        match self {
            DataPart::Dense { shape, keep } => write!(f, "dense({shape:?}, {}/{} true)", on(keep), keep.len()),
            DataPart::Packed { shape, bytes } => {
                write!(f, "packed_bits({shape:?}, {}/{} bits set)", bytes.iter().map(|b| b.count_ones()).sum::<u32>(), 8 * bytes.len())
            }
            DataPart::Bitset { shape, kept, block } => write!(f, "block_bitset({shape:?}, block {block}, {}/{} kept)", on(kept), kept.len()),
            DataPart::DenseBlocks { shape, keep, block } => write!(f, "dense_blocks({shape:?}, block {block}, {}/{} true)", on(keep), keep.len()),
            DataPart::Bcsr { planes, block, row_ptr, col_idx, nnz } => {
                write!(f, "bcsr(planes {planes:?}, block {block}, nnz {nnz}, row_ptr {row_ptr:?}, col_idx {col_idx:?})")
            }
        }
    }
}

/// Index of the source head an expanded head `hh` (of `h`, `hk` kv heads) reads from an operand
/// with `n` heads: 1 broadcasts, `h` is one per query head, `hk` one per kv head.
pub fn plane_head(n: usize, h: usize, hk: usize, hh: usize) -> usize {
    if n == 1 {
        0
    } else if n == h {
        hh
    } else {
        assert_eq!(n, hk, "a mask plane count must be 1, kv_heads or heads");
        hh / (h / hk)
    }
}

fn pick(n: usize, x: usize) -> usize {
    if n == 1 { 0 } else { x }
}

impl DataPart {
    /// The `[batch, heads]` plane dims.
    pub fn planes(&self) -> [usize; 2] {
        match self {
            DataPart::Dense { shape, .. } | DataPart::Packed { shape, .. } | DataPart::Bitset { shape, .. } | DataPart::DenseBlocks { shape, .. } => {
                [shape[0], shape[1]]
            }
            DataPart::Bcsr { planes, .. } => *planes,
        }
    }

    /// The part as a [`SparseMask`], its tensors on `device`.
    pub fn build(&self, device: &Device) -> dmattn::Result<SparseMask> {
        Ok(match self {
            DataPart::Dense { shape, keep } => SparseMask::dense(&Tensor::from_vec(keep.clone(), shape, device)?),
            DataPart::Packed { shape, bytes } => SparseMask::packed_bits(&Tensor::from_vec(bytes.clone(), shape, device)?),
            DataPart::Bitset { shape, kept, block } => SparseMask::block_bitset(&Tensor::from_vec(kept.clone(), shape, device)?, *block),
            DataPart::DenseBlocks { shape, keep, block } => SparseMask::dense_blocks(&Tensor::from_vec(keep.clone(), shape, device)?, *block),
            DataPart::Bcsr { planes, block, row_ptr, col_idx, nnz } => {
                let rows = row_ptr.len() / (planes[0] * planes[1]);
                let rp = Tensor::from_vec(row_ptr.clone(), &[planes[0], planes[1], rows], device)?;
                let ci = Tensor::from_vec(col_idx.clone(), &[planes[0], planes[1], *nnz], device)?;
                SparseMask::bcsr(&rp, &ci, *block)
            }
        })
    }

    /// Whether the part shows key `j` to query `i` in its plane `(pb, ph)` (its own plane
    /// indices), as a table `[pb, ph, sq, sk]`.
    fn table(&self, sq: usize, sk: usize) -> Vec<bool> {
        let [pb, ph] = self.planes();
        let mut out = vec![false; pb * ph * sq * sk];
        let dense = |shape: &[usize; 4], keep: &[bool], p: usize, i: usize, j: usize| keep[(p * shape[2] + pick(shape[2], i)) * shape[3] + pick(shape[3], j)];
        for p in 0..pb * ph {
            let at = |i: usize, j: usize| (p * sq + i) * sk + j;
            match self {
                DataPart::Dense { shape, keep } => {
                    for (i, j) in (0..sq).flat_map(|i| (0..sk).map(move |j| (i, j))) {
                        out[at(i, j)] = dense(shape, keep, p, i, j);
                    }
                }
                DataPart::Packed { shape, bytes } => {
                    for (i, j) in (0..sq).flat_map(|i| (0..sk).map(move |j| (i, j))) {
                        let byte = bytes[(p * shape[2] + pick(shape[2], i)) * shape[3] + j / 8];
                        out[at(i, j)] = (byte >> (j % 8)) & 1 == 1;
                    }
                }
                DataPart::Bitset { shape, kept, block } => {
                    for (i, j) in (0..sq).flat_map(|i| (0..sk).map(move |j| (i, j))) {
                        out[at(i, j)] = kept[(p * shape[2] + i / block) * shape[3] + j / block];
                    }
                }
                DataPart::DenseBlocks { shape, keep, block } => {
                    let (qb, kb) = (sq.div_ceil(*block), sk.div_ceil(*block));
                    let mut any = vec![false; qb * kb];
                    for (i, j) in (0..sq).flat_map(|i| (0..sk).map(move |j| (i, j))) {
                        any[(i / block) * kb + j / block] |= dense(shape, keep, p, i, j);
                    }
                    for (i, j) in (0..sq).flat_map(|i| (0..sk).map(move |j| (i, j))) {
                        out[at(i, j)] = any[(i / block) * kb + j / block];
                    }
                }
                DataPart::Bcsr { block, row_ptr, col_idx, nnz, .. } => {
                    let qb = sq.div_ceil(*block);
                    let ptr = &row_ptr[p * (qb + 1)..][..qb + 1];
                    for i in 0..sq {
                        let r = i / block;
                        let cols = &col_idx[p * nnz..][ptr[r] as usize..ptr[r + 1] as usize];
                        for j in 0..sk {
                            out[at(i, j)] = cols.contains(&((j / block) as i32));
                        }
                    }
                }
            }
        }
        out
    }
}

/// A sparse mask described: parametric constructors (each with the sink count given to its
/// `with_sinks`, 0 for none) and data parts, all ANDed.
#[derive(Clone, Debug, Default)]
pub struct MaskSpec {
    pub bands: Vec<(BandCtor, usize)>,
    pub data: Vec<DataPart>,
}

/// The combined band: edges, sinks, compress factor.
#[derive(Clone, Copy, Debug, Default)]
pub struct BandModel {
    pub left: Option<usize>,
    pub right: Option<usize>,
    pub sinks: usize,
    pub compress: Option<usize>,
}

impl BandModel {
    /// Whether key `j` is visible to query `i`: `j < sk`, `j <= D(i) + right` and (`j >= D(i) -
    /// left` or `j < sinks`), where `D(i) = i + sk - sq`, or `floor(i / cf)` when compressed.
    pub fn visible(&self, sq: usize, sk: usize, i: usize, j: usize) -> bool {
        let diag = match self.compress {
            Some(cf) => (i / cf) as i128,
            None => i as i128 + sk as i128 - sq as i128,
        };
        let j = j as i128;
        let right_ok = self.right.is_none_or(|r| j <= diag + r as i128);
        let left_ok = self.left.is_none_or(|l| j >= diag - l as i128 || j < self.sinks as i128);
        j < sk as i128 && right_ok && left_ok
    }
}

impl MaskSpec {
    pub fn band(ctor: BandCtor, sinks: usize) -> Self {
        MaskSpec { bands: vec![(ctor, sinks)], data: Vec::new() }
    }

    pub fn data(part: DataPart) -> Self {
        MaskSpec { bands: Vec::new(), data: vec![part] }
    }

    /// Both at once.
    pub fn and(mut self, other: MaskSpec) -> Self {
        self.bands.extend(other.bands);
        self.data.extend(other.data);
        self
    }

    /// The mask, its tensors on `device`: the constructors, then `with_sinks`, then `and`.
    pub fn build(&self, device: &Device) -> dmattn::Result<SparseMask> {
        let bands = self.bands.iter().map(|&(c, s)| Ok(if s > 0 { c.build().with_sinks(s) } else { c.build() }));
        let data = self.data.iter().map(|p| p.build(device));
        let mut mask: Option<SparseMask> = None;
        for part in bands.chain(data) {
            let part = part?;
            mask = Some(match mask {
                None => part,
                Some(m) => m.and(part),
            });
        }
        Ok(mask.unwrap_or_else(SparseMask::all))
    }

    pub fn prepare(&self, device: &Device, sq: usize, sk: usize) -> dmattn::Result<PreparedMask> {
        self.build(device)?.prepare(sq, sk)
    }

    /// The combined band, as `SparseMask::and` documents it: on each side the narrower edge, the
    /// larger sink count, the (single) compress factor; `causal` adds a right edge of 0.
    pub fn band_model(&self, causal: bool) -> BandModel {
        let min = |a: Option<usize>, b: Option<usize>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let causal = causal.then_some((BandCtor::Causal, 0));
        self.bands.iter().copied().chain(causal).fold(BandModel::default(), |m, (ctor, sinks)| {
            let (l, r, c) = ctor.edges();
            assert!(m.compress.is_none() || c.is_none() || m.compress == c, "one compress factor per mask");
            BandModel { left: min(m.left, l), right: min(m.right, r), sinks: m.sinks.max(sinks), compress: m.compress.or(c) }
        })
    }

    /// The `[batch, heads]` planes of the data parts together (each dim the largest; 1 without).
    pub fn planes(&self) -> [usize; 2] {
        self.data.iter().fold([1, 1], |acc, p| {
            let q = p.planes();
            [acc[0].max(q[0]), acc[1].max(q[1])]
        })
    }

    /// The data parts together per plane of [`MaskSpec::planes`]: `[pb, ph, sq, sk]`.
    pub fn data_table(&self, sq: usize, sk: usize) -> Vec<bool> {
        let [pb, ph] = self.planes();
        let mut out = vec![true; pb * ph * sq * sk];
        for part in &self.data {
            let t = part.table(sq, sk);
            let [qb, qh] = part.planes();
            for (b, h) in (0..pb).flat_map(|b| (0..ph).map(move |h| (b, h))) {
                let src = &t[(pick(qb, b) * qh + pick(qh, h)) * sq * sk..][..sq * sk];
                let dst = &mut out[(b * ph + h) * sq * sk..][..sq * sk];
                dst.iter_mut().zip(src).for_each(|(d, s)| *d &= s);
            }
        }
        out
    }

    /// The equivalent dense mask `[b, h, sq, sk]` of a call of `case`'s sizes (with `causal`).
    pub fn visible(&self, case: &Case, causal: bool) -> Vec<bool> {
        let (b, h, hk, sq, sk) = (case.batch, case.heads, case.kv_heads, case.seqlen_q, case.seqlen_k);
        let band = self.band_model(causal);
        let [pb, ph] = self.planes();
        let data = self.data_table(sq, sk);
        let mut out = vec![false; b * h * sq * sk];
        for (bb, hh) in (0..b).flat_map(|bb| (0..h).map(move |hh| (bb, hh))) {
            let plane = &data[(pick(pb, bb) * ph + plane_head(ph, h, hk, hh)) * sq * sk..][..sq * sk];
            for i in 0..sq {
                for j in 0..sk {
                    out[((bb * h + hh) * sq + i) * sk + j] = plane[i * sk + j] && band.visible(sq, sk, i, j);
                }
            }
        }
        out
    }

    /// What `PreparedMask::estimated_speedup` documents for this mask prepared for `sq`, `sk`:
    /// 64x64 tiles of every plane over those with a score the data parts keep and one the band
    /// shows (the kernels visit those).
    pub fn estimated_speedup(&self, sq: usize, sk: usize) -> f64 {
        let (qb, kb) = (sq.div_ceil(64), sk.div_ceil(64));
        let [pb, ph] = self.planes();
        let band = self.band_model(false);
        let mut band_any = vec![false; qb * kb];
        for i in 0..sq {
            for j in 0..sk {
                band_any[(i / 64) * kb + j / 64] |= band.visible(sq, sk, i, j);
            }
        }
        let data = self.data_table(sq, sk);
        let mut visited = 0usize;
        for p in 0..pb * ph {
            let mut any = vec![false; qb * kb];
            for i in 0..sq {
                for j in 0..sk {
                    any[(i / 64) * kb + j / 64] |= data[(p * sq + i) * sk + j];
                }
            }
            visited += any.iter().zip(&band_any).filter(|(a, b)| **a && **b).count();
        }
        (pb * ph * qb * kb) as f64 / visited.max(1) as f64
    }

    /// [`MaskSpec::estimated_speedup`] of the mask run as gather attention (the GPU's form of a
    /// query-broadcast score mask keeping at most half the keys): the band's tiles, each holding
    /// the longest plane's kept keys (rounded up to 64) as a share of all keys.
    pub fn gathered_speedup(&self, sq: usize, sk: usize) -> f64 {
        let (qb, kb) = (sq.div_ceil(64), sk.div_ceil(64));
        let band = self.band_model(false);
        let mut band_any = vec![false; qb * kb];
        for i in 0..sq {
            for j in 0..sk {
                band_any[(i / 64) * kb + j / 64] |= band.visible(sq, sk, i, j);
            }
        }
        let [pb, ph] = self.planes();
        let data = self.data_table(sq, sk);
        let longest = (0..pb * ph).map(|p| (0..sk).filter(|&j| data[p * sq * sk + j]).count()).max().unwrap_or(0);
        let visited = band_any.iter().filter(|&&b| b).count() as f64 * longest.next_multiple_of(64) as f64 / (kb * 64) as f64;
        (qb * kb) as f64 / visited.max(1.0)
    }

    /// `case` and `inputs` with the equivalent dense mask (built here) in place of this sparse
    /// mask and `case.causal` (folded into the dense mask): the call the sparse one must equal.
    pub fn dense_call(&self, case: &Case, inputs: &Inputs) -> (Case, Inputs) {
        let shape = [case.batch, case.heads, case.seqlen_q, case.seqlen_k];
        let mask = Tensor::from_vec(self.visible(case, case.causal), &shape, &Device::Cpu).unwrap();
        let case = Case { mask: Some(shape), causal: false, ..case.clone() };
        let inputs = Inputs { q: inputs.q.clone(), k: inputs.k.clone(), v: inputs.v.clone(), mask: Some(mask), bias: inputs.bias.clone() };
        (case, inputs)
    }
}

/// What a random mask part is made of; the values come from a seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A random parametric constructor (all, causal, window, causal window), perhaps with sinks.
    Band,
    /// `compress_causal(cf)`, perhaps with a left window (around the compressed diagonal) and
    /// sinks.
    Compress(usize),
    Dense,
    Packed,
    Bitset(usize),
    DenseBlocks(usize),
    Bcsr(usize),
    /// A key-side (query-broadcast) dense mask, `[{1|b}, {1|hk|h}, 1, sk]`: what gather
    /// attention compacts (see [`random_key_keep`]).
    KeySide,
    /// The same as bit-packed bytes.
    KeySidePacked,
}

/// A window side: unbounded, 0, 1, small, anywhere up to `sq + sk`, near `sk`, near and beyond
/// `sq + sk` (where a side stops binding), or `usize::MAX`.
pub fn random_side(rng: &mut StdRng, sq: usize, sk: usize) -> Option<usize> {
    match rng.random_range(0..12) {
        0..=2 => None,
        3 => Some(0),
        4 => Some(1),
        5 | 6 => Some(rng.random_range(0..16)),
        7 | 8 => Some(rng.random_range(0..=sq + sk)),
        9 => Some((sk + rng.random_range(0..3)).saturating_sub(1)),
        10 => Some(sq + sk + rng.random_range(0..3) - 1),
        _ => Some(if rng.random_bool(0.5) { sq + sk + 100 } else { usize::MAX }),
    }
}

/// A sink count: none (often), a few, up to `sk`, or beyond it.
pub fn random_sinks(rng: &mut StdRng, sk: usize) -> usize {
    match rng.random_range(0..8) {
        0..=3 => 0,
        4 => rng.random_range(1..=4),
        5 | 6 => rng.random_range(0..=sk),
        _ => sk + rng.random_range(0..70),
    }
}

/// Values of a bool tensor of `shape` (`[.., .., rows, cols]`): each true with a probability
/// from `densities`, through one of three patterns: independent scores, 64x64 cells entirely on
/// or off (the on ones dense or with holes: empty, full and partial tiles), or random with every
/// third row false.
pub fn random_keep(rng: &mut StdRng, shape: [usize; 4], densities: &[f64]) -> Vec<bool> {
    let n: usize = shape.iter().product();
    let p = densities[rng.random_range(0..densities.len())];
    let (rows, cols) = (shape[2], shape[3]);
    match rng.random_range(0..3) {
        0 => (0..n).map(|_| rng.random_bool(p)).collect(),
        1 => {
            let (rb, cb) = (rows.div_ceil(64), cols.div_ceil(64));
            let planes = shape[0] * shape[1];
            let cells: Vec<(bool, f64)> = (0..planes * rb * cb).map(|_| (rng.random_bool(p), [1.0, 1.0, 0.9, 0.3][rng.random_range(0..4)])).collect();
            (0..n)
                .map(|x| {
                    let (j, i, pl) = (x % cols, (x / cols) % rows, x / (cols * rows));
                    let (on, inner) = cells[(pl * rb + i / 64) * cb + j / 64];
                    on && rng.random_bool(inner)
                })
                .collect()
        }
        _ => (0..n).map(|x| (x / cols) % rows % 3 != 0 && rng.random_bool(p)).collect(),
    }
}

/// Per plane of a key-side mask `[pb, ph, 1, sk]`, kept keys from one to all of them, or none:
/// one random key, the first or the last key, random keys at a density from 0.5 % to 80 %, a
/// contiguous run of up to half the keys, or every key.
pub fn random_key_keep(rng: &mut StdRng, shape: [usize; 4]) -> Vec<bool> {
    let sk = shape[3];
    let mut keep = Vec::with_capacity(shape.iter().product());
    for _ in 0..shape[0] * shape[1] {
        let row: Vec<bool> = match rng.random_range(0..12) {
            // Denser than the gathered backward takes (it runs on dense tiles; the forward
            // gathers at any density).
            10 => (0..sk).map(|_| rng.random_bool(0.8)).collect(),
            11 => vec![true; sk],
            0 => {
                let j = [0, sk - 1, rng.random_range(0..sk)][rng.random_range(0..3)];
                (0..sk).map(|x| x == j).collect()
            }
            1 => vec![rng.random_bool(0.2); sk],
            2 | 3 => {
                let (a, len) = (rng.random_range(0..sk), rng.random_range(1..=sk.div_ceil(2)));
                (0..sk).map(|x| x >= a && x < a + len).collect()
            }
            _ => {
                let p = [0.005, 0.02, 0.1, 0.3, 0.5][rng.random_range(0..5)];
                (0..sk).map(|_| rng.random_bool(p)).collect()
            }
        };
        keep.extend(row);
    }
    keep
}

/// Bool rows `[.., sk]` as little-endian bit bytes `[.., ceil(sk / 8)]`, some of the ignored bits
/// past `sk` set.
fn pack_rows(rng: &mut StdRng, keep: &[bool], rows: usize, sk: usize) -> Vec<u8> {
    let nbytes = sk.div_ceil(8);
    let mut bytes = vec![0u8; rows * nbytes];
    for (x, &k) in keep.iter().enumerate() {
        let (j, r) = (x % sk, x / sk);
        bytes[r * nbytes + j / 8] |= (k as u8) << (j % 8);
    }
    if sk % 8 != 0 {
        for r in 0..rows {
            bytes[r * nbytes + nbytes - 1] |= rng.random::<u8>() & (0xFFu8 << (sk % 8));
        }
    }
    bytes
}

/// A random part of `kind` for `case`'s sizes, its plane dims each the given one or 1.
pub fn random_part(rng: &mut StdRng, case: &Case, kind: Kind, planes: [usize; 2]) -> MaskSpec {
    let (sq, sk) = (case.seqlen_q, case.seqlen_k);
    let pb = if rng.random_bool(0.5) { planes[0] } else { 1 };
    let ph = if rng.random_bool(0.7) { planes[1] } else { 1 };
    let rows = |rng: &mut StdRng| if rng.random_bool(0.8) { sq } else { 1 };
    let cols = |rng: &mut StdRng| if rng.random_bool(0.85) { sk } else { 1 };
    match kind {
        Kind::Band => {
            let ctor = match rng.random_range(0..6) {
                0 => BandCtor::All,
                1 => BandCtor::Causal,
                2 => BandCtor::CausalWindow(random_side(rng, sq, sk).unwrap_or(sq + sk)),
                _ => BandCtor::Window(random_side(rng, sq, sk), random_side(rng, sq, sk)),
            };
            MaskSpec::band(ctor, random_sinks(rng, sk))
        }
        Kind::Compress(cf) => {
            let mut spec = MaskSpec::band(BandCtor::CompressCausal(cf), if rng.random_bool(0.3) { random_sinks(rng, sk) } else { 0 });
            if rng.random_bool(0.5) {
                let left = rng.random_range(0..=sk + 2);
                spec.bands.push((BandCtor::Window(Some(left), random_side(rng, sq, sk)), random_sinks(rng, sk)));
            }
            spec
        }
        Kind::Dense => {
            let shape = [pb, ph, rows(rng), cols(rng)];
            MaskSpec::data(DataPart::Dense { shape, keep: random_keep(rng, shape, &[0.0, 0.05, 0.3, 0.7, 0.97, 1.0, 1.0]) })
        }
        Kind::Packed => {
            let shape = [pb, ph, rows(rng), sk];
            let keep = random_keep(rng, shape, &[0.0, 0.05, 0.3, 0.7, 0.97, 1.0, 1.0]);
            let bytes = pack_rows(rng, &keep, pb * ph * shape[2], sk);
            MaskSpec::data(DataPart::Packed { shape: [pb, ph, shape[2], sk.div_ceil(8)], bytes })
        }
        Kind::KeySide => {
            let shape = [pb, ph, 1, sk];
            MaskSpec::data(DataPart::Dense { shape, keep: random_key_keep(rng, shape) })
        }
        Kind::KeySidePacked => {
            let shape = [pb, ph, 1, sk];
            let keep = random_key_keep(rng, shape);
            let bytes = pack_rows(rng, &keep, pb * ph, sk);
            MaskSpec::data(DataPart::Packed { shape: [pb, ph, 1, sk.div_ceil(8)], bytes })
        }
        Kind::Bitset(block) => {
            let shape = [pb, ph, sq.div_ceil(block), sk.div_ceil(block)];
            let p = [0.0, 0.2, 0.5, 0.8, 1.0][rng.random_range(0..5)];
            let kept = (0..shape.iter().product()).map(|_| rng.random_bool(p)).collect();
            MaskSpec::data(DataPart::Bitset { shape, kept, block })
        }
        Kind::DenseBlocks(block) => {
            let shape = [pb, ph, rows(rng), cols(rng)];
            // Sparse scores, so that some blocks have none.
            let keep = random_keep(rng, shape, &[0.0, 0.0003, 0.002, 0.01, 0.1, 0.5]);
            MaskSpec::data(DataPart::DenseBlocks { shape, keep, block })
        }
        Kind::Bcsr(block) => MaskSpec::data(random_bcsr(rng, [pb, ph], block, sq, sk)),
    }
}

/// Random BCSR: per plane, rows empty or with up to `kb + 2` random block indices in any order,
/// repeats allowed; planes with fewer entries than `nnz` leave the tail unreferenced (filled
/// with valid indices, which must not count).
pub fn random_bcsr(rng: &mut StdRng, planes: [usize; 2], block: usize, sq: usize, sk: usize) -> DataPart {
    let (qb, kb) = (sq.div_ceil(block), sk.div_ceil(block));
    let empty = [0.0, 0.25, 0.6, 1.0][rng.random_range(0..4)];
    let rows: Vec<Vec<Vec<i32>>> = (0..planes[0] * planes[1])
        .map(|_| {
            (0..qb)
                .map(|_| {
                    if rng.random_bool(empty) {
                        Vec::new()
                    } else {
                        let n = rng.random_range(1..=kb + 2);
                        (0..n).map(|_| rng.random_range(0..kb) as i32).collect()
                    }
                })
                .collect()
        })
        .collect();
    let most = rows.iter().map(|p| p.iter().map(Vec::len).sum::<usize>()).max().unwrap_or(0);
    let nnz = most + rng.random_range(usize::from(most == 0)..3);
    let (mut row_ptr, mut col_idx) = (Vec::new(), Vec::new());
    for plane in &rows {
        let start = col_idx.len();
        row_ptr.push(0);
        for row in plane {
            col_idx.extend_from_slice(row);
            row_ptr.push((col_idx.len() - start) as i32);
        }
        while col_idx.len() - start < nnz {
            col_idx.push(rng.random_range(0..kb) as i32);
        }
    }
    DataPart::Bcsr { planes, block, row_ptr, col_idx, nnz }
}

/// A random mask of `kinds` for `case`: one choice of plane dims (`{1|b}`, `{1|hk|h}`) that
/// every data part takes or broadcasts.
pub fn random_spec(rng: &mut StdRng, case: &Case, kinds: &[Kind]) -> MaskSpec {
    let pb = if rng.random_bool(0.5) { case.batch } else { 1 };
    let ph = [1, case.kv_heads, case.heads][rng.random_range(0..3)];
    kinds.iter().fold(MaskSpec::default(), |spec, &kind| spec.and(random_part(rng, case, kind, [pb, ph])))
}

/// A random GPU case with a sparse mask: the call's sizes and options (`case`, without a dense
/// mask), the kinds of its mask parts, and the seed of its input values and mask.
#[derive(Clone, Debug)]
pub struct SparseCase {
    pub case: Case,
    pub kinds: Vec<Kind>,
    pub seed: u64,
}

impl SparseCase {
    /// The inputs (on the CPU) and the mask, drawn from the seed.
    pub fn draw(&self) -> (Inputs, MaskSpec) {
        let mut rng = seeded_rng(self.seed);
        let inputs = self.case.inputs(&mut rng);
        let spec = random_spec(&mut rng, &self.case, &self.kinds);
        (inputs, spec)
    }
}

/// Lengths up to `max`, odd ones and tile edges favoured.
fn seqlen(max: usize) -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1usize..=max, 1 => prop::sample::select(vec![1, 63, 64, 65, 127, 128, 129, 192, 257.min(max)])]
}

/// The kinds of a GPU mask: at most one parametric part (a band or compressed causal), at most
/// one score mask (the GPU takes one: dense or packed), up to two block masks.
fn gpu_kinds() -> impl Strategy<Value = Vec<Kind>> {
    let block = || prop::sample::select(vec![64usize, 128]);
    let band = prop_oneof![
        1 => Just(None),
        3 => Just(Some(Kind::Band)),
        2 => prop::sample::select(vec![1usize, 2, 4, 64]).prop_map(|cf| Some(Kind::Compress(cf))),
    ];
    let score = prop_oneof![2 => Just(None), 1 => Just(Some(Kind::Dense)), 1 => Just(Some(Kind::Packed))];
    let blocks = prop::collection::vec(prop_oneof![block().prop_map(Kind::Bitset), block().prop_map(Kind::DenseBlocks), block().prop_map(Kind::Bcsr)], 0..=2);
    (band, score, prop::option::weighted(0.6, blocks))
        .prop_map(|(band, score, blocks)| band.into_iter().chain(score).chain(blocks.unwrap_or_default()).collect())
}

/// Random GPU cases with sparse masks: 16-bit dtype, head dim (small ones favoured), batch, GQA
/// group, odd lengths up to `max_seqlen` (with compressed causal, often `sk ~ sq / cf`), causal
/// (not with compressed causal), softcap, scale, a bias of any broadcast shape, and the mask's
/// kinds.
pub fn gpu_sparse_cases(max_seqlen: usize) -> impl Strategy<Value = SparseCase> {
    sparse_cases_of(max_seqlen, gpu_kinds())
}

/// The kinds of a parametric mask alone: none, a band, or compressed causal (cf 1, 2, 4 or 64).
fn band_kinds() -> impl Strategy<Value = Vec<Kind>> {
    prop_oneof![
        1 => Just(Vec::new()),
        3 => Just(vec![Kind::Band]),
        2 => prop::sample::select(vec![1usize, 2, 4, 64]).prop_map(|cf| vec![Kind::Compress(cf)]),
    ]
}

/// [`gpu_sparse_cases`] whose mask is parametric alone ([`band_kinds`]), without bias or softcap:
/// the lean forward's cases.
pub fn gpu_band_cases(max_seqlen: usize) -> impl Strategy<Value = SparseCase> {
    sparse_cases_of(max_seqlen, band_kinds()).prop_map(|sc| SparseCase { case: Case { bias: None, softcap: 0.0, ..sc.case }, ..sc })
}

/// The kinds of a gather-attention mask: a key-side mask (dense or packed), perhaps with a band or
/// compressed causal applied on the original key positions.
fn gather_kinds() -> impl Strategy<Value = Vec<Kind>> {
    let band = prop_oneof![
        2 => Just(None),
        3 => Just(Some(Kind::Band)),
        1 => prop::sample::select(vec![1usize, 2, 4]).prop_map(|cf| Some(Kind::Compress(cf))),
    ];
    let keys = prop_oneof![3 => Just(Kind::KeySide), 1 => Just(Kind::KeySidePacked)];
    (band, keys).prop_map(|(band, keys)| band.into_iter().chain([keys]).collect())
}

/// [`gpu_sparse_cases`] whose mask is a key-side one ([`gather_kinds`]): gather attention's cases.
pub fn gpu_gather_cases(max_seqlen: usize) -> impl Strategy<Value = SparseCase> {
    sparse_cases_of(max_seqlen, gather_kinds())
}

fn sparse_cases_of(max_seqlen: usize, kinds: impl Strategy<Value = Vec<Kind>>) -> impl Strategy<Value = SparseCase> {
    let dims = prop::sample::select(vec![32usize, 32, 32, 64, 64, 64, 96, 128, 128, 192, 256]);
    (
        (prop::sample::select(vec![DType::BF16, DType::F16]), dims),
        (1usize..=2, 1usize..=2, prop::sample::select(vec![1usize, 2, 3])),
        (seqlen(max_seqlen), seqlen(max_seqlen), any::<bool>(), -1i64..=1),
        (any::<bool>(), prop_oneof![3 => Just(0.0), 1 => Just(20.0)], prop::option::weighted(0.2, 0.05f64..0.5)),
        (kinds, any::<bool>(), any::<u64>()),
    )
        .prop_flat_map(move |((dtype, d), (b, hk, group), (sq, sk, compressed_len, delta), (causal, softcap, scale), (kinds, has_bias, seed))| {
            let h = hk * group;
            let cf = kinds.iter().find_map(|k| if let Kind::Compress(cf) = k { Some(*cf) } else { None });
            // Keys standing for cf positions each: about sq / cf of them.
            let sk = match cf {
                Some(cf) if compressed_len => (sq.div_ceil(cf) as i64 + delta).max(1) as usize,
                _ => sk,
            };
            let causal = causal && cf.is_none();
            let bias = if has_bias { crate::broadcast_shape(b, h, hk, sq, sk).prop_map(Some).boxed() } else { Just(None).boxed() };
            bias.prop_map(move |bias| SparseCase {
                case: Case { bias, causal, softcap, scale, dtype, ..Case::new(b, sq, sk, h, hk, d) },
                kinds: kinds.clone(),
                seed,
            })
        })
}

/// Checks `sc` on `gpu` against the CPU reference run with the equivalent dense mask (built
/// here) on the same values: the mask's tensors on the GPU, prepared there, the forward through
/// `path` (O and LSE, -inf rows included, as [`compare_forward`]) and, with `backward`, the
/// gradients (as [`compare_gradients`]), the backward `deterministic` or not.
pub fn check_gpu_sparse(sc: &SparseCase, gpu: &Device, path: ForwardPath, backward: bool, deterministic: bool) -> Result<(), TestCaseError> {
    let (inputs, spec) = sc.draw();
    let prepared = spec.prepare(gpu, sc.case.seqlen_q, sc.case.seqlen_k).map_err(|e| TestCaseError::fail(format!("prepare: {e} for {sc:?} {spec:?}")))?;
    check_gpu_prepared(sc, &spec, &prepared, &inputs, gpu, path, backward, deterministic)
}

/// [`check_gpu_sparse`] with the mask already prepared (on the GPU, or a parametric one anywhere)
/// and the inputs given.
#[allow(clippy::too_many_arguments)]
pub fn check_gpu_prepared(
    sc: &SparseCase,
    spec: &MaskSpec,
    prepared: &PreparedMask,
    inputs: &Inputs,
    gpu: &Device,
    path: ForwardPath,
    backward: bool,
    deterministic: bool,
) -> Result<(), TestCaseError> {
    dmattn::set_output_poisoning(true);
    let what = Described(sc, spec);
    let case = &sc.case;
    let (ref_case, ref_inputs) = spec.dense_call(case, inputs);
    let want = ref_case.forward(&ref_inputs).map_err(|e| TestCaseError::fail(format!("reference: {e} for {what:?}")))?;
    let on_gpu = inputs.to(gpu);
    let call = case.call(&on_gpu).sparse_mask(prepared).deterministic(deterministic);
    let got = path.run(call).map_err(|e| TestCaseError::fail(format!("gpu ({path:?}): {e} for {what:?}")))?;
    let (spec_n, data_n) = (naive::Spec::of(&ref_case), naive::Data::of(&ref_inputs));
    let needs_naive = backward || path != ForwardPath::Fused;
    let nf = needs_naive.then(|| naive::forward(&spec_n, &data_n));
    let extra = nf.as_ref().map_or(0.0, |nf| path.logit_error(case.dtype, nf));
    compare_forward(&what, path, case.dtype, &got, &want, extra)?;
    if backward {
        let dout = gpu_dout(case, sc.seed ^ 0x5EED);
        let g = got.backward(&dout.to_device(gpu).unwrap()).map_err(|e| TestCaseError::fail(format!("gpu backward: {e} for {what:?}")))?;
        let w = want.backward(&dout).map_err(|e| TestCaseError::fail(format!("reference backward: {e} for {what:?}")))?;
        let nf = nf.expect("computed for the backward");
        let mags = crate::gradient_sizes(&spec_n, &data_n, &nf, &dout);
        let tol = crate::gpu_tolerance(case.dtype) + 2.0 * path.logit_error(case.dtype, &nf);
        compare_gradients(&what, &grads_vec(&g), &grads_vec(&w), &mags, tol)?;
    }
    Ok(())
}

/// A case and its mask, for failure messages.
struct Described<'a>(&'a SparseCase, &'a MaskSpec);

impl fmt::Debug for Described<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{:?} with mask {:?}", self.0, self.1)
    }
}

/// Per-query index lists `[pb, ph, seqlen_q, w]` for `case` that are a window about the
/// diagonal (sides from 0 to past the lengths): each row's keys in a random order, some repeated,
/// -1 padding after them; half the time one change away from a window (a key dropped from a row,
/// a random key added to one, a row emptied, or one plane's window moved a key to the right).
/// With the keep table `[pb, ph, seqlen_q, seqlen_k]` they describe.
pub fn window_lists(rng: &mut StdRng, case: &Case) -> ([usize; 4], Vec<i32>, Vec<bool>) {
    let (sq, sk) = (case.seqlen_q, case.seqlen_k);
    let pb = if rng.random_bool(0.5) { case.batch } else { 1 };
    let ph = [1, case.kv_heads, case.heads][rng.random_range(0..3)];
    let mut side = || match rng.random_range(0..5) {
        0 => 0,
        1 => rng.random_range(0..8),
        2 => rng.random_range(0..=sk),
        3 => sq + sk + 5,
        _ => rng.random_range(0..64),
    };
    let (left, right) = (side() as i64, side() as i64);
    let planes = pb * ph;
    let (change, target_plane, target_row) = (rng.random_range(0..8), rng.random_range(0..planes), rng.random_range(0..sq));
    let mut rows: Vec<Vec<i64>> = Vec::with_capacity(planes * sq);
    for plane in 0..planes {
        for i in 0..sq {
            let shift = (change == 3 && plane == target_plane) as i64;
            let diag = (i + sk) as i64 - sq as i64 + shift;
            let mut keys: Vec<i64> = ((diag - left).max(0)..=(diag + right).min(sk as i64 - 1)).collect();
            if (plane, i) == (target_plane, target_row) {
                match change {
                    0 if !keys.is_empty() => {
                        keys.remove(rng.random_range(0..keys.len()));
                    }
                    1 => keys.push(rng.random_range(0..sk) as i64),
                    2 => keys.clear(),
                    _ => {}
                }
            }
            rows.push(keys);
        }
    }
    let w = rows.iter().map(Vec::len).max().unwrap_or(0) + rng.random_range(1..4);
    let mut idx = Vec::with_capacity(planes * sq * w);
    let mut keep = vec![false; planes * sq * sk];
    for (n, keys) in rows.iter_mut().enumerate() {
        for &k in keys.iter() {
            keep[n * sk + k as usize] = true;
        }
        // A random order: Fisher-Yates.
        for a in (1..keys.len()).rev() {
            keys.swap(a, rng.random_range(0..=a));
        }
        let fill: Vec<i32> = (keys.len()..w).map(|_| if !keys.is_empty() && rng.random_bool(0.5) { keys[rng.random_range(0..keys.len())] as i32 } else { -1 }).collect();
        idx.extend(keys.iter().map(|&k| k as i32).chain(fill));
    }
    ([pb, ph, sq, w], idx, keep)
}

/// The window `[left, right]` a keep table `[planes, sq, sk]` is, by brute force, if it is one:
/// the least sides that show every row its keys, then every score compared with what they show
/// (key `j` to row `i` iff `i + sk - sq - left <= j <= i + sk - sq + right`). A table with no
/// key is none.
pub fn window_of(keep: &[bool], planes: usize, sq: usize, sk: usize) -> Option<[usize; 2]> {
    let diag = |i: usize| i as i64 + sk as i64 - sq as i64;
    let rows = || keep.chunks(sk).enumerate().take(planes * sq).map(|(n, row)| (n % sq, row));
    let (mut left, mut right, mut any) = (0, 0, false);
    for (i, row) in rows() {
        if let (Some(first), Some(last)) = (row.iter().position(|&k| k), row.iter().rposition(|&k| k)) {
            (left, right, any) = (left.max(diag(i) - first as i64), right.max(last as i64 - diag(i)), true);
        }
    }
    let shows = |i: usize, j: usize| diag(i) - left <= j as i64 && j as i64 <= diag(i) + right;
    (any && rows().all(|(i, row)| (0..sk).all(|j| row[j] == shows(i, j)))).then_some([left as usize, right as usize])
}

/// Random index lists (`attn_indices`) for `case`: I32 `[pb, ph, rows, w]` with `rows` 1 or
/// `seqlen_q`, `w` from 1 to past `seqlen_k` (so repeats occur), entries random keys, keys of a
/// window around each row's diagonal, or all padding, with -1 padding mixed in; and the keep table
/// `[pb, ph, rows, seqlen_k]` they describe (a listed key is visible, repeats or not).
pub fn random_indices(rng: &mut StdRng, case: &Case) -> ([usize; 4], Vec<i32>, Vec<bool>) {
    let per_query = rng.random_bool(0.5);
    random_indices_of(rng, case, per_query)
}

/// [`random_indices`] with a query dimension (`rows` = `seqlen_q`) or without (1).
pub fn random_indices_of(rng: &mut StdRng, case: &Case, per_query: bool) -> ([usize; 4], Vec<i32>, Vec<bool>) {
    let (sq, sk) = (case.seqlen_q, case.seqlen_k);
    let pb = if rng.random_bool(0.5) { case.batch } else { 1 };
    let ph = [1, case.kv_heads, case.heads][rng.random_range(0..3)];
    let rows = if per_query { sq } else { 1 };
    let w = [1, 2, rng.random_range(1..=sk), sk.div_ceil(3), sk + 3][rng.random_range(0..5)];
    let pad = [0.0, 0.1, 0.5][rng.random_range(0..3)];
    let mode = rng.random_range(0..4);
    let shape = [pb, ph, rows, w];
    let mut idx = Vec::with_capacity(shape.iter().product());
    let mut keep = vec![false; pb * ph * rows * sk];
    for row in 0..pb * ph * rows {
        let i = row % rows;
        for e in 0..w {
            let key = if mode == 3 || rng.random_bool(pad) {
                -1
            } else if mode == 2 {
                // A window of w keys ending at the row's diagonal (clamped into the keys).
                let diag = (i + sk).saturating_sub(sq).min(sk - 1) as i64;
                (diag - e as i64).rem_euclid(sk as i64) as i32
            } else {
                rng.random_range(0..sk) as i32
            };
            if key >= 0 {
                keep[row * sk + key as usize] = true;
            }
            idx.push(key);
        }
    }
    (shape, idx, keep)
}
