//! Decoding on the GPU (`dmattn_abi::DecodeParams`): which calls the decoding kernel takes and
//! how their keys are split, as a plain value computed from the problem and the GPU's size
//! ([`decode_plan`], tested on the CPU), and its launch.
use super::launch::{Launch, launch};
use super::PreparedMask;
use crate::dtype::DType;
use crate::error::Result;
use crate::problem::Problem;
use crate::tensor::Tensor;
use dmattn_abi::{DECODE_HEAD_DIMS, DECODE_MASK_BYTES_DIMS, DECODE_ROWS, DECODE_SPLIT_ALIGN, DECODE_THREADS, DecodeParams, DeviceElem, FwdParams, Band, View4, decode_smem_bytes, names};

/// What the plan needs to know of a call's mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MaskShape {
    /// It has no query dimension (a key-side mask).
    pub key_side: bool,
    /// Its heads (1, kv_heads or heads).
    pub heads: usize,
    /// It has block parts (block classes that hide blocks its bits show).
    pub blocks: bool,
    /// It was compacted into key lists for gather attention (a fixed-length call's key-side mask
    /// keeping at most half the keys).
    pub gathered: bool,
}

impl MaskShape {
    pub fn of(m: &PreparedMask) -> Self {
        // A gathered mask, or one left as key-side bytes, is key-side by construction;
        // otherwise its bits say.
        let key_side = m.gather.is_some() || m.key_bytes.is_some() || m.bits.stride[2] == 0;
        MaskShape { key_side, heads: m.planes[1], blocks: m.blocks, gathered: m.gather.is_some() }
    }
}

/// How a decoding forward runs: the kernel, its grid `(kv_heads, splits, batch)`, and the keys
/// each split scans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DecodePlan {
    /// The element type the operands were checked to be (the combine pass's too).
    pub elem: DeviceElem,
    pub kernel: String,
    pub grid: (u32, u32, u32),
    pub splits: u32,
    pub split_keys: u32,
    pub smem_bytes: u32,
    /// A packed batch of two or more sequences and more CTAs than SMs: its CTAs run heaviest
    /// first (`packed::decode_order`), the sequences' lengths differing.
    pub ordered: bool,
    /// The kernel reads a key-side bool mask as it is (`DecodeParams::mask_bytes`); otherwise a
    /// mask left so is prepared first.
    pub mask_bytes: bool,
}

/// Whether a fixed-length call's bool mask `m` is left as key-side bytes
/// (`prepare::fixed_key_bytes`) rather than prepared: a query-broadcast mask over every key of
/// a call the decoding kernel takes, which reads the bytes itself. Compacting it into key lists
/// for gather attention costs two launches before the call's own, which on one query over
/// 512K keys were most of the call's time (the host's, each launch 3.5-5 us).
pub(crate) fn reads_key_bytes(p: &Problem, m: &Tensor) -> bool {
    let s = m.shape();
    let key_side = p.seqs.is_none() && m.dtype() == DType::Bool && s.len() == 4 && s[2] == 1 && s[3] == p.dims.seqlen_k && s[3] > 1;
    key_side && reads_mask_bytes(p) && takes(p, Some(MaskShape { key_side, heads: s[1], blocks: false, gathered: false }))
}

/// Whether the decoding kernel reads a key-side mask's bytes itself at `p`'s head dim
/// (`DecodeParams::mask_bytes`), rather than its packed bits.
fn reads_mask_bytes(p: &Problem) -> bool {
    p.dims.head_dim as u32 <= DECODE_MASK_BYTES_DIMS
}

/// Whether the decoding kernel takes `p` with a mask of shape `mask` (see [`decode_plan`]).
fn takes(p: &Problem, mask: Option<MaskShape>) -> bool {
    let d = p.dims;
    let group_heads = |h: usize| h == 1 || h == d.kv_heads || d.kv_heads == d.heads;
    DECODE_HEAD_DIMS.contains(&(d.head_dim as u32))
        && d.kv_group() * d.seqlen_q <= DECODE_ROWS as usize
        && (p.band.left == Band::NONE || p.band.sinks == 0)
        && p.band.compress == 0
        && mask.is_none_or(|m| m.key_side && !m.blocks && !m.gathered && group_heads(m.heads))
        && p.bias.is_none_or(|[_, heads, rows, _]| rows == 1 && group_heads(heads))
        && d.batch <= u16::MAX as usize
}

/// Splits at most (the combine pass's limit).
const MAX_SPLITS: usize = 128;

