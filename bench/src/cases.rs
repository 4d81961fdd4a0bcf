//! The benchmark grid: Flash-DMA's README grid and LLM shapes, as `cases.json` describes them.
use crate::results::Pass;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Which scores a case hides (see SCHEMA.md for how each is drawn). `topk`, `blocks` and
/// `compress_dense` are given to dmattn as dense bool masks; `key_topk` as a query-broadcast bool
/// mask and `key_fraction` as a packed batch's key-side one, each through `.mask(..)` and
/// prepared by every timed call; the others are [`dmattn::SparseMask`] forms, prepared once per
/// case outside the timed region.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mask {
    /// Each query row keeps the `keep` keys of largest bias (Flash-DMA's dynamic top-k mask).
    Topk { keep: usize },
    /// Independent random `block`×`block` tiles, each visible with probability `density`
    /// ([`block_pattern`]), as a dense bool mask.
    Blocks { block: usize, density: f64 },
    /// A left window: key `j` is visible to query `i` iff `j >= i + sk - sq - left` (with the
    /// case's causal, `SparseMask::causal_window(left)`; without, `window(Some(left), None)`).
    Window { left: usize },
    /// Compressed causal, `SparseMask::compress_causal(cf)`: key `j` visible to query `i` iff
    /// `j * cf <= i` (no `sk - sq` offset). The case's `causal` is false (the rule replaces it)
    /// and `seqlen_k = seqlen_q / cf`.
    Compress { cf: usize },
    /// The `compress` pattern as a dense bool mask `[batch, mask_heads, sq, sk]`, given to dmattn
    /// as `SparseMask::dense` (prepared once, as the other sparse forms): the baseline the
    /// parametric form is compared with.
    CompressDense { cf: usize },
    /// The `blocks` pattern (the same draw) as BCSR, `SparseMask::bcsr` (I32 row pointers and
    /// block indices).
    Bcsr { block: usize, density: f64 },
    /// The `blocks` pattern (the same draw) as a block bitset, `SparseMask::block_bitset`.
    Bitset { block: usize, density: f64 },
    /// Flash-DMA's key-side top-k: a bias `[batch, mask_heads, 1, seqlen_k]` and a mask of the
    /// same shape keeping, per (batch, mask head) plane, the `keep` keys of largest bias, the same
    /// for every query ([`key_scores`], [`top_keys`]). Given to dmattn unprepared (`.mask(..)`):
    /// the timed forward prepares it, which for a query-broadcast mask keeping at most half the
    /// keys compacts the kept keys and runs attention over them alone ("gather attention").
    KeyTopk { keep: usize },
    /// `key_topk` in proportion to each sequence's length, for packed batches (the `varlen`
    /// group) only: a bias `[total_k, mask_heads]`, N(0, 1) per packed key and mask head, and a
    /// bool mask of the same shape keeping, per (sequence, mask head), the `ceil(len_k * percent
    /// / 100)` keys of largest bias ([`key_fraction_scores`], [`top_fraction_keys`]), the same for
    /// every query of the sequence. Given to dmattn unprepared, `.mask(..)` and `.bias(..)` with
    /// `.seqlens(..)` (and `.kv_pages(..)`: mask and bias stay in the packed key order).
    KeyFraction { percent: usize },
    /// Per-query index lists (`attn_indices`): each row lists `keep` keys among those the case's
    /// causal lets it see ([`index_lists`]): `random` ones (a repeat means the key once) or the
    /// `window` of the last `keep` (listed descending), -1 past a row's visible keys. Given to
    /// dmattn as `SparseMask::indices`, or with `dense` as the same pattern in a dense bool mask
    /// (`SparseMask::dense`): the dense-mask path the lists are compared with. Both prepared once.
    IndexLists { keep: usize, layout: ListLayout, dense: bool },
    /// Not attention: the `select` group times the key selection alone
    /// (`dmattn::select_keys(&bias).top_k(keep)`, Flash-DMA's `create_mask`) on a bf16 N(0, 1)
    /// bias `[batch, mask_heads, 1 or seqlen_q, seqlen_k]` ([`SelectRows`]), with `within_causal`
    /// inside a causal bool mask `[1, 1, seqlen_q, seqlen_k]` (key `j` eligible for query `i` iff
    /// `j <= i + seqlen_k - seqlen_q`; a key-side bias then gives a row per query), into the
    /// `output` form. Such cases have `head_dim` 0, `heads = kv_heads = mask_heads`, `bias`
    /// true and `causal` and `backward` false; their rows are `[batch, mask_heads, seqlen_q]`.
    Select { keep: usize, rows: SelectRows, within_causal: bool, output: SelectOutput },
}

/// How an `index_lists` case's lists are drawn ([`index_lists`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ListLayout {
    Random,
    Window,
}

/// The bias rows of a `select` case.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SelectRows {
    /// A bias row per query: `[batch, mask_heads, seqlen_q, seqlen_k]`.
    PerQuery,
    /// One bias row for every query (Flash-DMA's key-side bias): `[batch, mask_heads, 1,
    /// seqlen_k]`; the output has `seqlen_q` rows (one unless a per-query mask widens it).
    KeySide,
}

/// What a `select` case makes: dmattn's `.indices()` (I32 `[.., keep]`, the kept keys ascending
/// then -1; the peer `torch.topk`'s values and indices) or `.mask()` (Bool `[.., seqlen_k]`; the
/// peer Flash-DMA's create_mask in torch: top-k, then a scatter into a bool tensor).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SelectOutput {
    Indices,
    Mask,
}

impl Mask {
    /// Whether dmattn gets this mask as a prepared `SparseMask` (the rest go in as `.mask(..)`,
    /// and `select` is no attention).
    pub fn is_sparse(&self) -> bool {
        !matches!(self, Mask::Topk { .. } | Mask::Blocks { .. } | Mask::KeyTopk { .. } | Mask::KeyFraction { .. } | Mask::Select { .. })
    }
}

/// splitmix64: the mixing step of [`block_pattern`], the same in `peers.py`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The kept blocks of a random block mask, `[batch, mask_heads, ceil(sq / block),
/// ceil(sk / block)]` row-major: block `n` is kept iff `(splitmix64(seed + n) >> 11) * 2^-53 <
/// density`, where `seed` folds batch, mask_heads, seqlen_q, seqlen_k, block and the bits of
/// `density` through splitmix64. `peers.py` draws the same blocks, and every kind of the same
/// shape (`blocks`, `bcsr`, `bitset`) the same pattern.
pub fn block_pattern(c: &Case, block: usize, density: f64) -> Vec<bool> {
    let (nq, nk) = (c.seqlen_q.div_ceil(block), c.seqlen_k.div_ceil(block));
    let words = [c.batch as u64, c.mask_heads as u64, c.seqlen_q as u64, c.seqlen_k as u64, block as u64, density.to_bits()];
    let seed = words.iter().fold(0u64, |s, &w| splitmix64(s ^ w));
    let unit = 1.0 / (1u64 << 53) as f64;
    (0..(c.batch * c.mask_heads * nq * nk) as u64).map(|n| ((splitmix64(seed.wrapping_add(n)) >> 11) as f64 * unit) < density).collect()
}

/// Folded into the seed of [`key_scores`] first (ASCII "key_topk"), so that its draw is not a
/// block draw's.
const KEY_TOPK_TAG: u64 = 0x6B65_795F_746F_706B;

/// The key-side scores of a `key_topk` case, `[batch, mask_heads, seqlen_k]` row-major, uniform
/// in (0, 1): `u_n = (2 * (splitmix64(seed + n) >> 12) + 1) * 2^-53` (exact in f64, never 0 or
/// 1), `seed` folding the tag "key_topk", batch, mask_heads, seqlen_k and `keep` through
/// splitmix64 as [`block_pattern`] does. The bias is `Φ⁻¹(u)` ([`normal_quantile`]), N(0, 1),
/// and ranks as `u` does, so the top-`keep` keys of the bias are those of `u` ([`top_keys`]),
/// exactly: `peers.py` draws the same scores, so both sides keep the same keys.
pub fn key_scores(c: &Case, keep: usize) -> Vec<f64> {
    unit_scores(&[KEY_TOPK_TAG, c.batch as u64, c.mask_heads as u64, c.seqlen_k as u64, keep as u64], c.batch * c.mask_heads * c.seqlen_k)
}

/// `n` scores uniform in (0, 1), `u_n = (2 * (splitmix64(seed + n) >> 12) + 1) * 2^-53`, `seed`
/// folding `words` through splitmix64 as [`block_pattern`] does.
fn unit_scores(words: &[u64], n: usize) -> Vec<f64> {
    let seed = words.iter().fold(0u64, |s, &w| splitmix64(s ^ w));
    let unit = 1.0 / (1u64 << 53) as f64;
    (0..n as u64).into_par_iter().map(|n| ((splitmix64(seed.wrapping_add(n)) >> 12) * 2 + 1) as f64 * unit).collect()
}

/// The `keep` keys of largest score in each plane of `scores` (`seqlen_k` a plane; ties to the
/// lower key), as ascending key lists, one per plane.
pub fn top_keys(scores: &[f64], seqlen_k: usize, keep: usize) -> Vec<Vec<u32>> {
    scores.chunks(seqlen_k.max(1)).map(|s| top_of(s, keep)).collect()
}

/// The `keep` keys of largest score of one plane (ties to the lower key), ascending.
fn top_of(s: &[f64], keep: usize) -> Vec<u32> {
    let keep = keep.min(s.len());
    let mut idx: Vec<u32> = (0..s.len() as u32).collect();
    if keep < s.len() {
        idx.select_nth_unstable_by(keep, |&a, &b| s[b as usize].total_cmp(&s[a as usize]).then(a.cmp(&b)));
    }
    idx.truncate(keep);
    idx.sort_unstable();
    idx
}

/// Folded into the seed of [`key_fraction_scores`] first (ASCII "key_frac").
const KEY_FRACTION_TAG: u64 = 0x6B65_795F_6672_6163;

/// How many of a sequence's `len_k` keys a `key_fraction` mask keeps in each plane:
/// `ceil(len_k * percent / 100)`, at most `len_k`.
pub fn fraction_kept(len_k: usize, percent: usize) -> usize {
    (len_k * percent).div_ceil(100).min(len_k)
}

/// The key-side scores of a packed `key_fraction` case, `[total_k, mask_heads]` row-major (the
/// layout of its mask and bias), uniform in (0, 1) as [`key_scores`] draws them, `seed` folding
/// the tag "key_frac", the number of sequences, mask_heads, total_k and `percent`. The bias is
/// `Φ⁻¹(u)` ([`normal_quantile`]), ranked as `u`: `peers.py` draws the same scores, so both
/// sides keep the same keys. `None` for a case that is not packed.
pub fn key_fraction_scores(c: &Case, percent: usize) -> Option<Vec<f64>> {
    let p = c.seqlens.as_ref()?;
    let words = [KEY_FRACTION_TAG, p.lens_k.len() as u64, c.mask_heads as u64, c.seqlen_k as u64, percent as u64];
    Some(unit_scores(&words, c.seqlen_k * c.mask_heads))
}