/// The decoding plan for `p` on a GPU of `sms` SMs, or `None` where the decoding kernel does not
/// take the call: a kv group's query heads times the longest sequence's queries must fit one
/// 64-row tile; a mask, if any, key-side with 1 or kv_heads heads and no block parts, and not
/// compacted into key lists already (gather attention runs those; a fixed-length call's mask
/// that this kernel takes is left as bytes for it, [`reads_key_bytes`]); a bias, if
/// any, without a query dimension and with 1 or kv_heads heads; a band without sinks or
/// compression. (Every such call is one the general forward would run on tiles mostly of rows
/// that do not exist, reading each K and V row once per query head.)
///
/// Keys are split so that the grid's CTAs number about sixteen per SM (eight with a mask, whose
/// CTAs read a fraction of their keys) counting every sequence's and kv head's keys, each split
/// whole scan rounds, at most [`MAX_SPLITS`] per sequence. A packed batch's CTAs run in a
/// work order, heaviest first.
pub(crate) fn decode_plan(sms: u32, p: &Problem, elem: DeviceElem, mask: Option<MaskShape>) -> Option<DecodePlan> {
    if !takes(p, mask) {
        return None;
    }
    let d = p.dims;
    let keys = p.seqs.as_ref().map_or(d.batch * d.seqlen_k, |s| s.total_k()) * d.kv_heads;
    let align = DECODE_SPLIT_ALIGN as usize;
    // H100, the 64-sequence decode batch (h32 hk8 d128, 2.1M keys, ms at 2 / 4 / 8 / 16 CTAs an
    // SM): unmasked 3.90 / 3.40 / 3.09 / 2.95 (copy speed at 16); with a 10 % key-side mask
    // 0.568 / 0.518 / 0.487 / 0.497, whose CTAs each keep a tenth of their keys.
    let per_sm = FORCED_CTAS_PER_SM.with(|f| f.get()).unwrap_or(if mask.is_some() { 8 } else { 16 });
    let per_cta = keys.div_ceil(per_sm * sms as usize).next_multiple_of(align);
    let longest = d.seqlen_k.max(1);
    let split_keys = per_cta.max(longest.div_ceil(MAX_SPLITS).next_multiple_of(align)).max(align);
    let splits = longest.div_ceil(split_keys);
    let kernel = format!("{}{}_d{}{}", names::DECODE_PREFIX, elem.name(), d.head_dim, if p.pages.is_some() { names::PAGED_SUFFIX } else { "" });
    Some(DecodePlan {
        elem,
        kernel,
        grid: (d.kv_heads as u32, splits as u32, d.batch as u32),
        splits: splits as u32,
        split_keys: split_keys as u32,
        smem_bytes: decode_smem_bytes(d.head_dim as u32),
        ordered: p.seqs.is_some() && d.batch > 1 && FORCED_ORDER.with(|f| f.get()).unwrap_or(d.kv_heads * splits * d.batch > sms as usize),
        mask_bytes: reads_mask_bytes(p),
    })
}