/// The kept keys of a `key_fraction` mask: per (sequence, mask head) plane, sequence-major, the
/// [`fraction_kept`] keys of largest score of that sequence's keys (ties to the lower key), as
/// ascending positions within the sequence (`0..len_k`; add the sequence's first packed key for
/// the packed row). `scores` are [`key_fraction_scores`], `[total_k, mask_heads]`.
pub fn top_fraction_keys(scores: &[f64], lens_k: &[usize], mask_heads: usize, percent: usize) -> Vec<Vec<u32>> {
    let starts: Vec<usize> = lens_k.iter().scan(0, |start, &n| Some(std::mem::replace(start, *start + n))).collect();
    (0..lens_k.len() * mask_heads)
        .into_par_iter()
        .map(|plane| {
            let (b, h) = (plane / mask_heads, plane % mask_heads);
            let s: Vec<f64> = (starts[b]..starts[b] + lens_k[b]).map(|key| scores[key * mask_heads + h]).collect();
            top_of(&s, fraction_kept(lens_k[b], percent))
        })
        .collect()
}

/// 32-bit mixing of (plane, row, slot) for [`index_lists`]: every product stays below 2^63, so
/// that `peers.py` computes the same values in torch's int64.
fn list_hash(plane: u64, row: u64, slot: u64) -> u64 {
    const M: u64 = 0xffff_ffff;
    let mut h = (plane * 0x9E37 + row * 0x2C1B_3C6D + slot * 0x297A_2D39 + 0x1234_5678) & M;
    h ^= h >> 16;
    h = (h * 0x7FEB_352D) & M;
    h ^= h >> 15;
    h = (h * 0x2C1B_3C6D) & M;
    h ^ (h >> 16)
}

/// An `index_lists` case's lists, `[batch, mask_heads, seqlen_q, keep]` row-major: row `i` of
/// plane `p` sees keys `0..hi` ([`Case::row_keys`]: `hi = i + sk - sq + 1` under causal, clamped
/// to `0..=sk`) and lists at slot `k` the key `list_hash(p, i, k) % hi` (`random`) or `hi - 1 - k`
/// (`window`), -1 where there is none.
pub fn index_lists(c: &Case, keep: usize, layout: ListLayout) -> Vec<i32> {
    let sq = c.seqlen_q;
    let mut lists = vec![-1i32; c.batch * c.mask_heads * sq * keep];
    lists.par_chunks_mut(keep).enumerate().for_each(|(r, row)| {
        let (plane, i) = (r / sq, r % sq);
        let hi = c.row_keys(i).end as i64;
        for (k, entry) in row.iter_mut().enumerate() {
            let key = match layout {
                ListLayout::Random if hi > 0 => (list_hash(plane as u64, i as u64, k as u64) % hi as u64) as i64,
                ListLayout::Random => -1,
                ListLayout::Window => hi - 1 - k as i64,
            };
            *entry = key.max(-1) as i32;
        }
    });
    lists
}

/// The standard normal quantile `Φ⁻¹(p)`, `0 < p < 1` (Acklam's rational approximation, relative
/// error below 1.2e-9: far finer than bf16), which turns [`key_scores`] into N(0, 1) values.
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [-3.969683028665376e1, 2.209460984245205e2, -2.759285104469687e2, 1.38357751867269e2, -3.066479806614716e1, 2.506628277459239];
    const B: [f64; 5] = [-5.447609879822406e1, 1.615858368580409e2, -1.556989798598866e2, 6.680131188771972e1, -1.328068155288572e1];
    const C: [f64; 6] = [-7.784894002430293e-3, -3.223964580411365e-1, -2.400758277161838, -2.549732539343734, 4.374664141464968, 2.938163982698783];
    const D: [f64; 4] = [7.784695709041462e-3, 3.224671290700398e-1, 2.445134137142996, 3.754408661907416];
    const LOW: f64 = 0.02425;
    if p < LOW {
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5]) / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    } else if p <= 1.0 - LOW {
        let (q, r) = (p - 0.5, (p - 0.5) * (p - 0.5));
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        -normal_quantile(1.0 - p)
    }
}

/// Folded into the seed of [`packed_lengths`] first (ASCII "varlen").
const VARLEN_TAG: u64 = 0x7661_726C_656E;

/// `n` sequence lengths in `range` for a packed batch, deterministic: length `i` is `lo +
/// splitmix64(seed + i) % (hi - lo + 1)`, `seed` folding the tag "varlen", `n`, `lo` and `hi`
/// through splitmix64 as [`block_pattern`] does. So every run packs the same sequences (and
/// `cases.json` lists them for `peers.py`).
pub fn packed_lengths(n: usize, range: std::ops::RangeInclusive<usize>) -> Vec<usize> {
    let (lo, hi) = (*range.start(), *range.end());
    let seed = [VARLEN_TAG, n as u64, lo as u64, hi as u64].iter().fold(0u64, |s, &w| splitmix64(s ^ w));
    (0..n as u64).map(|i| lo + (splitmix64(seed.wrapping_add(i)) % (hi - lo + 1) as u64) as usize).collect()
}

/// The most queries a sequence of a packed batch may have for the batch to count as decoding
/// ([`Case::is_decode`]: reported in GB/s).
pub const DECODE_ROWS: usize = 16;

/// Issue 18's bound for batched decoding over a key-side mask and bias ([`Case::copy_time_target`]):
/// the forward's time over the time to move its bytes at the device copy bandwidth.
pub const KEY_FRACTION_COPY_TARGET: f64 = 1.3;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Case {
    pub id: String,
    pub group: String,
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub mask: Option<Mask>,
    pub bias: bool,
    /// The heads dimension of mask and bias: 1 or `kv_heads`.
    pub mask_heads: usize,
    pub backward: bool,
    /// A packed variable-length batch (the `varlen` group): each sequence's query and key
    /// lengths; then `batch` is 1 and `seqlen_q` and `seqlen_k` are the totals (q `[seqlen_q,
    /// heads, head_dim]`, k and v `[seqlen_k, kv_heads, head_dim]`). Absent for the other cases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seqlens: Option<Packed>,
}

/// The sequences of a packed batch ([`Case::seqlens`]): `dmattn::SeqLens::from_lengths(&lens_q,
/// &lens_k, ..)`. Written out in `cases.json`, so that `peers.py` reads the lengths rather than
/// drawing them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Packed {
    pub lens_q: Vec<usize>,
    pub lens_k: Vec<usize>,
    /// K and V as the pages of a paged KV cache of this many keys a page (dmattn's
    /// `.kv_pages(..)`, forward only), laid out by [`page_table`]; absent (and not written) for
    /// contiguous packed k and v. The attention is the same: `peers.py` runs such a case on the
    /// contiguous layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<usize>,
}

/// Folded into the seed of [`page_order`] first (ASCII "paged").
const PAGED_TAG: u64 = 0x70_6167_6564;