std::thread_local! {
    static FORCED_CTAS_PER_SM: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    static FORCED_ORDER: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Testing hook: while `Some(n)`, decoding plans this thread makes split keys for about `n`
/// CTAs an SM rather than the plan's 16 (8 with a mask); `None`: the plan's own choice.
#[doc(hidden)]
pub fn force_decode_ctas_per_sm(n: Option<usize>) {
    FORCED_CTAS_PER_SM.with(|f| f.set(n.filter(|&n| n > 0)));
}

/// Testing hook: while `Some(on)`, the decoding plans this thread makes for packed batches of
/// two or more sequences run their CTAs heaviest first (`on`) or in grid order, however many
/// CTAs they have; `None`: the plan's own choice (ordered past one CTA an SM).
#[doc(hidden)]
pub fn force_decode_order(on: Option<bool>) {
    FORCED_ORDER.with(|f| f.set(on));
}

/// Launches `plan` with the forward's parameters `fwd` (its outputs, or with splits the
/// partials', already in them) and a key-side mask's bytes (`DecodeParams::mask_bytes`, absent
/// where the mask, if any, is `fwd.mask_bits`).
pub(crate) fn launch_decode(dev: &crate::device::CudaDevice, plan: &DecodePlan, fwd: FwdParams, mask_bytes: View4) -> Result<()> {
    let params = DecodeParams { fwd, split_keys: plan.split_keys, _pad: 0, mask_bytes };
    launch(dev, &Launch::kernel(&plan.kernel, plan.grid, DECODE_THREADS, plan.smem_bytes), params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::problem::{Dims, KvPages, PackedLayout};
    use crate::{Device, PageTable, SeqLens};

    fn dims(batch: usize, heads: usize, kv_heads: usize, sq: usize, sk: usize, head_dim: usize) -> Dims {
        Dims { batch, seqlen_q: sq, seqlen_k: sk, heads, kv_heads, head_dim }
    }

    fn problem(d: Dims) -> Problem {
        Problem {
            dims: d,
            dtype: DType::BF16,
            mask: None,
            bias: None,
            band: Band::CAUSAL,
            scale: 0.125,
            softcap: 0.0,
            deterministic: false,
            seqs: None,
            packed_bias: None,
            packed_mask: None,
            pages: None,
        }
    }

    const KEY_SIDE: MaskShape = MaskShape { key_side: true, heads: 8, blocks: false, gathered: false };

    /// A packed decoding batch (h32 hk8, up to 8 queries a sequence, a key-side mask and bias per
    /// kv head, paged): the decoding kernel over (kv heads, splits, sequences), each split whole
    /// scan rounds, enough splits for the GPU and every key of the longest sequence covered.
    #[test]
    fn packed_decoding_batches_take_the_decoding_kernel() {
        let lens_k: Vec<usize> = (0..64).map(|i| 1024 + i * 1000).collect();
        let lens_q: Vec<usize> = (0..64).map(|i| 1 + i % 8).collect();
        let seqs = SeqLens::from_lengths(&lens_q, &lens_k, &Device::Cpu).unwrap();
        let longest = *lens_k.iter().max().unwrap();
        let d = dims(64, 32, 8, 8, longest, 128);
        let table = PageTable::new(&vec![0; 64 * longest.div_ceil(256)], 64, &Device::Cpu).unwrap();
        let p = Problem {
            seqs: Some(seqs.clone()),
            bias: Some([1, 8, 1, seqs.total_k()]),
            packed_bias: Some(PackedLayout::KeySide),
            mask: Some([1, 8]),
            packed_mask: Some(PackedLayout::KeySide),
            pages: Some(KvPages { table, page_size: 256 }),
            ..problem(d)
        };
        let plan = decode_plan(132, &p, DeviceElem::Bf16, Some(KEY_SIDE)).unwrap();
        assert_eq!(plan.kernel, "dmattn_decode_bf16_d128_paged");
        assert_eq!((plan.grid.0, plan.grid.2), (8, 64));
        assert_eq!(plan.grid.1, plan.splits);
        assert!(plan.split_keys % DECODE_SPLIT_ALIGN == 0 && (plan.splits * plan.split_keys) as usize >= longest);
        assert!((plan.splits as usize) < longest.div_ceil(plan.split_keys as usize) + 1);
        // About eight CTAs' worth of keys per SM: every sequence's and kv head's keys over the
        // split size.
        let ctas: usize = lens_k.iter().map(|&k| k.div_ceil(plan.split_keys as usize)).sum::<usize>() * 8;
        assert!((4 * 132..=16 * 132).contains(&ctas), "{ctas} CTAs");
        assert_eq!(plan.smem_bytes, decode_smem_bytes(128));
        assert!(plan.ordered, "a packed batch of many CTAs runs heaviest first");
        // Its key-side mask is read as the caller gave it, with no pack launch, up to d128.
        assert!(plan.mask_bytes);
        let wide = Problem { dims: Dims { head_dim: 192, ..d }, ..p.clone() };
        assert!(!decode_plan(132, &wide, DeviceElem::Bf16, Some(KEY_SIDE)).unwrap().mask_bytes);
        // Contiguous K/V, no mask or bias: the plain kernel, about sixteen CTAs an SM.
        let plain = Problem { pages: None, mask: None, bias: None, packed_mask: None, packed_bias: None, ..p.clone() };
        let plain_plan = decode_plan(132, &plain, DeviceElem::F16, None).unwrap();
        assert_eq!((plain_plan.kernel.as_str(), plain_plan.grid.0, plain_plan.grid.2), ("dmattn_decode_f16_d128", 8, 64));
        let plain_ctas: usize = lens_k.iter().map(|&k| k.div_ceil(plain_plan.split_keys as usize)).sum::<usize>() * 8;
        assert!((12 * 132..=24 * 132).contains(&plain_ctas), "{plain_ctas} CTAs");
    }

    /// One query over half a million keys (Flash-DMA's decoding): 128 splits of whole rounds.
    #[test]
    fn long_single_sequences_split_128_ways() {
        let p = problem(dims(1, 2, 1, 1, 1 << 19, 64));
        let plan = decode_plan(132, &p, DeviceElem::Bf16, Some(MaskShape { heads: 1, ..KEY_SIDE })).unwrap();
        assert_eq!((plan.grid, plan.splits, plan.split_keys), ((1, 128, 1), 128, 4096));
        // A short one: one split.
        let short = decode_plan(132, &problem(dims(1, 2, 1, 1, 700, 64)), DeviceElem::Bf16, None).unwrap();
        assert_eq!((short.splits, short.split_keys), (1, 1024));
        // A fixed-length batch's CTAs are alike: grid order.
        assert!(!plan.ordered && !decode_plan(132, &problem(dims(64, 32, 8, 1, 1 << 16, 128)), DeviceElem::Bf16, None).unwrap().ordered);
    }

    /// A fixed-length call's bool mask is left as bytes exactly where the decoding kernel reads
    /// it: key-side over every key, the call decoding-shaped, head dims to 128.
    #[test]
    fn fixed_key_side_masks_left_as_bytes_for_decoding_calls() {
        let cpu = Device::Cpu;
        let mask = |shape: &[usize], dtype: DType| Tensor::from_fn(shape, dtype, &cpu, |i| (i % 3) as f64).unwrap();
        let p = problem(dims(2, 4, 2, 3, 5000, 64));
        assert!(reads_key_bytes(&p, &mask(&[1, 1, 1, 5000], DType::Bool)));
        assert!(reads_key_bytes(&p, &mask(&[2, 2, 1, 5000], DType::Bool)));
        // A query dimension, a broadcast key dimension, bits, or a head per query head under GQA.
        for (shape, dtype) in [([2, 2, 3, 5000], DType::Bool), ([2, 2, 1, 1], DType::Bool), ([1, 1, 1, 625], DType::U8), ([1, 4, 1, 5000], DType::Bool)] {
            assert!(!reads_key_bytes(&p, &mask(&shape, dtype)), "{shape:?} {dtype:?}");
        }
        let m = mask(&[1, 1, 1, 5000], DType::Bool);
        // Not decoding-shaped (a group of 2 heads times 33 queries), or a head dim whose kernel
        // takes packed bits.
        assert!(!reads_key_bytes(&problem(dims(2, 4, 2, 33, 5000, 64)), &m));
        assert!(!reads_key_bytes(&problem(dims(2, 4, 2, 3, 5000, 192)), &m));
        // A packed batch's masks are laid out by their own rule (`key_side_bytes`).
        let seqs = SeqLens::from_lengths(&[3, 3], &[5000, 5000], &cpu).unwrap();
        assert!(!reads_key_bytes(&Problem { seqs: Some(seqs), ..p }, &m));
    }

    /// What the decoding kernel does not take: more rows than a tile, sinks, compression, masks
    /// and biases with a query dimension or a head of their own per query head under GQA, block
    /// parts, head dims without a kernel.
    #[test]
    fn calls_the_decoding_kernel_does_not_take() {
        let p = problem(dims(2, 8, 2, 16, 5000, 64));
        assert!(decode_plan(132, &p, DeviceElem::Bf16, None).is_some());
        let rejected = |p: &Problem, mask: Option<MaskShape>| decode_plan(132, p, DeviceElem::Bf16, mask).is_none();
        assert!(rejected(&problem(dims(2, 8, 2, 17, 5000, 64)), None));
        assert!(rejected(&Problem { band: Band { left: 10, sinks: 4, ..Band::CAUSAL }, ..p.clone() }, None));
        assert!(!rejected(&Problem { band: Band { left: 10, ..Band::CAUSAL }, ..p.clone() }, None));
        assert!(rejected(&Problem { band: Band { compress: 4, ..Band::ALL }, ..p.clone() }, None));
        assert!(rejected(&p, Some(MaskShape { key_side: false, heads: 1, blocks: false, gathered: false })));
        assert!(rejected(&p, Some(MaskShape { key_side: true, heads: 2, blocks: true, gathered: false })));
        assert!(rejected(&p, Some(MaskShape { key_side: true, heads: 8, blocks: false, gathered: false })));
        assert!(rejected(&p, Some(MaskShape { key_side: true, heads: 2, blocks: false, gathered: true })));
        assert!(!rejected(&p, Some(MaskShape { key_side: true, heads: 2, blocks: false, gathered: false })));
        assert!(!rejected(&p, Some(MaskShape { key_side: true, heads: 1, blocks: false, gathered: false })));
        assert!(rejected(&Problem { bias: Some([2, 2, 16, 5000]), ..p.clone() }, None));
        assert!(rejected(&Problem { bias: Some([1, 8, 1, 5000]), ..p.clone() }, None));
        assert!(!rejected(&Problem { bias: Some([2, 2, 1, 5000]), ..p.clone() }, None));
        // Without GQA, one head per query head is a kv head's.
        let mha = problem(dims(2, 4, 4, 16, 5000, 64));
        assert!(!rejected(&Problem { bias: Some([1, 4, 1, 5000]), ..mha.clone() }, Some(MaskShape { key_side: true, heads: 4, blocks: false, gathered: false })));
        assert!(rejected(&problem(dims(2, 8, 2, 4, 5000, 80)), None));
    }
}