/// A deterministic shuffle of `0..num_pages`: Fisher-Yates from the top, step `i` swapping `i`
/// with `splitmix64(seed + i) % (i + 1)`, `seed` folding the tag "paged", `num_pages` and
/// `page_size` through splitmix64 as [`block_pattern`] does.
pub fn page_order(num_pages: usize, page_size: usize) -> Vec<usize> {
    let seed = [PAGED_TAG, num_pages as u64, page_size as u64].iter().fold(0u64, |s, &w| splitmix64(s ^ w));
    let mut order: Vec<usize> = (0..num_pages).collect();
    for i in (1..num_pages).rev() {
        let j = (splitmix64(seed.wrapping_add(i as u64)) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// The paged K/V of a packed batch ([`page_table`]): k and v are `[num_pages, page_size,
/// kv_heads, head_dim]`, key `j` of sequence `b` at row `j % page_size` of page `table[b][j /
/// page_size]`.
#[derive(Clone, Debug, PartialEq)]
pub struct PageLayout {
    pub page_size: usize,
    /// At least 1.
    pub num_pages: usize,
    /// The most pages a sequence needs, at least 1.
    pub max_pages: usize,
    /// The block table, row-major `[batch, max_pages]`, entries past a sequence's pages -1.
    pub table: Vec<i32>,
}

/// The paged layout of a packed batch with a page size (`None` without one): sequence `b` needs
/// `ceil(lens_k[b] / page_size)` pages, `num_pages` their sum; the sequences' pages in order
/// (sequence 0's first, ..) are the pages [`page_order`] gives, so that a sequence's pages are
/// rarely neighbours, as in a cache that has served many requests. `DMATTN_BENCH_PAGES_IN_ORDER=1`
/// lays them out in order instead (the contiguous layout's, in pages: what the shuffle costs).
pub fn page_table(p: &Packed) -> Option<PageLayout> {
    let page_size = p.page_size?;
    let need: Vec<usize> = p.lens_k.iter().map(|&n| n.div_ceil(page_size)).collect();
    let (max_pages, num_pages) = (need.iter().copied().max().unwrap_or(0).max(1), need.iter().sum::<usize>().max(1));
    let in_order = std::env::var("DMATTN_BENCH_PAGES_IN_ORDER").is_ok_and(|v| v == "1");
    let order = if in_order { (0..num_pages).collect() } else { page_order(num_pages, page_size) };
    let mut table = vec![-1i32; p.lens_k.len() * max_pages];
    let mut next = 0;
    for (b, &n) in need.iter().enumerate() {
        for (i, &page) in order[next..next + n].iter().enumerate() {
            table[b * max_pages + i] = page as i32;
        }
        next += n;
    }
    Some(PageLayout { page_size, num_pages, max_pages, table })
}

/// The file `dmattn-bench` writes and `peers.py` reads.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct CaseSet {
    pub dtype: String,
    pub warmup: usize,
    pub reps: usize,
    pub cases: Vec<Case>,
}

impl Case {
    /// Row `i`'s keys under the case's causal flag and band (`window`, `compress`,
    /// `compress_dense`), `lo..hi`: the diagonal is `i + sk - sq` (bottom-right), or `i / cf`
    /// under compression; causal (and compression) end the row there, a window starts it
    /// `left` keys before.
    pub fn row_keys(&self, i: usize) -> std::ops::Range<usize> {
        let (sq, sk) = (self.seqlen_q as i64, self.seqlen_k as i64);
        let (diagonal, ends) = match self.mask {
            Some(Mask::Compress { cf } | Mask::CompressDense { cf }) => ((i / cf.max(1)) as i64, true),
            _ => (i as i64 + sk - sq, self.causal),
        };
        let hi = if ends { (diagonal + 1).clamp(0, sk) } else { sk };
        let lo = match self.mask {
            Some(Mask::Window { left }) => (diagonal - left as i64).clamp(0, sk),
            _ => 0,
        };
        lo as usize..(hi.max(lo)) as usize
    }

    /// The query dimension of mask and bias: 1 for `key_topk` and `key_fraction` (key-side, the
    /// same for every query) and a key-side `select` bias, else `seqlen_q`.
    pub fn mask_rows(&self) -> usize {
        match self.mask {
            Some(Mask::KeyTopk { .. } | Mask::KeyFraction { .. } | Mask::Select { rows: SelectRows::KeySide, .. }) => 1,
            _ => self.seqlen_q,
        }
    }

    /// Whether this is a `select` case (key selection alone, no attention).
    pub fn is_select(&self) -> bool {
        matches!(self.mask, Some(Mask::Select { .. }))
    }

    /// The shape of a `select` case's bias, `[batch, mask_heads, 1 or seqlen_q, seqlen_k]`.
    pub fn select_bias_shape(&self) -> [usize; 4] {
        [self.batch, self.mask_heads, self.mask_rows(), self.seqlen_k]
    }

    /// Bytes a `select` case reads (the bias, 2 B an element, and the causal bool mask of
    /// `within_causal`, 1 B an entry, each once) and writes (the output: 1 B a key of every row
    /// for `mask`, 4 B an entry of every row's `keep`-long list for `indices`); `None` for other
    /// cases.
    pub fn select_bytes(&self) -> Option<(f64, f64)> {
        let Some(Mask::Select { keep, within_causal, output, .. }) = self.mask else { return None };
        let (sq, sk) = (self.seqlen_q, self.seqlen_k);
        let read = 2 * self.select_bias_shape().iter().product::<usize>() + if within_causal { sq * sk } else { 0 };
        let rows = self.batch * self.mask_heads * sq;
        let written = match output {
            SelectOutput::Mask => rows * sk,
            SelectOutput::Indices => rows * keep.min(sk) * 4,
        };
        Some((read as f64, written as f64))
    }

    /// The kept keys of a `key_topk` case, per (batch, mask head) plane, ascending
    /// ([`key_scores`], [`top_keys`]); of a packed `key_fraction` case, per (sequence, mask head)
    /// plane, sequence-major, ascending positions within the sequence ([`key_fraction_scores`],
    /// [`top_fraction_keys`]).
    pub fn kept_keys(&self) -> Option<Vec<Vec<u32>>> {
        match self.mask {
            Some(Mask::KeyTopk { keep }) => Some(top_keys(&key_scores(self, keep), self.seqlen_k, keep)),
            Some(Mask::KeyFraction { percent }) => {
                let scores = key_fraction_scores(self, percent)?;
                Some(top_fraction_keys(&scores, &self.seqlens.as_ref()?.lens_k, self.mask_heads, percent))
            }
            _ => None,
        }
    }

    /// The keys of each plane a key-side mask keeps, summed over a packed batch's sequences
    /// (`key_topk`: `keep`; `key_fraction`: each sequence's [`fraction_kept`]): the rows of k and
    /// v a forward over the kept keys reads per kv head (one plane per kv head, or one for all);
    /// `None` for the other masks.
    pub fn kept_rows(&self) -> Option<usize> {
        match (self.mask, &self.seqlens) {
            (Some(Mask::KeyTopk { keep }), _) => Some(keep.min(self.seqlen_k)),
            (Some(Mask::KeyFraction { percent }), Some(p)) => Some(p.lens_k.iter().map(|&n| fraction_kept(n, percent)).sum()),
            _ => None,
        }
    }

    /// The kept blocks of a `bcsr` or `bitset` case ([`block_pattern`]) with their block size.
    pub fn kept_blocks(&self) -> Option<(usize, Vec<bool>)> {
        match self.mask {
            Some(Mask::Bcsr { block, density } | Mask::Bitset { block, density }) => Some((block, block_pattern(self, block, density))),
            _ => None,
        }
    }

    /// A packed batch's sequences as fixed-length cases (batch 1, the sequence's lengths, the
    /// rest of this case's), in order; `None` for a fixed-length case.
    pub fn sequences(&self) -> Option<Vec<Case>> {
        let p = self.seqlens.as_ref()?;
        let one = Case { batch: 1, seqlens: None, ..self.clone() };
        Some(p.lens_q.iter().zip(&p.lens_k).map(|(&seqlen_q, &seqlen_k)| Case { seqlen_q, seqlen_k, ..one.clone() }).collect())
    }

    /// Query-key pairs of one (batch, head) the FLOP count covers: those causal masking and the
    /// band leave ([`Case::row_keys`]) and, for `bcsr` and `bitset`, inside the kept blocks, for
    /// `key_topk` among the kept keys (averaged over the mask's planes). The data masks given
    /// densely (`topk`, `blocks`) are not subtracted (the convention of the earlier results);
    /// `compress_dense` counts as `compress`. `index_lists` (either form) counts the listed keys:
    /// a window's exactly, random lists' distinct keys in expectation (`hi (1 - (1 - 1/hi)^keep)`
    /// of a row's `hi` visible keys). A packed batch (batch 1) counts every sequence's pairs, each
    /// as a fixed-length case of its lengths counts them (causal aligned to its own bottom-right
    /// corner: query `i` sees keys `j <= i + sk - sq` of its sequence), for `key_fraction` among
    /// the sequence's kept keys (averaged over its mask heads).
    pub fn pairs(&self) -> f64 {
        if let Some(seqs) = self.sequences() {
            if let Some(planes) = self.kept_keys() {
                return seqs.iter().zip(planes.chunks(self.mask_heads.max(1))).map(|(s, planes)| s.kept_pairs(planes)).sum();
            }
            return seqs.iter().map(Case::pairs).sum();
        }
        if let Some(Mask::IndexLists { keep, layout, .. }) = self.mask {
            return (0..self.seqlen_q)
                .map(|i| self.row_keys(i).end as f64)
                .filter(|&hi| hi > 0.0)
                .map(|hi| match layout {
                    ListLayout::Window => hi.min(keep as f64),
                    ListLayout::Random => hi * (1.0 - (1.0 - 1.0 / hi).powi(keep as i32)),
                })
                .sum();
        }
        if let Some(planes) = self.kept_keys() {
            return self.kept_pairs(&planes);
        }
        let rows = |plane: Option<(&[bool], usize)>| -> f64 {
            (0..self.seqlen_q)
                .map(|i| {
                    let keys = self.row_keys(i);
                    match plane {
                        None => keys.len(),
                        Some((kept, block)) => {
                            let nk = self.seqlen_k.div_ceil(block);
                            let row = &kept[(i / block) * nk..][..nk];
                            row.iter()
                                .enumerate()
                                .filter(|(_, k)| **k)
                                .map(|(j, _)| (j * block).max(keys.start)..((j + 1) * block).min(keys.end))
                                .map(|r| r.len())
                                .sum()
                        }
                    }
                })
                .sum::<usize>() as f64
        };
        match self.kept_blocks() {
            None => rows(None),
            Some((block, kept)) => {
                let planes = self.batch * self.mask_heads;
                let per_plane = kept.len() / planes;
                kept.chunks(per_plane).map(|p| rows(Some((p, block)))).sum::<f64>() / planes as f64
            }
        }
    }

    /// The pairs of [`Case::row_keys`] among each plane's `kept` keys (ascending), averaged over
    /// the planes.
    fn kept_pairs(&self, planes: &[Vec<u32>]) -> f64 {
        let per_plane = |kept: &Vec<u32>| {
            // before[j]: kept keys below j.
            let mut before = vec![0usize; self.seqlen_k + 1];
            kept.iter().for_each(|&j| before[j as usize + 1] = 1);
            (1..before.len()).for_each(|j| before[j] += before[j - 1]);
            (0..self.seqlen_q).map(|i| self.row_keys(i)).map(|r| before[r.end] - before[r.start]).sum::<usize>() as f64
        };
        planes.iter().map(per_plane).sum::<f64>() / planes.len().max(1) as f64
    }

    /// Forward FLOPs: the two matmuls over [`Case::pairs`] (FlashAttention's count, which for
    /// causal and windows counts the visible pairs).
    pub fn fwd_flops(&self) -> f64 {
        if self.is_select() {
            return 0.0; // no attention: the report gives GB/s
        }
        4.0 * (self.batch * self.heads * self.head_dim) as f64 * self.pairs()
    }

    /// Backward FLOPs: five matmuls to the forward's two.
    pub fn bwd_flops(&self) -> f64 {
        2.5 * self.fwd_flops()
    }

    /// FLOPs of `pass` ([`Pass::Prep`] has none).
    pub fn flops(&self, pass: Pass) -> f64 {
        match pass {
            Pass::Fwd => self.fwd_flops(),
            Pass::Bwd => self.bwd_flops(),
            Pass::Prep => 0.0,
        }
    }

    /// FLOPs of `pass` over the score tiles a block-sparse kernel computes: every pair of the
    /// `computed_fraction` of the `seqlen_q × seqlen_k` tiles that hold a visible score (of a
    /// packed batch, of the sequences' `sq × sk` rectangles).
    pub fn computed_flops(&self, pass: Pass, computed_fraction: f64) -> f64 {
        let area = match &self.seqlens {
            Some(p) => p.lens_q.iter().zip(&p.lens_k).map(|(&sq, &sk)| sq * sk).sum::<usize>(),
            None => self.batch * self.seqlen_q * self.seqlen_k,
        };
        let rect = 4.0 * (self.heads * self.head_dim) as f64 * area as f64;
        let per_pass = match pass {
            Pass::Fwd => 1.0,
            Pass::Bwd => 2.5,
            Pass::Prep => 0.0,
        };
        per_pass * rect * computed_fraction
    }

    /// Bytes a forward must read at least (q, k, v, and the mask and bias) and write (out):
    /// the memory traffic that bounds decoding. Elements are 2 bytes, dense mask entries 1,
    /// parametric masks none; a key-side mask (`key_topk`, `key_fraction`) needs only the kept
    /// keys' rows of k and v ([`Case::kept_rows`] of each kv head: each kv head's own kept keys
    /// where `mask_heads = kv_heads`) and its mask and bias have one row; a packed batch (batch
    /// 1, the totals) its packed q, k, v and out (paged K/V the same rows: a paged call reads each
    /// sequence's keys, not the pages' spare rows), and `key_fraction`'s mask and bias once
    /// (`[total_k, mask_heads]`, 1 and 2 B an entry). A `select` case has no forward: the bytes it
    /// reads ([`Case::select_bytes`]).
    pub fn fwd_bytes(&self) -> f64 {
        if let Some((read, _)) = self.select_bytes() {
            return read;
        }
        let kv_rows = self.kept_rows().unwrap_or(self.seqlen_k);
        let qo = 2 * self.batch * self.seqlen_q * self.heads * self.head_dim;
        let kv = 2 * self.batch * kv_rows * self.kv_heads * self.head_dim;
        let scores = self.batch * self.mask_heads * self.mask_rows() * self.seqlen_k;
        let mask = match self.mask {
            None | Some(Mask::Window { .. } | Mask::Compress { .. }) => 0,
            Some(Mask::Topk { .. } | Mask::Blocks { .. } | Mask::CompressDense { .. } | Mask::KeyTopk { .. } | Mask::KeyFraction { .. } | Mask::Select { .. }) => scores,
            Some(Mask::IndexLists { dense: true, .. }) => scores,
            Some(Mask::IndexLists { keep, dense: false, .. }) => 4 * self.batch * self.mask_heads * self.seqlen_q * keep,
            // The kept flags (BCSR's indices are as many words, near enough).
            Some(Mask::Bitset { block, .. } | Mask::Bcsr { block, .. }) => scores / (block * block),
        };
        (2 * qo + 2 * kv + mask + 2 * scores * self.bias as usize) as f64
    }

    /// Whether this is a decoding case (one query row, or a packed batch of sequences of at most
    /// [`DECODE_ROWS`] queries each), reported in GB/s.
    pub fn is_decode(&self) -> bool {
        match &self.seqlens {
            Some(p) => p.lens_q.iter().all(|&n| n <= DECODE_ROWS),
            None => self.seqlen_q == 1,
        }
    }

    /// The target of a decoding case with a `key_fraction` mask (issue 18: batched decode over a
    /// key-side mask and bias): its forward should take at most this many times the time to move
    /// [`Case::fwd_bytes`] (the kept K/V rows, mask, bias, q and out) at the measured device copy
    /// bandwidth ([`crate::results::Ceilings::copy_gbps`]). `None` for other cases.
    pub fn copy_time_target(&self) -> Option<f64> {
        match self.mask {
            Some(Mask::KeyFraction { .. }) if self.is_decode() => Some(KEY_FRACTION_COPY_TARGET),
            _ => None,
        }
    }

    /// Short label of the masking, for tables: `dense`, `causal`, `topk1024+bias`, ...; a packed
    /// batch adds its sequence count (`causal+varlen16`), and paged K/V their page size
    /// (`causal+varlen64+paged256`); for a `select` case its rows and output:
    /// `per-query/indices`, `key-side+causal/mask`, ...
    pub fn variant(&self) -> String {
        if let Some(Mask::Select { rows, within_causal, output, .. }) = self.mask {
            let rows = match rows {
                SelectRows::PerQuery => "per-query",
                SelectRows::KeySide => "key-side",
            };
            let output = match output {
                SelectOutput::Indices => "indices",
                SelectOutput::Mask => "mask",
            };
            return format!("{rows}{}/{output}", if within_causal { "+causal" } else { "" });
        }
        let mut parts = Vec::new();
        if self.causal {
            parts.push("causal".to_string());
        }
        match self.mask {
            Some(Mask::Topk { keep }) => parts.push(format!("topk{keep}")),
            Some(Mask::Blocks { block, density }) => parts.push(format!("blocks{block}x{:.0}%", density * 100.0)),
            Some(Mask::Window { left }) => parts.push(format!("window{left}")),
            Some(Mask::Compress { cf }) => parts.push(format!("compress{cf}")),
            Some(Mask::CompressDense { cf }) => parts.push(format!("compress{cf}-dense")),
            Some(Mask::Bcsr { block, density }) => parts.push(format!("bcsr{block}x{:.0}%", density * 100.0)),
            Some(Mask::Bitset { block, density }) => parts.push(format!("bitset{block}x{:.0}%", density * 100.0)),
            Some(Mask::KeyTopk { keep }) => parts.push(format!("keytopk{keep}")),
            Some(Mask::KeyFraction { percent }) => parts.push(format!("keyfrac{percent}%")),
            Some(Mask::IndexLists { keep, layout, dense }) => {
                let layout = match layout {
                    ListLayout::Random => "random",
                    ListLayout::Window => "window",
                };
                parts.push(format!("lists{keep}-{layout}{}", if dense { "-dense" } else { "" }));
            }
            Some(Mask::Select { .. }) => unreachable!("select cases are labelled above"),
            None => {}
        }
        if let Some(p) = &self.seqlens {
            parts.push(format!("varlen{}", p.lens_q.len()));
            if let Some(page_size) = p.page_size {
                parts.push(format!("paged{page_size}"));
            }
        }
        if self.bias {
            parts.push("bias".into());
        }
        if parts.is_empty() { "dense".into() } else { parts.join("+") }
    }
}

/// A case of `group` with Flash-DMA's benchmark shape (batch 1, 2 heads, 1 kv head, dim 64),
/// a top-`keep` mask and a bias.
fn flash_dma(group: &str, seqlen_q: usize, seqlen_k: usize, keep: usize) -> Case {
    let mut c = Case {
        id: String::new(),
        group: group.into(),
        batch: 1,
        heads: 2,
        kv_heads: 1,
        seqlen_q,
        seqlen_k,
        head_dim: 64,
        causal: false,
        mask: Some(Mask::Topk { keep }),
        bias: true,
        mask_heads: 1,
        backward: seqlen_q > 1,
        seqlens: None,
    };
    c.id = format!("{group}/q{seqlen_q}/k{seqlen_k}/{}", c.variant());
    c
}

/// LLM-shaped cases: batch 2, 32 heads, 8 kv heads (GQA), dim 128.
/// LLM shapes: dense, causal, a 50 % random 128-block mask, and that mask with a bias.
fn llm(group: &str, head_dim: usize, seqlen: usize) -> Vec<Case> {
    let base = Case {
        id: String::new(),
        group: group.into(),
        batch: 2,
        heads: 32,
        kv_heads: 8,
        seqlen_q: seqlen,
        seqlen_k: seqlen,
        head_dim,
        causal: false,
        mask: None,
        bias: false,
        mask_heads: 1,
        backward: true,
        seqlens: None,
    };
    let blocks = Some(Mask::Blocks { block: 128, density: 0.5 });
    [base.clone(), Case { causal: true, ..base.clone() }, Case { mask: blocks, ..base.clone() }, Case { mask: blocks, bias: true, ..base }]
        .into_iter()
        .map(|mut c| {
            c.id = format!("llm/d{}/s{seqlen}/{}", c.head_dim, c.variant());
            c
        })
        .collect()
}

/// The `sparse` group: the sparse-mask API's targets, on LLM shapes (batch 2, 32 heads, 8 kv
/// heads), forward and backward. `(head_dim, seqlen_q, mask, causal)` per case: causal with a
/// left window of 1024 (against FlexAttention's sliding-window BlockMask); compressed causal,
/// cf 4 and 64, parametric and as a dense bool mask (the same pattern); 50 % random 128-blocks as
/// BCSR and as a bitset.
fn sparse(quick: bool) -> Vec<Case> {
    let mut shapes: Vec<(usize, usize, Mask, bool)> = Vec::new();
    let window = Mask::Window { left: 1024 };
    let (dims, seqlens, factors): (&[usize], &[usize], &[usize]) = if quick { (&[128], &[16384], &[4]) } else { (&[128, 64], &[16384, 32768], &[4, 64]) };
    for &d in dims {
        shapes.extend(seqlens.iter().map(|&s| (d, s, window, true)));
    }
    for &d in dims {
        for &cf in factors {
            shapes.push((d, 16384, Mask::Compress { cf }, false));
            shapes.push((d, 16384, Mask::CompressDense { cf }, false));
        }
    }
    let blocks: &[Mask] = if quick {
        &[Mask::Bcsr { block: 128, density: 0.5 }]
    } else {
        &[Mask::Bcsr { block: 128, density: 0.5 }, Mask::Bitset { block: 128, density: 0.5 }]
    };
    shapes.extend(blocks.iter().map(|&m| (128, 8192, m, false)));
    shapes
        .into_iter()
        .map(|(head_dim, seqlen_q, mask, causal)| {
            let seqlen_k = match mask {
                Mask::Compress { cf } | Mask::CompressDense { cf } => seqlen_q / cf,
                _ => seqlen_q,
            };
            let mut c = Case {
                id: String::new(),
                group: "sparse".into(),
                batch: 2,
                heads: 32,
                kv_heads: 8,
                seqlen_q,
                seqlen_k,
                head_dim,
                causal,
                mask: Some(mask),
                bias: false,
                mask_heads: 1,
                backward: true,
                seqlens: None,
            };
            c.id = format!("sparse/d{head_dim}/q{seqlen_q}/k{seqlen_k}/{}", c.variant());
            c
        })
        .collect()
}

/// The `gather` group: Flash-DMA's key-side top-k (`key_topk`: a query-broadcast mask and bias
/// `[batch, kv_heads, 1, seqlen_k]`), which dmattn runs as gather attention over the kept keys,
/// the compaction inside the timed call. Batch 1, causal, bias: Flash-DMA's shape (2 heads, 1 kv
/// head, dim 64, keep 1024) at 16K and 32K; a GQA shape (16 heads, 4 kv heads, dim 128, keep
/// 2048, one mask plane per kv head) at 8K and 32K, forward and backward; and decoding (one
/// query, 512K keys, Flash-DMA's shape), forward. `quick`: the 16K and decoding cases.
fn gather(quick: bool) -> Vec<Case> {
    // (heads, kv_heads, head_dim, keep, seqlen_q, seqlen_k)
    let mut shapes: Vec<(usize, usize, usize, usize, usize, usize)> = Vec::new();
    let flash_dma: &[usize] = if quick { &[16384] } else { &[16384, 32768] };
    shapes.extend(flash_dma.iter().map(|&s| (2, 1, 64, 1024, s, s)));
    if !quick {
        shapes.extend([8192, 32768].map(|s| (16, 4, 128, 2048, s, s)));
    }
    shapes.push((2, 1, 64, 1024, 1, 524288));
    shapes
        .into_iter()
        .map(|(heads, kv_heads, head_dim, keep, seqlen_q, seqlen_k)| {
            let mut c = Case {
                id: String::new(),
                group: "gather".into(),
                batch: 1,
                heads,
                kv_heads,
                seqlen_q,
                seqlen_k,
                head_dim,
                causal: true,
                mask: Some(Mask::KeyTopk { keep }),
                bias: true,
                mask_heads: kv_heads,
                backward: seqlen_q > 1,
                seqlens: None,
            };
            c.id = format!("gather/d{head_dim}/q{seqlen_q}/k{seqlen_k}/{}", c.variant());
            c
        })
        .collect()
}

/// The `indices` group: per-query index lists (`attn_indices`), Flash-DMA's shape (batch 1, 2
/// heads, 1 kv head, dim 64), 32K queries and keys, 1024 keys a row, causal, no bias: random
/// lists and window-shaped ones, each also as the same pattern in a dense bool mask (dmattn's
/// dense-mask path), forward and backward, and the band the window lists are (causal, left 1023);
/// and random lists at 64K (work O(queries x w) against the dense tiles' O(queries x keys)). `quick`: the random lists at 32K and their dense form.
fn indices(quick: bool) -> Vec<Case> {
    let layouts: &[(ListLayout, usize)] =
        if quick { &[(ListLayout::Random, 32768)] } else { &[(ListLayout::Random, 32768), (ListLayout::Window, 32768), (ListLayout::Random, 65536)] };
    // Window-shaped lists hold row `i`'s keys `i - 1023..=i`: the band they are, for comparison.
    let band = (!quick).then_some((Mask::Window { left: 1023 }, 32768));
    layouts
        .iter()
        .flat_map(|&(layout, seqlen)| [false, true].map(|dense| (Mask::IndexLists { keep: 1024, layout, dense }, seqlen)))
        .flat_map(|(mask, seqlen)| {
            let window_dense = matches!(mask, Mask::IndexLists { layout: ListLayout::Window, dense: true, .. });
            std::iter::once((mask, seqlen)).chain(band.filter(|_| window_dense))
        })
        .map(|(mask, seqlen)| {
            let mut c = Case {
                id: String::new(),
                group: "indices".into(),
                batch: 1,
                heads: 2,
                kv_heads: 1,
                seqlen_q: seqlen,
                seqlen_k: seqlen,
                head_dim: 64,
                causal: true,
                mask: Some(mask),
                bias: false,
                mask_heads: 1,
                backward: true,
                seqlens: None,
            };
            c.id = format!("indices/d64/q{seqlen}/k{seqlen}/{}", c.variant());
            c
        })
        .collect()
}

/// The `select` group: `dmattn::select_keys` alone (Flash-DMA's `create_mask`, no attention),
/// top-1024 over a bf16 bias, batch 1: a per-query bias `[1, 2, 32768, 32768]` into index lists
/// and into a bool mask; a key-side bias `[1, 1, 1, 32768]` within a causal mask `[1, 1, 32768,
/// 32768]` (a row per query) into both; a single key-side row of 32K keys and, decoding, of 512K
/// and 1M keys, and a row of 128K keys for each of 8 kv heads, into index lists. `quick`: the
/// per-query index lists and the 32K key-side row.
fn select(quick: bool) -> Vec<Case> {
    use SelectOutput::{Indices, Mask as Bools};
    use SelectRows::{KeySide, PerQuery};
    // (mask_heads, seqlen_q, seqlen_k, rows, within_causal, output)
    let mut shapes = vec![(2, 32768, 32768, PerQuery, false, Indices)];
    if !quick {
        shapes.extend([(2, 32768, 32768, PerQuery, false, Bools), (1, 32768, 32768, KeySide, true, Indices), (1, 32768, 32768, KeySide, true, Bools)]);
    }
    shapes.push((1, 1, 32768, KeySide, false, Indices));
    if !quick {
        shapes.extend([(1, 1, 524288, KeySide, false, Indices), (1, 1, 1 << 20, KeySide, false, Indices), (8, 1, 131072, KeySide, false, Indices)]);
    }
    shapes
        .into_iter()
        .map(|(mask_heads, seqlen_q, seqlen_k, rows, within_causal, output)| {
            let mut c = Case {
                id: String::new(),
                group: "select".into(),
                batch: 1,
                heads: mask_heads,
                kv_heads: mask_heads,
                seqlen_q,
                seqlen_k,
                head_dim: 0,
                causal: false,
                mask: Some(Mask::Select { keep: 1024, rows, within_causal, output }),
                bias: true,
                mask_heads,
                backward: false,
                seqlens: None,
            };
            c.id = format!("select/q{seqlen_q}/k{seqlen_k}/{}", c.variant());
            c
        })
        .collect()
}

/// A `varlen` case: a packed batch of sequences of these lengths (32 heads, 8 kv heads, causal,
/// no mask or bias), batch 1 and the total lengths ([`Case::seqlens`]).
fn packed(head_dim: usize, lens_q: Vec<usize>, lens_k: Vec<usize>, backward: bool) -> Case {
    let mut c = Case {
        id: String::new(),
        group: "varlen".into(),
        batch: 1,
        heads: 32,
        kv_heads: 8,
        seqlen_q: lens_q.iter().sum(),
        seqlen_k: lens_k.iter().sum(),
        head_dim,
        causal: true,
        mask: None,
        bias: false,
        mask_heads: 1,
        backward,
        seqlens: Some(Packed { lens_q, lens_k, page_size: None }),
    };
    c.id = varlen_id(&c);
    c
}

/// A packed case's id: `varlen/d{head_dim}/q{total_q}/k{total_k}/{variant}`.
fn varlen_id(c: &Case) -> String {
    format!("varlen/d{}/q{}/k{}/{}", c.head_dim, c.seqlen_q, c.seqlen_k, c.variant())
}

/// A packed case with a `key_fraction` mask keeping `percent` % of each sequence's keys per kv
/// head (`mask_heads = kv_heads`) and its key-side bias.
fn key_fraction(c: &Case, percent: usize) -> Case {
    let mut m = Case { mask: Some(Mask::KeyFraction { percent }), bias: true, mask_heads: c.kv_heads, ..c.clone() };
    m.id = varlen_id(&m);
    m
}

/// A packed case with its K and V as pages of `page_size` keys ([`page_table`]), forward only
/// (dmattn has no backward of a paged call); its id is the contiguous case's with
/// `+paged{page_size}`.
fn paged(c: &Case, page_size: usize) -> Case {
    let mut p = c.clone();
    p.seqlens.as_mut().expect("a packed case").page_size = Some(page_size);
    p.backward = false;
    p.id = varlen_id(&p);
    p
}

/// The `varlen` group: packed variable-length batches (`dmattn::SeqLens`, `.seqlens(..)`), 32
/// heads, 8 kv heads, causal aligned to each sequence's bottom-right corner, lengths drawn by
/// [`packed_lengths`]. A training pack, 16 sequences of 128..=8192 tokens (q lengths = k lengths,
/// about 64K tokens), at dims 128 and 64, forward and backward; next to it, the same number of
/// tokens as one fixed-length causal call, batch 8 of 8192 (dim 128); batched decoding, 64
/// sequences of 1..=8 queries over 1024..=65536 keys (dim 128), forward, then the same batch with
/// K and V in a paged KV cache of 256-key pages (`.kv_pages(..)`, [`page_table`]); then both
/// again with a key-side mask keeping 10 % of each sequence's keys per kv head and a key-side
/// bias (`key_fraction`, issue 18's target). `quick`: a pack of 8 sequences of 128..=4096 tokens
/// (dim 128) and decoding of 16 sequences over 1024..=16384 keys, contiguous and paged, without
/// and with the mask and bias.
fn varlen(quick: bool) -> Vec<Case> {
    let (seqs, tokens) = if quick { (8, 128..=4096) } else { (16, 128..=8192) };
    let pack = packed_lengths(seqs, tokens);
    let mut cases = vec![packed(128, pack.clone(), pack.clone(), true)];
    if !quick {
        let mut fixed = Case { batch: 8, seqlen_q: 8192, seqlen_k: 8192, seqlens: None, ..cases[0].clone() };
        fixed.id = format!("varlen/d128/b8/q8192/k8192/{}", fixed.variant());
        cases.push(fixed);
        cases.push(packed(64, pack.clone(), pack, true));
    }
    let (seqs, keys) = if quick { (16, 1024..=16384) } else { (64, 1024..=65536) };
    let decode = packed(128, packed_lengths(seqs, 1..=8), packed_lengths(seqs, keys), false);
    let (decode_paged, masked) = (paged(&decode, 256), key_fraction(&decode, 10));
    let masked_paged = paged(&masked, 256);
    cases.extend([decode, decode_paged, masked, masked_paged]);
    cases
}

/// The groups of the grid, in run order.
pub const GROUPS: [&str; 11] = ["llm", "llm-d64", "dma-train", "dma-window", "dma-infer", "dma-infer-window", "sparse", "gather", "indices", "select", "varlen"];

/// The grid for `groups` (all when empty); `quick` keeps a few sizes of each for a run of about
/// two minutes.
pub fn grid(quick: bool, groups: &[String]) -> Vec<Case> {
    let pick = |full: &[usize], few: &[usize]| -> Vec<usize> { if quick { few.to_vec() } else { full.to_vec() } };
    let mut cases = Vec::new();
    for group in GROUPS.into_iter().filter(|g| groups.is_empty() || groups.iter().any(|x| x == g)) {
        match group {
            "llm" | "llm-d64" => {
                let head_dim = if group == "llm" { 128 } else { 64 };
                let seqlens = pick(&[1024, 2048, 4096, 8192, 16384], &[8192]);
                cases.extend(seqlens.into_iter().flat_map(|s| llm(group, head_dim, s)));
            }
            "dma-train" => cases.extend(
                pick(&[256, 512, 1024, 2048, 4096, 8192, 16384, 32768], &[1024, 16384]).into_iter().map(|s| flash_dma(group, s, s, 1024)),
            ),
            "dma-window" => cases.extend(
                pick(&[32, 128, 512, 2048, 8192, 32768], &[64, 4096]).into_iter().map(|w| flash_dma(group, 32768, 32768, w)),
            ),
            "dma-infer" => cases.extend(
                pick(&[256, 1024, 4096, 16384, 65536, 131072, 262144, 524288], &[16384, 524288])
                    .into_iter()
                    .map(|s| flash_dma(group, 1, s, 1024)),
            ),
            "dma-infer-window" => cases.extend(
                pick(&[32, 128, 512, 2048, 8192], &[64]).into_iter().map(|w| flash_dma(group, 1, 524288, w)),
            ),
            "sparse" => cases.extend(sparse(quick)),
            "gather" => cases.extend(gather(quick)),
            "indices" => cases.extend(indices(quick)),
            "select" => cases.extend(select(quick)),
            "varlen" => cases.extend(varlen(quick)),
            _ => unreachable!(),
        }
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_groups_known() {
        let all = grid(false, &[]);
        let mut ids: Vec<&str> = all.iter().map(|c| c.id.as_str()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), all.len());
        assert!(grid(true, &["llm".into()]).iter().all(|c| c.group == "llm"));
        assert!(grid(true, &[]).len() < all.len());
    }

    #[test]
    fn causal_flops_count_the_visible_triangle() {
        let mut c = flash_dma("t", 4, 6, 1);
        c.causal = true;
        // Rows see 3, 4, 5, 6 keys.
        assert_eq!(c.fwd_flops(), 4.0 * 2.0 * 64.0 * 18.0);
        c.causal = false;
        assert_eq!(c.fwd_flops(), 4.0 * 2.0 * 64.0 * 24.0);
        let sq_gt_sk = Case { seqlen_q: 6, seqlen_k: 4, causal: true, ..c };
        // Rows 0 and 1 see nothing; then 1, 2, 3, 4.
        assert_eq!(sq_gt_sk.fwd_flops(), 4.0 * 2.0 * 64.0 * 10.0);
    }

    fn sparse_case(mask: Mask, causal: bool, seqlen_q: usize, seqlen_k: usize) -> Case {
        let mut c = flash_dma("t", seqlen_q, seqlen_k, 1);
        (c.mask, c.causal, c.bias) = (Some(mask), causal, false);
        c
    }

    /// Visible pairs of one plane by brute force over every score.
    fn brute_pairs(c: &Case, visible: impl Fn(usize, usize) -> bool) -> f64 {
        (0..c.seqlen_q).map(|i| (0..c.seqlen_k).filter(|&j| visible(i, j)).count()).sum::<usize>() as f64
    }

    #[test]
    fn band_pairs_follow_the_sparse_mask_rules() {
        // Causal with a left window of 7, bottom-right: D(i) = i + sk - sq.
        let c = sparse_case(Mask::Window { left: 7 }, true, 40, 50);
        assert_eq!(c.pairs(), brute_pairs(&c, |i, j| j <= i + 10 && j + 7 >= i + 10));
        let c = sparse_case(Mask::Window { left: 7 }, true, 50, 40);
        assert_eq!(c.pairs(), brute_pairs(&c, |i, j| j + 10 <= i && j + 17 >= i));
        let c = sparse_case(Mask::Window { left: 7 }, false, 40, 50);
        assert_eq!(c.pairs(), brute_pairs(&c, |i, j| j + 7 >= i + 10));
        // Compressed causal: j * cf <= i, no offset; its dense form counts the same.
        for mask in [Mask::Compress { cf: 4 }, Mask::CompressDense { cf: 4 }] {
            let c = sparse_case(mask, false, 64, 16);
            assert_eq!(c.pairs(), brute_pairs(&c, |i, j| j * 4 <= i));
            assert_eq!(c.pairs(), 4.0 * (16.0 * 17.0 / 2.0));
        }
        assert_eq!(sparse_case(Mask::Compress { cf: 4 }, false, 64, 16).fwd_flops(), 4.0 * 2.0 * 64.0 * 544.0);
    }

    #[test]
    fn block_pairs_count_the_kept_blocks() {
        let c = sparse_case(Mask::Bitset { block: 128, density: 0.5 }, false, 1000, 700);
        let (block, kept) = c.kept_blocks().unwrap();
        let nk = 700usize.div_ceil(block);
        let pairs = brute_pairs(&c, |i, j| kept[(i / block) * nk + j / block]);
        assert_eq!(c.pairs(), pairs);
        // With causal, only the kept blocks' visible triangle counts.
        let causal = Case { causal: true, ..c.clone() };
        assert_eq!(causal.pairs(), brute_pairs(&c, |i, j| kept[(i / block) * nk + j / block] && j + 300 <= i));
        // The same draw for every kind of one shape.
        assert_eq!(Case { mask: Some(Mask::Bcsr { block: 128, density: 0.5 }), ..c.clone() }.kept_blocks().unwrap().1, kept);
    }

    #[test]
    fn block_pattern_is_the_one_peers_py_draws() {
        // peers.py's block_pattern on batch 2, 1 mask head, 1000 x 700, 128-blocks, density 0.5.
        let golden = "101000010101001010100011101010110101000011110010000010111000000011000111101001011101111010100011";
        let mut c = sparse_case(Mask::Blocks { block: 128, density: 0.5 }, false, 1000, 700);
        (c.batch, c.mask_heads) = (2, 1);
        let drawn: String = block_pattern(&c, 128, 0.5).iter().map(|&k| if k { '1' } else { '0' }).collect();
        assert_eq!(drawn, golden);
    }

    #[test]
    fn sparse_group_has_the_issue_shapes() {
        let all = grid(false, &["sparse".into()]);
        assert!(all.iter().all(|c| (c.batch, c.heads, c.kv_heads, c.backward, c.bias) == (2, 32, 8, true, false)));
        let ids: Vec<&str> = all.iter().map(|c| c.id.as_str()).collect();
        for id in [
            "sparse/d128/q16384/k16384/causal+window1024",
            "sparse/d128/q32768/k32768/causal+window1024",
            "sparse/d64/q16384/k16384/causal+window1024",
            "sparse/d64/q32768/k32768/causal+window1024",
            "sparse/d128/q16384/k4096/compress4",
            "sparse/d128/q16384/k4096/compress4-dense",
            "sparse/d128/q16384/k256/compress64",
            "sparse/d128/q16384/k256/compress64-dense",
            "sparse/d128/q8192/k8192/bcsr128x50%",
            "sparse/d128/q8192/k8192/bitset128x50%",
        ] {
            assert!(ids.contains(&id), "{id} missing from {ids:?}");
        }
        assert!(all.iter().filter(|c| matches!(c.mask, Some(Mask::Compress { .. }))).all(|c| !c.causal));
        assert!(grid(true, &["sparse".into()]).len() < all.len());
        let text = serde_json::to_string(&all).unwrap();
        for kind in [r#"{"kind":"window","left":1024}"#, r#"{"kind":"compress","cf":4}"#, r#"{"kind":"compress_dense","cf":64}"#, r#"{"kind":"bcsr","block":128,"density":0.5}"#] {
            assert!(text.contains(kind), "{kind} not in {text}");
        }
    }

    /// The lists follow their rule, and the hash is the one `peers.py` computes (values from
    /// its `list_hash`).
    #[test]
    fn index_lists_follow_their_rule() {
        assert_eq!([list_hash(0, 0, 0), list_hash(0, 5, 3), list_hash(1, 32767, 1023)], [793287871, 441288810, 1651451268]);
        let mut c = grid(false, &["indices".into()]).remove(0);
        (c.seqlen_q, c.seqlen_k) = (40, 30);
        for layout in [ListLayout::Random, ListLayout::Window] {
            let lists = index_lists(&c, 8, layout);
            for (i, row) in lists.chunks(8).enumerate() {
                // Causal, bottom-right: row i sees keys 0..i - 9, none before row 10.
                let hi = (i as i64 - 9).max(0);
                for (k, &key) in row.iter().enumerate() {
                    match layout {
                        ListLayout::Random if hi > 0 => assert!((0..hi).contains(&(key as i64)), "row {i}: {key}"),
                        ListLayout::Random => assert_eq!(key, -1),
                        ListLayout::Window => assert_eq!(key as i64, (hi - 1 - k as i64).max(-1)),
                    }
                }
            }
        }
    }

    #[test]
    fn indices_group_pairs_each_layout_with_its_dense_form() {
        let ids: Vec<String> = grid(false, &["indices".into()]).into_iter().map(|c| c.id).collect();
        assert_eq!(
            ids,
            [
                "indices/d64/q32768/k32768/causal+lists1024-random",
                "indices/d64/q32768/k32768/causal+lists1024-random-dense",
                "indices/d64/q32768/k32768/causal+lists1024-window",
                "indices/d64/q32768/k32768/causal+lists1024-window-dense",
                "indices/d64/q32768/k32768/causal+window1023",
                "indices/d64/q65536/k65536/causal+lists1024-random",
                "indices/d64/q65536/k65536/causal+lists1024-random-dense",
            ]
        );
    }

    #[test]
    fn gather_group_has_the_issue_shapes() {
        let all = grid(false, &["gather".into()]);
        let ids: Vec<&str> = all.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "gather/d64/q16384/k16384/causal+keytopk1024+bias",
                "gather/d64/q32768/k32768/causal+keytopk1024+bias",
                "gather/d128/q8192/k8192/causal+keytopk2048+bias",
                "gather/d128/q32768/k32768/causal+keytopk2048+bias",
                "gather/d64/q1/k524288/causal+keytopk1024+bias",
            ]
        );
        for c in &all {
            assert!(c.causal && c.bias && c.batch == 1 && c.mask_heads == c.kv_heads && !c.mask.unwrap().is_sparse(), "{}", c.id);
            assert_eq!(c.mask_rows(), 1);
            let shape = (c.heads, c.kv_heads, c.head_dim, c.mask);
            assert!(
                shape == (2, 1, 64, Some(Mask::KeyTopk { keep: 1024 })) || shape == (16, 4, 128, Some(Mask::KeyTopk { keep: 2048 })),
                "{}",
                c.id
            );
            assert_eq!(c.backward, !c.is_decode());
        }
        let quick: Vec<String> = grid(true, &["gather".into()]).into_iter().map(|c| c.id).collect();
        assert_eq!(quick, ["gather/d64/q16384/k16384/causal+keytopk1024+bias", "gather/d64/q1/k524288/causal+keytopk1024+bias"]);
        let text = serde_json::to_string(&all[0]).unwrap();
        assert!(text.contains(r#""mask":{"kind":"key_topk","keep":1024}"#), "{text}");
        assert_eq!(&serde_json::from_str::<Case>(&text).unwrap(), &all[0]);
    }

    fn key_topk_case(keep: usize, causal: bool, seqlen_q: usize, seqlen_k: usize, mask_heads: usize) -> Case {
        let mut c = flash_dma("t", seqlen_q, seqlen_k, 1);
        (c.mask, c.causal, c.batch, c.kv_heads, c.heads, c.mask_heads) = (Some(Mask::KeyTopk { keep }), causal, 2, mask_heads, 2 * mask_heads, mask_heads);
        c
    }

    #[test]
    fn key_topk_keeps_the_top_keys_of_each_plane() {
        let c = key_topk_case(9, true, 40, 50, 2);
        let u = key_scores(&c, 9);
        assert_eq!(u.len(), 2 * 2 * 50);
        assert!(u.iter().all(|&x| x > 0.0 && x < 1.0));
        let kept = c.kept_keys().unwrap();
        assert_eq!(kept.len(), 4);
        for (plane, keys) in kept.iter().enumerate() {
            assert_eq!(keys.len(), 9);
            assert!(keys.windows(2).all(|w| w[0] < w[1]));
            let s = &u[plane * 50..][..50];
            let least_kept = keys.iter().map(|&j| s[j as usize]).fold(f64::INFINITY, f64::min);
            assert!((0..50u32).filter(|j| !keys.contains(j)).all(|j| s[j as usize] < least_kept));
        }
        // The bias ranks as the scores do.
        let bias: Vec<f64> = u.iter().map(|&x| normal_quantile(x)).collect();
        assert_eq!(top_keys(&bias, 50, 9), kept);
        // Planes differ; keep >= seqlen_k keeps every key.
        assert_ne!(kept[0], kept[1]);
        assert_eq!(key_topk_case(60, true, 40, 50, 1).kept_keys().unwrap()[0], (0..50).collect::<Vec<u32>>());
    }

    const GOLDEN_FIRST: [&str; 3] = ["0.93457844000383006", "0.87387895794312709", "0.36180678903072205"];
    const GOLDEN_KEPT: [[u32; 5]; 2] = [[12, 42, 45, 57, 58], [17, 19, 29, 35, 53]];

    #[test]
    fn key_scores_are_the_ones_peers_py_draws() {
        // peers.py's key_topk_scores on batch 1, 2 mask heads, 64 keys, keep 5: the first
        // scores and each plane's kept keys.
        let mut c = key_topk_case(5, true, 64, 64, 2);
        c.batch = 1;
        let u = key_scores(&c, 5);
        let first: Vec<String> = u[..3].iter().map(|x| format!("{x:.17}")).collect();
        assert_eq!(first, GOLDEN_FIRST);
        assert_eq!(c.kept_keys().unwrap(), GOLDEN_KEPT);
    }

    #[test]
    fn normal_quantile_matches_known_values() {
        for (p, x) in [(0.5, 0.0), (0.975, 1.959963984540054), (0.001, -3.090232306167814), (1e-9, -5.997807015007686), (0.2, -0.8416212335729143)] {
            assert!((normal_quantile(p) - x).abs() <= 1e-8 * x.abs().max(1.0), "{p}: {} vs {x}", normal_quantile(p));
        }
        assert!((normal_quantile(0.999) + normal_quantile(0.001)).abs() < 1e-12);
    }

    #[test]
    fn key_topk_pairs_count_the_visible_kept_keys() {
        for (causal, sq, sk) in [(true, 40, 50), (true, 50, 40), (false, 40, 50), (true, 1, 50)] {
            let c = key_topk_case(7, causal, sq, sk, 2);
            let kept = c.kept_keys().unwrap();
            let brute = kept.iter().map(|keys| brute_pairs(&c, |i, j| keys.contains(&(j as u32)) && (!causal || j + sq <= i + sk))).sum::<f64>() / kept.len() as f64;
            assert_eq!(c.pairs(), brute, "causal {causal} sq {sq} sk {sk}");
        }
        // Without causal every row sees the kept keys; one query row (decoding) sees them all.
        assert_eq!(key_topk_case(7, false, 40, 50, 2).pairs(), 40.0 * 7.0);
        assert_eq!(key_topk_case(7, true, 1, 50, 2).pairs(), 7.0);
        assert_eq!(key_topk_case(7, true, 1, 50, 2).fwd_flops(), 4.0 * (2.0 * 4.0 * 64.0) * 7.0);
    }

    #[test]
    fn key_topk_bytes_count_the_kept_rows_and_one_mask_row() {
        let c = grid(false, &["gather".into()]).into_iter().find(|c| c.is_decode()).unwrap();
        // q and out 2 x 2 x 64 x 2 B; the kept 1024 rows of k and v; mask 1 B and bias 2 B a key.
        let want = 2 * (2 * 2 * 64) + 2 * (2 * 1024 * 64) + 524288 + 2 * 524288;
        assert_eq!(c.fwd_bytes(), want as f64);
    }

    #[test]
    fn select_group_has_the_issue_shapes() {
        let all = grid(false, &["select".into()]);
        let ids: Vec<&str> = all.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "select/q32768/k32768/per-query/indices",
                "select/q32768/k32768/per-query/mask",
                "select/q32768/k32768/key-side+causal/indices",
                "select/q32768/k32768/key-side+causal/mask",
                "select/q1/k32768/key-side/indices",
                "select/q1/k524288/key-side/indices",
                "select/q1/k1048576/key-side/indices",
                "select/q1/k131072/key-side/indices",
            ]
        );
        let shapes: Vec<[usize; 4]> = all.iter().map(|c| c.select_bias_shape()).collect();
        assert_eq!(
            shapes,
            [[1, 2, 32768, 32768], [1, 2, 32768, 32768], [1, 1, 1, 32768], [1, 1, 1, 32768], [1, 1, 1, 32768], [1, 1, 1, 524288], [1, 1, 1, 1 << 20], [1, 8, 1, 131072]]
        );
        for c in &all {
            assert!(c.is_select() && c.bias && !c.causal && !c.backward && c.batch == 1 && c.head_dim == 0, "{}", c.id);
            assert!(matches!(c.mask, Some(Mask::Select { keep: 1024, .. })) && !c.mask.unwrap().is_sparse(), "{}", c.id);
            // No attention: no FLOPs, and the forward's bytes are those the selection reads.
            assert_eq!((c.flops(Pass::Fwd), c.computed_flops(Pass::Fwd, 1.0)), (0.0, 0.0));
            assert_eq!(c.fwd_bytes(), c.select_bytes().unwrap().0);
        }
        // The per-query bias is 4 GiB; its index lists 256 MiB, its mask 2 GiB.
        assert_eq!(all[0].select_bytes(), Some(((4u64 << 30) as f64, (256u64 << 20) as f64)));
        assert_eq!(all[1].select_bytes(), Some(((4u64 << 30) as f64, (2u64 << 30) as f64)));
        // Key-side within causal: the 64 KiB row and the 1 GiB causal mask.
        assert_eq!(all[2].select_bytes(), Some(((64 << 10) as f64 + (1u64 << 30) as f64, (128u64 << 20) as f64)));
        assert_eq!(all[5].select_bytes(), Some(((1u64 << 20) as f64, 4096.0)));
        let quick: Vec<String> = grid(true, &["select".into()]).into_iter().map(|c| c.id).collect();
        assert_eq!(quick, ["select/q32768/k32768/per-query/indices", "select/q1/k32768/key-side/indices"]);
        let text = serde_json::to_string(&all[2]).unwrap();
        assert!(text.contains(r#""mask":{"kind":"select","keep":1024,"rows":"key_side","within_causal":true,"output":"indices"}"#), "{text}");
        assert_eq!(&serde_json::from_str::<Case>(&text).unwrap(), &all[2]);
        // The other groups have no select case.
        assert!(grid(false, &[]).iter().filter(|c| c.is_select()).all(|c| c.group == "select"));
    }

    #[test]
    fn varlen_group_has_the_issue_shapes() {
        let all = grid(false, &["varlen".into()]);
        let ids: Vec<&str> = all.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "varlen/d128/q67566/k67566/causal+varlen16",
                "varlen/d128/b8/q8192/k8192/causal",
                "varlen/d64/q67566/k67566/causal+varlen16",
                "varlen/d128/q304/k2128486/causal+varlen64",
                "varlen/d128/q304/k2128486/causal+varlen64+paged256",
                "varlen/d128/q304/k2128486/causal+keyfrac10%+varlen64+bias",
                "varlen/d128/q304/k2128486/causal+keyfrac10%+varlen64+paged256+bias",
            ]
        );
        for c in &all[..5] {
            assert!((c.heads, c.kv_heads, c.causal, c.mask, c.bias, c.mask_heads) == (32, 8, true, None, false, 1), "{}", c.id);
        }
        // The training pack: 16 sequences of 128..=8192 tokens, q lengths = k lengths, about 64K
        // tokens, the same pack at both dims; forward and backward.
        let pack = all[0].seqlens.as_ref().unwrap();
        assert_eq!(pack.lens_q.len(), 16);
        assert_eq!(pack.lens_q, pack.lens_k);
        assert!(pack.lens_q.iter().all(|n| (128..=8192).contains(n)), "{:?}", pack.lens_q);
        assert!((48 << 10..=80 << 10).contains(&all[0].seqlen_q), "{}", all[0].seqlen_q);
        assert_eq!((all[0].batch, all[0].seqlen_q, all[0].seqlen_k), (1, pack.lens_q.iter().sum(), pack.lens_k.iter().sum()));
        assert_eq!(all[2].seqlens.as_ref(), Some(pack));
        assert!(all[0].backward && all[2].backward && !all[0].is_decode() && all[0].head_dim == 128 && all[2].head_dim == 64);
        // The fixed-length reference: batch 8 of 8192, no packing.
        assert!((all[1].batch, all[1].seqlen_q, all[1].seqlen_k, all[1].head_dim, all[1].backward) == (8, 8192, 8192, 128, true) && all[1].seqlens.is_none());
        // Batched decoding: 64 sequences of 1..=8 queries over 1024..=65536 keys, forward only.
        let decode = &all[3];
        let seqs = decode.seqlens.as_ref().unwrap();
        assert!(seqs.lens_q.len() == 64 && seqs.lens_k.len() == 64);
        assert!(seqs.lens_q.iter().all(|n| (1..=8).contains(n)) && seqs.lens_k.iter().all(|n| (1024..=65536).contains(n)));
        assert!(!decode.backward && decode.is_decode());
        // Then the same batch with K/V in 256-key pages, forward only; the same bytes and FLOPs.
        let paged = &all[4];
        assert_eq!(paged.seqlens.as_ref().unwrap(), &Packed { page_size: Some(256), ..seqs.clone() });
        assert_eq!(&Case { id: decode.id.clone(), seqlens: decode.seqlens.clone(), ..paged.clone() }, decode);
        assert!(!paged.backward && paged.is_decode() && paged.fwd_bytes() == decode.fwd_bytes() && paged.fwd_flops() == decode.fwd_flops());
        assert!([0, 1, 2, 3, 5].iter().all(|&i| all[i].seqlens.as_ref().is_none_or(|p| p.page_size.is_none())));
        // Then both again with issue 18's key-side mask (10 % of each sequence's keys per kv
        // head) and bias: the same batch, forward only, decoding, with a target against the copy.
        let (masked, masked_paged) = (&all[5], &all[6]);
        assert_eq!(&Case { id: decode.id.clone(), mask: None, bias: false, mask_heads: 1, ..masked.clone() }, decode);
        assert_eq!(&Case { id: masked.id.clone(), seqlens: masked.seqlens.clone(), ..masked_paged.clone() }, masked);
        assert_eq!(masked_paged.seqlens.as_ref().unwrap().page_size, Some(256));
        for c in [masked, masked_paged] {
            assert!((c.mask, c.bias, c.mask_heads) == (Some(Mask::KeyFraction { percent: 10 }), true, 8), "{}", c.id);
            assert!(!c.backward && c.is_decode() && c.mask_rows() == 1 && !c.mask.unwrap().is_sparse(), "{}", c.id);
            assert_eq!(c.copy_time_target(), Some(1.3));
        }
        assert!(masked_paged.fwd_bytes() == masked.fwd_bytes() && masked.fwd_bytes() < decode.fwd_bytes() / 5.0);
        assert!(masked_paged.fwd_flops() == masked.fwd_flops() && masked.fwd_flops() < decode.fwd_flops() / 5.0);
        assert!(all[..5].iter().all(|c| c.copy_time_target().is_none()));
        // Every run draws the same lengths; quick packs fewer, shorter sequences.
        assert_eq!(grid(false, &["varlen".into()]), all);
        let quick = grid(true, &["varlen".into()]);
        let quick_ids: Vec<&str> = quick.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            quick_ids,
            [
                "varlen/d128/q20339/k20339/causal+varlen8",
                "varlen/d128/q77/k119835/causal+varlen16",
                "varlen/d128/q77/k119835/causal+varlen16+paged256",
                "varlen/d128/q77/k119835/causal+keyfrac10%+varlen16+bias",
                "varlen/d128/q77/k119835/causal+keyfrac10%+varlen16+paged256+bias",
            ]
        );
        assert_eq!(quick[3].seqlens, quick[1].seqlens);
        assert_eq!(quick[4].seqlens, quick[2].seqlens);
        assert!(quick[0].seqlen_q < all[0].seqlen_q && quick[1].seqlen_k < decode.seqlen_k && quick.iter().all(|c| c.seqlens.is_some()));
        assert_eq!(quick[2].seqlens.as_ref().unwrap(), &Packed { page_size: Some(256), ..quick[1].seqlens.clone().unwrap() });
        assert!(quick[0].seqlens.as_ref().unwrap().lens_q.iter().all(|n| (128..=4096).contains(n)));
        // The lengths are in cases.json; other cases write no `seqlens`, and files without it
        // still read.
        let text = serde_json::to_string(&all[0]).unwrap();
        assert!(text.contains(r#""seqlens":{"lens_q":[7501,7186,"#), "{text}");
        assert_eq!(&serde_json::from_str::<Case>(&text).unwrap(), &all[0]);
        let fixed = serde_json::to_string(&all[1]).unwrap();
        assert!(!fixed.contains("seqlens"), "{fixed}");
        assert_eq!(&serde_json::from_str::<Case>(&fixed).unwrap(), &all[1]);
        // Only the paged case writes a page size.
        assert!(!text.contains("page_size") && !serde_json::to_string(decode).unwrap().contains("page_size"));
        let text = serde_json::to_string(paged).unwrap();
        assert!(text.contains(r#"],"page_size":256}"#), "{text}");
        assert_eq!(&serde_json::from_str::<Case>(&text).unwrap(), paged);
        let text = serde_json::to_string(masked_paged).unwrap();
        assert!(text.contains(r#""mask":{"kind":"key_fraction","percent":10}"#), "{text}");
        assert_eq!(&serde_json::from_str::<Case>(&text).unwrap(), masked_paged);
    }

    /// A small packed `key_fraction` case: 4 sequences, 2 kv heads (one mask plane each).
    fn key_fraction_case(lens_q: Vec<usize>, lens_k: Vec<usize>, percent: usize) -> Case {
        let mut c = packed(16, lens_q, lens_k, false);
        (c.heads, c.kv_heads) = (4, 2);
        key_fraction(&c, percent)
    }

    #[test]
    fn key_fraction_keeps_the_top_share_of_each_sequence_and_head() {
        let lens_k = [95, 1, 40, 0, 300];
        let c = key_fraction_case(vec![3, 1, 2, 0, 8], lens_k.to_vec(), 10);
        assert_eq!((c.mask_heads, c.variant().as_str()), (2, "causal+keyfrac10%+varlen5+bias"));
        let u = key_fraction_scores(&c, 10).unwrap();
        assert_eq!(u.len(), 436 * 2);
        assert!(u.iter().all(|&x| x > 0.0 && x < 1.0));
        let kept = c.kept_keys().unwrap();
        assert_eq!(kept.len(), 5 * 2);
        // ceil(len * 10 %) keys of each (sequence, head): 9.5 -> 10, 0.1 -> 1, 4, 0, 30.
        assert_eq!(lens_k.map(|n| fraction_kept(n, 10)), [10, 1, 4, 0, 30]);
        let mut start = 0;
        for (b, &len) in lens_k.iter().enumerate() {
            for h in 0..2 {
                let keys = &kept[b * 2 + h];
                assert_eq!(keys.len(), fraction_kept(len, 10), "sequence {b} head {h}");
                assert!(keys.windows(2).all(|w| w[0] < w[1]) && keys.iter().all(|&j| (j as usize) < len));
                // Scores [total_k, mask_heads]: this plane's are column h of the sequence's rows.
                let s: Vec<f64> = (0..len).map(|j| u[(start + j) * 2 + h]).collect();
                let least_kept = keys.iter().map(|&j| s[j as usize]).fold(f64::INFINITY, f64::min);
                assert!((0..len as u32).filter(|j| !keys.contains(j)).all(|j| s[j as usize] < least_kept));
                // The bias ranks as the scores do.
                let bias: Vec<f64> = s.iter().map(|&x| normal_quantile(x)).collect();
                assert!(len == 0 || top_keys(&bias, len, keys.len()) == [keys.clone()]);
            }
            start += len;
        }
        // The heads keep their own keys; every call draws the same.
        assert_ne!(kept[8], kept[9]);
        assert_eq!(key_fraction_scores(&c, 10).unwrap(), u);
        assert_eq!(c.kept_keys().unwrap(), kept);
        // A paged twin keeps the same keys; another share others; a fixed-length case has none.
        assert_eq!(paged(&c, 64).kept_keys().unwrap(), kept);
        assert_ne!(key_fraction_case(vec![3, 1, 2, 0, 8], lens_k.to_vec(), 20).kept_keys().unwrap()[8][..30], kept[8][..]);
        assert_eq!(Case { seqlens: None, ..c.clone() }.kept_keys(), None);
        assert_eq!(fraction_kept(1000, 100), 1000);
    }

    #[test]
    fn key_fraction_scores_are_the_ones_peers_py_draws() {
        // peers.py's key_fraction_scores and key_fraction_inputs on this case: the first scores
        // and the kept keys of the first sequence (95 keys) and the third (40), per mask head.
        let c = key_fraction_case(vec![3, 1, 2, 0, 8], vec![95, 1, 40, 0, 300], 10);
        let first: Vec<String> = key_fraction_scores(&c, 10).unwrap()[..3].iter().map(|x| format!("{x:.17}")).collect();
        assert_eq!(first, ["0.46640388745768846", "0.38616992391373783", "0.21194328424341136"]);
        let kept = c.kept_keys().unwrap();
        assert_eq!(kept[0], [6, 11, 23, 32, 47, 54, 61, 77, 84, 92]);
        assert_eq!(kept[1], [3, 15, 20, 27, 30, 56, 71, 79, 88, 94]);
        assert_eq!((&kept[4][..], &kept[5][..]), (&[1, 18, 32, 33][..], &[7, 26, 33, 35][..]));
    }

    #[test]
    fn key_fraction_pairs_count_each_sequences_visible_kept_keys() {
        let c = key_fraction_case(vec![3, 1, 2, 0, 8], vec![95, 1, 40, 0, 300], 10);
        let kept = c.kept_keys().unwrap();
        let p = c.seqlens.as_ref().unwrap();
        // Query i of (sq, sk) sees kept keys j <= i + sk - sq; averaged over the mask heads.
        let brute: f64 = (0..5)
            .map(|b| {
                let (sq, sk) = (p.lens_q[b], p.lens_k[b]);
                let seen = |keys: &Vec<u32>| (0..sq).map(|i| keys.iter().filter(|&&j| j as usize + sq <= i + sk).count()).sum::<usize>();
                (seen(&kept[b * 2]) + seen(&kept[b * 2 + 1])) as f64 / 2.0
            })
            .sum();
        assert_eq!(c.pairs(), brute);
        assert_eq!(c.fwd_flops(), 4.0 * (4 * 16) as f64 * brute);
        assert!(brute > 0.0 && brute < Case { mask: None, bias: false, mask_heads: 1, ..c.clone() }.pairs() / 5.0);
    }

    #[test]
    fn key_fraction_bytes_count_the_kept_rows_and_the_key_side_mask_and_bias() {
        let c = grid(false, &["varlen".into()]).into_iter().find(|c| c.mask.is_some()).unwrap();
        let p = c.seqlens.as_ref().unwrap();
        let (total_q, total_k) = (p.lens_q.iter().sum::<usize>(), p.lens_k.iter().sum::<usize>());
        let kept: usize = p.lens_k.iter().map(|n| n.div_ceil(10)).sum();
        assert_eq!(c.kept_rows(), Some(kept));
        // q and out (2 B an element); each kv head's kept rows of k and v; mask 1 B and bias 2 B
        // per packed key and mask head.
        let want = 2 * (2 * total_q * 32 * 128) + 2 * (2 * kept * 8 * 128) + total_k * 8 + 2 * total_k * 8;
        assert_eq!(c.fwd_bytes(), want as f64);
    }

    #[test]
    fn page_table_places_every_sequence_in_its_own_pages() {
        let p = Packed { lens_q: vec![1, 2, 1, 3], lens_k: vec![300, 0, 64, 513], page_size: Some(64) };
        let layout = page_table(&p).unwrap();
        // 5 + 0 + 1 + 9 pages; the longest sequence needs 9.
        assert_eq!((layout.page_size, layout.num_pages, layout.max_pages, layout.table.len()), (64, 15, 9, 36));
        let mut used: Vec<i32> = Vec::new();
        for (b, &len) in p.lens_k.iter().enumerate() {
            let row = &layout.table[b * 9..][..9];
            let need = len.div_ceil(64);
            assert!(row[..need].iter().all(|&page| (0..15).contains(&page)) && row[need..].iter().all(|&page| page == -1), "{row:?}");
            used.extend(&row[..need]);
        }
        // Every page once, in a shuffled order.
        used.sort();
        assert_eq!(used, (0..15).collect::<Vec<i32>>());
        assert_ne!(layout.table[..5], [0, 1, 2, 3, 4]);
        assert_eq!(page_table(&p), Some(layout));
        assert_eq!(page_table(&Packed { page_size: None, ..p }), None);
        let order = page_order(1000, 256);
        let mut sorted = order.clone();
        sorted.sort();
        assert!(sorted == (0..1000).collect::<Vec<_>>() && order != sorted && order == page_order(1000, 256));
    }

    #[test]
    fn packed_lengths_are_deterministic_and_in_range() {
        let a = packed_lengths(1000, 3..=9);
        assert_eq!(a, packed_lengths(1000, 3..=9));
        assert!(a.iter().all(|n| (3..=9).contains(n)));
        assert!((3..=9).all(|n| a.contains(&n)));
        assert_ne!(packed_lengths(16, 128..=8192), packed_lengths(16, 128..=8191));
    }

    #[test]
    fn packed_pairs_sum_each_sequence_bottom_right() {
        let mut c = packed(16, vec![3, 7, 1, 0], vec![5, 7, 9, 4], true);
        (c.heads, c.kv_heads) = (4, 2);
        assert_eq!((c.batch, c.seqlen_q, c.seqlen_k, c.variant().as_str()), (1, 11, 25, "causal+varlen4"));
        // Each sequence by brute force: query i of (sq, sk) sees keys j <= i + sk - sq.
        let brute: usize = [(3, 5), (7, 7), (1, 9), (0, 4)].iter().map(|&(sq, sk)| (0..sq).map(|i| (0..sk).filter(|&j| j + sq <= i + sk).count()).sum::<usize>()).sum();
        assert_eq!(brute, 12 + 28 + 9);
        assert_eq!(c.pairs(), brute as f64);
        assert_eq!(c.fwd_flops(), 4.0 * 4.0 * 16.0 * brute as f64);
        assert_eq!(c.computed_flops(Pass::Fwd, 1.0), 4.0 * 4.0 * 16.0 * (15 + 49 + 9) as f64);
        assert_eq!(c.sequences().unwrap().iter().map(|s| (s.batch, s.seqlen_q, s.seqlen_k)).collect::<Vec<_>>(), [(1, 3, 5), (1, 7, 7), (1, 1, 9), (1, 0, 4)]);
        // Packed q, k, v and out, 2 B an element.
        assert_eq!(c.fwd_bytes(), (2 * 2 * 11 * 4 * 16 + 2 * 2 * 25 * 2 * 16) as f64);
        // At most DECODE_ROWS queries a sequence: decoding.
        assert!(c.is_decode() && packed(16, vec![16, 1], vec![50, 60], false).is_decode());
        assert!(!packed(16, vec![17, 1], vec![50, 60], false).is_decode());
        assert!(grid(false, &[]).iter().filter(|c| c.seqlens.is_some()).all(|c| c.group == "varlen"));
    }

    #[test]
    fn json_round_trip_matches_schema_names() {
        let c = &grid(true, &["llm".into()])[3];
        let text = serde_json::to_string(c).unwrap();
        assert!(text.contains(r#""mask":{"kind":"blocks","block":128,"density":0.5}"#), "{text}");
        assert_eq!(&serde_json::from_str::<Case>(&text).unwrap(), c);
    }
}
