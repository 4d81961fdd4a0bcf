//! One sparse-mask type. A [`SparseMask`] describes which scores are visible: parametric bands
//! (causal, sliding windows, compressed causal, sink keys: no storage), block masks (a block
//! bitset, BCSR, or a bitset built on the device from a dense mask) and score masks (dense bool,
//! bit-packed), ANDed together. [`SparseMask::prepare`] turns it into a [`PreparedMask`] for one
//! device and sequence lengths, once ([`SparseMask::prepare_packed`] for a packed batch's
//! sequences); forward, backward and later calls (layers sharing a mask) read the prepared form
//! without preparing it again.
//!
//! On the GPU the prepared form is what the kernels read: a class per 64x64 block (empty: never
//! visited; full: no per-score work; partial) and, where a score mask is given, one bit per score.
//! The band is applied analytically by every kernel (tile ranges and per-score tests), so it
//! costs no memory and turns whole tiles into skipped or full ones. On the CPU the prepared form
//! is the equivalent dense mask.
use crate::cuda;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::problem::PackedLayout;
use crate::seqlens::SeqLens;
use crate::tensor::Tensor;
use dmattn_abi::{Band, ListsBand};
use std::ops::Range;
use std::sync::Arc;

/// Which scores of an attention call are visible. Build one from the constructors, combine with
/// [`SparseMask::and`] (a score is visible iff every part shows it), then
/// [`SparseMask::prepare`] it and pass the result to [`crate::Attention::sparse_mask`].
///
/// Mask tensors broadcast over batch and heads as the dense mask does: their first two dims are
/// `{1|batch}` and `{1|kv_heads|heads}` (parts of one mask with more than one head must agree on
/// the count; likewise for batch). On the GPU a mask holds at most one score mask (dense or
/// bit-packed; block masks and bands without limit): AND two score masks before wrapping them.
///
/// ```
/// # fn main() -> dmattn::Result<()> {
/// use dmattn::{attention, DType, Device, SparseMask, Tensor};
/// let dev = Device::Cpu;
/// let q = Tensor::from_fn(&[1, 300, 2, 16], DType::F32, &dev, |i| (i as f64 * 0.37).sin())?;
/// let kv = Tensor::from_fn(&[1, 300, 2, 16], DType::F32, &dev, |i| (i as f64 * 0.11).cos())?;
/// // Causal with a left window of 128 keys and 4 sink keys, prepared once, used by two calls.
/// let mask = SparseMask::causal_window(128).with_sinks(4).prepare(300, 300)?;
/// let a = attention(&q, &kv, &kv).sparse_mask(&mask).forward()?;
/// let b = attention(&q, &kv, &kv).sparse_mask(&mask).softcap(30.0).forward()?;
/// assert!(mask.memory_bytes() == 0 && mask.estimated_speedup()? > 1.0);
/// # let _ = (a, b);
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct SparseMask {
    band: BandSpec,
    parts: Vec<Part>,
}

/// The parametric part as given (checked when prepared).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct BandSpec {
    left: Option<usize>,
    right: Option<usize>,
    sinks: usize,
    compress: Option<usize>,
}

#[derive(Clone)]
pub(crate) enum Part {
    /// Bool `[{1|b}, {1|hk|h}, {1|sq}, {1|sk}]`.
    Dense(Tensor),
    /// U8 `[{1|b}, {1|hk|h}, {1|sq}, ceil(sk / 8)]`, key `j` at bit `j % 8` of byte `j / 8`.
    Packed(Tensor),
    /// Bool `[{1|b}, {1|hk|h}, ceil(sq / block), ceil(sk / block)]`.
    Bitset { kept: Tensor, block: usize },
    /// I32 row pointers `[{1|b}, {1|hk|h}, ceil(sq / block) + 1]` and block indices `[.., .., nnz]`.
    Bcsr { row_ptr: Tensor, col_idx: Tensor, block: usize },
    /// A bitset of `block`-sized blocks, kept where any score of the dense bool mask is.
    DenseBlocks { mask: Tensor, block: usize },
    /// I32 `[{1|b}, {1|hk|h}, {1|sq}, w]` key indices, -1 = padding.
    Indices(Tensor),
}

impl SparseMask {
    /// Every score visible (the identity of [`SparseMask::and`]).
    pub fn all() -> Self {
        Self::default()
    }

    /// Bottom-right aligned causal: key `j` is visible to query `i` iff `j <= i + seqlen_k -
    /// seqlen_q` (as [`crate::Attention::causal`]).
    pub fn causal() -> Self {
        Self::window(None, Some(0))
    }

    /// A sliding window around the bottom-right diagonal, FlashAttention's `window_size`: key `j`
    /// is visible to query `i` iff `i + sk - sq - left <= j <= i + sk - sq + right`; `None`
    /// leaves a side unbounded (FlashAttention's -1).
    pub fn window(left: Option<usize>, right: Option<usize>) -> Self {
        SparseMask { band: BandSpec { left, right, ..BandSpec::default() }, parts: Vec::new() }
    }

    /// Causal with a left window: each query sees itself and the `left` keys before its diagonal.
    pub fn causal_window(left: usize) -> Self {
        Self::window(Some(left), Some(0))
    }

    /// Compressed causal (FlashAttention PR 2418's `compress_factor`): key `j` is visible to query
    /// `i` iff `j * cf <= i`, for keys that each stand for `cf` positions. As in that PR there is
    /// no `seqlen_k - seqlen_q` offset: the diagonal is `floor(i / cf)`, and windows and sinks
    /// combined with it are taken around that diagonal. `cf` must be at least 1.
    pub fn compress_causal(cf: usize) -> Self {
        SparseMask { band: BandSpec { right: Some(0), compress: Some(cf), ..BandSpec::default() }, parts: Vec::new() }
    }

    /// Keeps keys `0..n` visible past the left edge of the window (attention sinks, as
    /// FlashAttention 4 and flash-sparse-attention offer); the right edge (causal) still applies.
    /// Without a left window every key left of the diagonal is visible already.
    pub fn with_sinks(mut self, n: usize) -> Self {
        self.band.sinks = n;
        self
    }

    /// A dense boolean mask `[{1|b}, {1|hk|h}, {1|sq}, {1|sk}]`, false hiding a score (what
    /// [`crate::Attention::mask`] takes). On the GPU it is packed to one bit per score.
    pub fn dense(mask: &Tensor) -> Self {
        Self::part(Part::Dense(mask.clone()))
    }

    /// A bit-packed score mask, U8 `[{1|b}, {1|hk|h}, {1|sq}, ceil(sk / 8)]`: key `j` of a row is
    /// bit `j % 8` of the row's byte `j / 8` (NumPy's `packbits(..., bitorder="little")`); bits
    /// past `sk` are ignored. Bytes must be contiguous along the keys.
    pub fn packed_bits(bits: &Tensor) -> Self {
        Self::part(Part::Packed(bits.clone()))
    }

    /// A block bitset: Bool `[{1|b}, {1|hk|h}, ceil(sq / block), ceil(sk / block)]`, one flag per
    /// (query block, key block), `block` 64 or 128. Kept blocks are visible (full), others hidden.
    pub fn block_bitset(kept: &Tensor, block: usize) -> Self {
        Self::part(Part::Bitset { kept: kept.clone(), block })
    }

    /// A block bitset built on the mask's device from a dense bool mask: a `block`-sized block
    /// (64 or 128) is kept, entirely, if any of its scores is. Coarser than the dense mask (its
    /// kept blocks are full) and far smaller.
    pub fn dense_blocks(mask: &Tensor, block: usize) -> Self {
        Self::part(Part::DenseBlocks { mask: mask.clone(), block })
    }

    /// Block compressed sparse rows: for each plane `[{1|b}, {1|hk|h}]`, query block `r`'s kept
    /// key blocks are `col_idx[row_ptr[r]..row_ptr[r + 1]]`. I32 `row_ptr`
    /// `[.., .., ceil(sq / block) + 1]` (starting at 0, non-decreasing, at most `nnz`) and
    /// `col_idx` `[.., .., nnz]` (each in `0..ceil(sk / block)`), with the same plane dims; `block`
    /// 64 or 128. Indices of a row may come in any order, and a repeated index means what it
    /// would once. Preparing reads them on the host (to check them): it waits for the device.
    pub fn bcsr(row_ptr: &Tensor, col_idx: &Tensor, block: usize) -> Self {
        Self::part(Part::Bcsr { row_ptr: row_ptr.clone(), col_idx: col_idx.clone(), block })
    }

    /// Index lists (`attn_indices`): I32 `[{1|b}, {1|hk|h}, {1|sq}, w]`, each row listing the keys
    /// its queries see, in any order, -1 as padding. A key listed twice in a row is seen once (the
    /// row shows the set of its keys). Entries must be -1 or in `0..seqlen_k` (a typed error
    /// otherwise, found when prepared: on the GPU that waits for the device). Lists without a
    /// query dimension (`[.., .., 1, w]`, the same keys for every query) run as gather attention
    /// where they keep at most half the keys; lists per query as a bit-packed score mask, whose
    /// forward runs over each query's own keys where that pays (see
    /// [`PreparedMask::per_query_lists`]). Per-query lists alone that are a window about the
    /// diagonal, every row's keys exactly `i + sk - sq - left ..= i + sk - sq + right` clipped to
    /// the keys (the same in every plane; rows with none only where the window shows none), are
    /// prepared on the GPU as that window ([`SparseMask::window`]: no memory, no mask reads), found
    /// in the same pass and read-back as the range check; not where the mask also has sink keys
    /// or compressed causal, which keep them lists.
    pub fn indices(indices: &Tensor) -> Self {
        Self::part(Part::Indices(indices.clone()))
    }

    fn part(p: Part) -> Self {
        SparseMask { band: BandSpec::default(), parts: vec![p] }
    }

    /// Both masks at once: a score is visible iff both show it. Bands intersect (the narrower
    /// edge wins on each side; sink counts take the larger, compress factors must agree).
    pub fn and(mut self, other: SparseMask) -> Self {
        self.band = self.band.and(other.band);
        self.parts.extend(other.parts);
        self
    }

    /// Prepares the mask for calls with these sequence lengths on the device of its tensors (any
    /// device for a parametric mask): checks every part (typed errors naming the argument), then on
    /// the GPU builds the block classes and score bits in one pass over each tensor (a score mask
    /// without a query dimension alone: its per-plane key lists, for gather attention, see
    /// [`PreparedMask::gathered_keys`]). The work is queued on the device's stream without
    /// waiting, except for BCSR input, read on the host, and index lists, whose range check is
    /// read back.
    pub fn prepare(&self, seqlen_q: usize, seqlen_k: usize) -> Result<PreparedMask> {
        if seqlen_q == 0 || seqlen_k == 0 {
            return Err(Error::Param { arg: "seqlen", reason: format!("seqlen_q {seqlen_q} and seqlen_k {seqlen_k} must be at least 1") });
        }
        let mut band = self.band.resolve(seqlen_q, seqlen_k)?;
        let device = self.device()?;
        let (planes, data) = match (&device, self.parts.is_empty()) {
            (_, true) => ([1, 1], None),
            (Device::Cpu, false) => {
                let dense = crate::cpu::prepare(&self.parts, seqlen_q, seqlen_k)?;
                (dense.planes, Some(MaskData::Cpu(Arc::new(dense))))
            }
            (Device::Cuda(dev), false) => {
                // A forced choice between the lists' two forward paths keeps them lists.
                let lists_band = self.band.takes_a_window() && FORCED_ROW_LISTS.with(|f| f.get()).is_none();
                let gpu = cuda::prepare(dev, &self.parts, seqlen_q, seqlen_k, cuda::Forms { gather: true, lists_band })?;
                match gpu.lists_band {
                    Some([left, right]) => {
                        band = self.band.and(BandSpec { left: Some(left), right: Some(right), ..BandSpec::default() }).resolve(seqlen_q, seqlen_k)?;
                        (gpu.planes, None)
                    }
                    None => (gpu.planes, Some(MaskData::Cuda(gpu))),
                }
            }
        };
        let from_data = !self.parts.is_empty();
        let mut prepared = PreparedMask { band, seqlen_q, seqlen_k, planes, data, from_data, device, seqs: None };
        prepared.lay_out_row_lists()?;
        Ok(prepared)
    }

    /// Prepares the mask for packed calls over the sequences of `seqs` (on their device), as
    /// [`SparseMask::prepare`] does for fixed lengths. Data parts give each sequence's mask in
    /// that sequence's own positions, as if it were batch entry `b` of a fixed-length call of
    /// the longest lengths: batch dim `{1|batch}` (1: every sequence the same), `seqlen_q` =
    /// `seqs.max_seqlen_q()` rows (or query blocks) and `seqlen_k` = `seqs.max_seqlen_k()` keys
    /// (or key blocks); e.g. a block bitset `[{1|batch}, {1|hk|h}, ceil(max_seqlen_q / block),
    /// ceil(max_seqlen_k / block)]`, whose block `(r, c)` of sequence `b` holds its queries from
    /// `r * block` and keys from `c * block`. What lies past a sequence's own lengths is never
    /// read (index lists' entries there show nothing). Parametric rules apply to each sequence's
    /// lengths. Masks with data are laid out once for the packed rows (about `total_q x
    /// max_seqlen_k / 8` bytes a head plane); a mask prepared here serves only calls with these
    /// sequences, and none is run as gather attention.
    ///
    /// ```
    /// # fn main() -> dmattn::Result<()> {
    /// use dmattn::{attention, DType, Device, SeqLens, SparseMask, Tensor};
    /// let dev = Device::Cpu;
    /// // Two documents of 100 and 200 tokens; a 64-block bitset each ([2, 1, 4, 4]: the longest's
    /// // 4 x 4 blocks), the second document's blocks past its diagonal hidden.
    /// let lens = SeqLens::from_lengths(&[100, 200], &[100, 200], &dev)?;
    /// let kept: Vec<bool> = (0..32).map(|i| i < 16 || (i % 16) / 4 >= i % 4).collect();
    /// let mask = SparseMask::block_bitset(&Tensor::from_vec(kept, &[2, 1, 4, 4], &dev)?, 64).prepare_packed(&lens)?;
    /// let x = Tensor::from_fn(&[300, 2, 16], DType::F32, &dev, |i| (i as f64 * 0.37).sin())?;
    /// let fwd = attention(&x, &x, &x).seqlens(&lens).sparse_mask(&mask).forward()?;
    /// assert_eq!(fwd.out.shape(), &[300, 2, 16]);
    /// // 20 tiles of 64 x 64 (4 and 16), of which 4 and 10 are visited.
    /// assert!((mask.estimated_speedup()? - 20.0 / 14.0).abs() < 1e-12);
    /// # Ok(()) }
    /// ```
    pub fn prepare_packed(&self, seqs: &SeqLens) -> Result<PreparedMask> {
        let (sq, sk) = (seqs.max_seqlen_q().max(1), seqs.max_seqlen_k().max(1));
        let band = self.band.resolve(sq, sk)?;
        let device = self.device()?;
        if !self.parts.is_empty() && !device.same(&seqs.device()) {
            return Err(Error::Device { arg: "sparse_mask", expected: format!("{} (the device of the sequence lengths)", seqs.device()), got: device.to_string() });
        }
        // One plane per sequence or one for all: checked before the data is laid out by it.
        let per_sequence = |planes: [usize; 2]| {
            if planes[0] == 1 || planes[0] == seqs.batch() {
                return Ok(());
            }
            let expected = format!("data parts with batch dim 1 or {} (one plane per sequence)", seqs.batch());
            Err(Error::Shape { arg: "sparse_mask", expected, got: planes.to_vec() })
        };
        let (planes, data) = match &device {
            _ if self.parts.is_empty() => ([1, 1], None),
            Device::Cpu => {
                let dense = crate::cpu::prepare(&self.parts, sq, sk)?;
                per_sequence(dense.planes)?;
                ([1, dense.planes[1]], Some(MaskData::Cpu(Arc::new(crate::cpu::to_sequences(&dense, seqs, sq, sk)))))
            }
            Device::Cuda(dev) => {
                let gpu = cuda::prepare(dev, &self.parts, sq, sk, cuda::Forms::TILES)?;
                per_sequence(gpu.planes)?;
                ([1, gpu.planes[1]], Some(MaskData::Cuda(cuda::to_sequences(dev, &gpu, seqs)?)))
            }
        };
        let seqs = data.is_some().then(|| seqs.clone());
        Ok(PreparedMask { band, seqlen_q: sq, seqlen_k: sk, planes, data, from_data: !self.parts.is_empty(), device, seqs })
    }

    /// The device of the mask's tensors (CPU for a parametric mask); all must share it.
    fn device(&self) -> Result<Device> {
        let mut tensors = self.parts.iter().flat_map(Part::tensors);
        let Some((arg, first)) = tensors.next() else { return Ok(Device::Cpu) };
        let device = first.device();
        for (arg2, t) in tensors {
            if !t.device().same(&device) {
                return Err(Error::Device { arg: arg2, expected: format!("{device} (the device of {arg})"), got: t.device().to_string() });
            }
        }
        Ok(device)
    }
}

impl Part {
    /// The tensors of the part, by argument name.
    pub(crate) fn tensors(&self) -> Vec<(&'static str, &Tensor)> {
        match self {
            Part::Dense(t) | Part::DenseBlocks { mask: t, .. } => vec![("mask", t)],
            Part::Packed(t) => vec![("packed_bits", t)],
            Part::Bitset { kept, .. } => vec![("block_bitset", kept)],
            Part::Bcsr { row_ptr, col_idx, .. } => vec![("row_ptr", row_ptr), ("col_idx", col_idx)],
            Part::Indices(t) => vec![("indices", t)],
        }
    }
}

impl BandSpec {
    /// Both bands at once (see [`SparseMask::and`]).
    fn and(self, other: BandSpec) -> BandSpec {
        let min = |a: Option<usize>, b: Option<usize>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        BandSpec {
            left: min(self.left, other.left),
            right: min(self.right, other.right),
            sinks: self.sinks.max(other.sinks),
            // Disagreeing factors are reported by `prepare`.
            compress: match (self.compress, other.compress) {
                (Some(x), Some(y)) if x != y => Some(0),
                (x, y) => x.or(y),
            },
        }
    }

    /// Whether this band ANDed with a window about the ordinary diagonal is a band: not where
    /// sink keys (shown past this band's left edge, not the window's) or a compressed diagonal
    /// (another diagonal) would have to hold for one side and not the other.
    fn takes_a_window(&self) -> bool {
        self.sinks == 0 && self.compress.is_none()
    }

    /// The kernels' form; sides beyond every key are unbounded.
    fn resolve(&self, sq: usize, sk: usize) -> Result<Band> {
        // Saturating: lengths are the caller's, and a side past every key is unbounded anyway.
        let span = sq.saturating_add(sk);
        // The kernels' sides and sinks are 32-bit (Band::NONE unbounded): one that bounds keys
        // past that is an error, not a wrapped side.
        let side = |s: Option<usize>| match s.filter(|&s| s < span) {
            None => Ok(Band::NONE),
            Some(s) if s < Band::NONE as usize => Ok(s as u32),
            Some(s) => Err(Error::Param { arg: "window", reason: format!("a side of {s} keys (below {span}, the lengths' sum, so not unbounded) is past the kernels' 2^32 - 2") }),
        };
        let sinks = u32::try_from(self.sinks.min(sk)).map_err(|_| Error::Param { arg: "sinks", reason: format!("{} sink keys are past the kernels' 2^32 - 1", self.sinks.min(sk)) })?;
        let compress = match self.compress {
            None => 0,
            Some(0) => {
                return Err(Error::Param { arg: "compress_factor", reason: "must be at least 1 (and one value per mask)".into() });
            }
            Some(c) => c.min(u32::MAX as usize) as u32,
        };
        Ok(Band { left: side(self.left)?, right: side(self.right)?, sinks, compress })
    }
}

/// A [`SparseMask`] ready for attention calls with the sequence lengths it was prepared for, on
/// its device. Cheap to clone (the device data is shared).
#[derive(Clone)]
pub struct PreparedMask {
    pub(crate) band: Band,
    pub(crate) seqlen_q: usize,
    pub(crate) seqlen_k: usize,
    /// `[batch, heads]` of the data part, each 1 where broadcast.
    pub(crate) planes: [usize; 2],
    pub(crate) data: Option<MaskData>,
    /// Made from data parts, whether or not it holds data: index lists prepared as the window
    /// they are hold none, yet calls check them as the data they came from (their planes, their
    /// lengths, no bool mask beside them), as they checked them before.
    pub(crate) from_data: bool,
    device: Device,
    /// The packed batch whose rows its data is laid out for ([`SparseMask::prepare_packed`]).
    pub(crate) seqs: Option<SeqLens>,
}

#[derive(Clone)]
pub(crate) enum MaskData {
    Cpu(Arc<DenseMask>),
    Cuda(cuda::PreparedMask),
}

/// The CPU's prepared form: the equivalent dense mask `[planes.0, planes.1, sq, sk]`, band not
/// included; for a packed batch, its mask's flags in their layout (`Problem::packed_mask`).
pub(crate) struct DenseMask {
    pub planes: [usize; 2],
    pub keep: Vec<bool>,
}

impl PreparedMask {
    /// Device data prepared by a backend, with no band.
    pub(crate) fn on_device(data: MaskData, planes: [usize; 2], seqlen_q: usize, seqlen_k: usize, device: Device) -> Self {
        PreparedMask { band: Band::ALL, seqlen_q, seqlen_k, planes, data: Some(data), from_data: true, device, seqs: None }
    }

    /// The same mask (band, lengths, planes) in another form of device data.
    pub(crate) fn with_data(&self, data: MaskData) -> Self {
        PreparedMask { data: Some(data), from_data: true, ..self.clone() }
    }

    /// A packed batch's bool mask (`layout`, checked by `Problem::new`) for its call, planes `[1,
    /// heads]`: on the GPU packed per sequence (`cuda::pack_sequences`; a key-side one once a
    /// kernel other than the decoding one reads it); on the CPU its flags in
    /// their packed layout, which the CPU backend cuts per sequence.
    pub(crate) fn packed(t: &Tensor, layout: PackedLayout, seqs: &SeqLens) -> Result<Self> {
        let heads = t.shape()[1];
        let data = match t.device() {
            Device::Cpu => MaskData::Cpu(Arc::new(DenseMask { planes: [1, heads], keep: t.to_f64_vec()?.into_iter().map(|x| x != 0.0).collect() })),
            // Packed when a kernel other than the decoding one takes it (`cuda::forward`).
            Device::Cuda(_) if layout == PackedLayout::KeySide => MaskData::Cuda(cuda::key_side_bytes(t, seqs)),
            Device::Cuda(dev) => MaskData::Cuda(cuda::pack_sequences(&dev, t, layout, seqs)?),
        };
        Ok(Self::on_device(data, [1, heads], seqs.max_seqlen_q(), seqs.max_seqlen_k(), t.device()))
    }

    /// A fixed-length call's query-broadcast bool mask (checked by `Problem::new`) left as
    /// bytes for the decoding kernel (`cuda::reads_key_bytes` says where), on a CUDA device.
    pub(crate) fn key_bytes(t: &Tensor, seqlen_q: usize, seqlen_k: usize) -> Self {
        let planes = [t.shape()[0], t.shape()[1]];
        Self::on_device(MaskData::Cuda(cuda::fixed_key_bytes(t, seqlen_q, seqlen_k)), planes, seqlen_q, seqlen_k, t.device())
    }

    /// The caller's tensor a GPU mask still reads (a key-side mask left as bytes,
    /// `cuda::KeyBytes`), if any.
    pub(crate) fn unpacked_source(&self) -> Option<&Tensor> {
        match &self.data {
            Some(MaskData::Cuda(g)) => g.key_bytes.as_ref().map(|k| k.source()),
            _ => None,
        }
    }

    /// The device the mask was prepared on (any device's tensors may use a parametric mask).
    pub fn device(&self) -> Device {
        self.device.clone()
    }

    /// Where the mask runs as gather attention in both passes, the keys the backward gathers per
    /// plane: the most any plane keeps, rounded up to a 64-key tile; `None` otherwise.
    ///
    /// A GPU mask whose only part is a score mask that does not vary along the queries
    /// (`[.., .., 1, sk]`, bool or bit-packed) is compacted into per-plane key lists when
    /// prepared. The forward then always runs over each plane's kept keys alone (O(seqlen_q x
    /// kept keys) work, reading nothing back, so also inside a CUDA graph capture); the backward
    /// does where the mask keeps at most half the keys, and otherwise (or inside a capture) runs
    /// on dense tiles as for any mask. Reads the lists' lengths back once (waits for the device).
    pub fn gathered_keys(&self) -> Result<Option<usize>> {
        match &self.data {
            Some(MaskData::Cuda(g)) => g.gather.as_ref().map_or(Ok(None), |l| l.backward_width()),
            _ => Ok(None),
        }
    }

    /// Bytes of device (or, on the CPU, host) memory the prepared mask holds: 0 for a parametric
    /// mask; on the GPU a byte per 64x64 block, plus 8 bytes per 64 scores with a score mask.
    pub fn memory_bytes(&self) -> usize {
        match &self.data {
            None => 0,
            Some(MaskData::Cpu(d)) => d.keep.len(),
            Some(MaskData::Cuda(g)) => g.memory_bytes(),
        }
    }

    /// An estimate of what the mask saves, for planning: 64x64 tiles of one attention head
    /// (averaged over the mask's planes) divided by the tiles the kernels visit (the band's and
    /// the block classes' non-empty ones). The kernels' own tiles are 64 to 128 wide, per-score
    /// work in partial tiles costs extra, and skipped tiles are not free, so measured speedups
    /// differ. Reads the block classes back from the GPU (waits for the device). Per-query index
    /// lists that run over each query's own keys are counted by the dense tiles their keys fall
    /// in, not by the listed keys that forward reads (random lists over long rows touch most
    /// tiles, so their estimate is low).
    ///
    /// Prepared for a packed batch ([`SparseMask::prepare_packed`]): every sequence's tiles of
    /// every head plane over those visited. On the GPU the block classes were built at the
    /// longest lengths, so a tile at a sequence's edge also counts as visited where the data
    /// keeps a score in it past the sequence's end (the kernels visit it and mask those scores).
    pub fn estimated_speedup(&self) -> Result<f64> {
        if let Some(seqs) = &self.seqs {
            return self.packed_speedup(seqs);
        }
        let (qb, kb) = (self.seqlen_q.div_ceil(64), self.seqlen_k.div_ceil(64));
        if let Some(MaskData::Cuda(g)) = &self.data
            && let Some(lists) = &g.gather
            && lists.backward_width()?.is_some()
        {
            // Gathered: the band's tiles, each holding the kept keys' share of the keys (none
            // where the mask hides every key: every gathered tile is then skipped).
            let band = (0..qb).map(|i| self.band_shows(self.seqlen_q, self.seqlen_k, i).0).sum::<usize>();
            let visited = band as f64 * lists.longest()?.next_multiple_of(64) as f64 / (kb * 64) as f64;
            return Ok((qb * kb) as f64 / visited.max(1.0));
        }
        let classes = match &self.data {
            None => None,
            Some(MaskData::Cpu(d)) => Some(d.block_classes(self.seqlen_q, self.seqlen_k)),
            Some(MaskData::Cuda(g)) => Some(match (&g.gather, &self.device) {
                // Key lists the backward does not gather: the dense-tile form it runs on.
                (Some(lists), Device::Cuda(dev)) => lists.dense_tiles(dev)?.block_classes(qb, kb)?,
                _ => g.block_classes(qb, kb)?,
            }),
        };
        let planes = classes.as_ref().map_or(1, |c| c.len() / (qb * kb));
        let mut visited = 0usize;
        for i in 0..qb {
            let (count, shows) = self.band_shows(self.seqlen_q, self.seqlen_k, i);
            visited += match &classes {
                // The band alone: its tiles' count (a long call has too many to walk).
                None => count,
                Some(c) => (0..planes).map(|plane| (0..kb).filter(|&j| c[(plane * qb + i) * kb + j] && shows(j)).count()).sum(),
            };
        }
        Ok((planes * qb * kb) as f64 / visited.max(1) as f64)
    }

    /// [`PreparedMask::estimated_speedup`] of a mask laid out for a packed batch: every
    /// sequence's tiles (of every head plane) over those it visits.
    fn packed_speedup(&self, seqs: &SeqLens) -> Result<f64> {
        let (ph, max_k, total_q) = (self.planes[1], seqs.max_seqlen_k(), seqs.total_q());
        let words = max_k.div_ceil(64);
        // Whether head plane `h`'s block `(r, c)` of the sequence with rows `q` and `keys` keys
        // keeps a score (by the layouts `cpu::to_sequences` and `cuda::to_sequences` write).
        type Kept<'a> = Box<dyn Fn(usize, &Range<usize>, usize, usize, usize) -> bool + 'a>;
        let kept: Kept = match &self.data {
            Some(MaskData::Cpu(d)) => Box::new(move |h, q, keys, r, c| {
                let rows = q.start + 64 * r..(q.start + 64 * r + 64).min(q.end);
                rows.into_iter().any(|i| (64 * c..(64 * c + 64).min(keys)).any(|j| d.keep[(i * ph + h) * max_k + j]))
            }),
            Some(MaskData::Cuda(g)) => {
                let classes = g.classes_to_host(ph * total_q * words)?;
                Box::new(move |h, q, _, r, c| classes[(h * total_q + q.start + r) * words + c] != dmattn_abi::block_class::EMPTY)
            }
            None => Box::new(|_, _, _, _, _| true),
        };
        let (mut tiles, mut visited) = (0usize, 0usize);
        for b in 0..seqs.batch() {
            let (q, k) = seqs.rows(b);
            let (qb, kb) = (q.len().div_ceil(64), k.len().div_ceil(64));
            tiles += ph * qb * kb;
            for r in 0..qb {
                let (_, shows) = self.band_shows(q.len(), k.len(), r);
                visited += (0..ph).map(|h| (0..kb).filter(|&c| shows(c) && kept(h, &q, k.len(), r, c)).count()).sum::<usize>();
            }
        }
        Ok(tiles as f64 / visited.max(1) as f64)
    }

    /// Per-query index lists alone on the GPU (`[.., .., seqlen_q, w]`): laid out for the forward
    /// over each query's own keys (each row's keys ascending) where [`lists_pay`] says so. Reads
    /// block classes back (waits for the device): every plane's, or past 2^26 tiles the first
    /// plane's first tile rows, whose share of kept tiles in the band stands for the rest.
    fn lay_out_row_lists(&mut self) -> Result<()> {
        let (Some(MaskData::Cuda(g)), Device::Cuda(dev)) = (&mut self.data, &self.device) else { return Ok(()) };
        let Some((bits, shape)) = g.index_bits.take() else { return Ok(()) };
        let (sq, sk) = (self.seqlen_q, self.seqlen_k);
        let (qb, kb) = (sq.div_ceil(64), sk.div_ceil(64));
        let planes = self.planes[0] * self.planes[1];
        // The layout's grid is (rows, ph, pb).
        if shape[0] > u16::MAX as usize || shape[1] > u16::MAX as usize || shape[2] > i32::MAX as usize {
            return Ok(());
        }
        let pays = match FORCED_ROW_LISTS.with(|f| f.get()) {
            Some(forced) => forced,
            None => {
                // Per-query lists' classes have a row per query block. A tile row's band runs
                // from its first row's start to its last row's end (both never decrease), plus
                // the sink tiles; the visited tiles are the kept ones in it.
                let (read_planes, read_rows) = if planes * qb * kb <= 1 << 26 { (planes, qb) } else { (1, ((1 << 26) / kb).clamp(1, qb)) };
                let classes = g.classes_to_host(read_planes * qb * kb - (qb - read_rows) * kb)?;
                let sinks = sink_keys(&self.band, sk);
                let (mut visited, mut band_read, mut band_tiles) = (0, 0, 0);
                for i in 0..qb {
                    let ((lo, _), (_, hi)) = (band_keys(&self.band, sq, sk, i * 64), band_keys(&self.band, sq, sk, ((i + 1) * 64).min(sq) - 1));
                    let (sink_end, begin, end) = (sinks.min(hi).div_ceil(64), (lo / 64).min(kb), hi.div_ceil(64).max(lo / 64).min(kb));
                    let ranges = [0..sink_end.min(begin), begin..end];
                    let in_row = ranges.iter().map(|r| r.len()).sum::<usize>();
                    band_tiles += in_row;
                    if i < read_rows {
                        band_read += in_row * read_planes;
                        for plane in 0..read_planes {
                            let row = &classes[(plane * qb + i) * kb..][..kb];
                            visited += ranges.iter().map(|r| row[r.clone()].iter().filter(|&&c| c != dmattn_abi::block_class::EMPTY).count()).sum::<usize>();
                        }
                    }
                }
                // Every plane's visited tiles, from the share of the band's tiles read that are kept.
                let visited = (visited as f64 / band_read.max(1) as f64 * (band_tiles * planes) as f64) as usize;
                // The band hides about as large a share of the listed keys as of the tiles.
                let in_band = band_tiles as f64 / (qb * kb) as f64;
                lists_pay(visited, (planes * sq * shape[3]) as f64 * in_band)
            }
        };
        if pays {
            g.rows = Some(Arc::new(cuda::lists_from_bits(dev, &bits, shape, sk)?));
        }
        Ok(())
    }

    /// Whether the forward runs each query over its own listed keys (per-query index lists where
    /// that pays, [`SparseMask::indices`]): work O(queries x listed keys) whatever the lists'
    /// pattern, where the dense-tile path visits every 64x64 tile in which some query lists a key.
    /// The backward runs on those dense tiles, as does the forward at head dims past 128.
    pub fn per_query_lists(&self) -> bool {
        matches!(&self.data, Some(MaskData::Cuda(g)) if g.rows.is_some())
    }

    /// The 64-key tiles the band shows a score of to query tile `r` (64 rows) of a call of
    /// `sq x sk`: how many, and whether tile `c` is one ([`band_tiles`]).
    fn band_shows(&self, sq: usize, sk: usize, r: usize) -> (usize, impl Fn(usize) -> bool) {
        let (sinks, tiles) = band_tiles(&self.band, sq, sk, 64 * r, (sq - 64 * r).min(64), 64);
        (sinks + tiles.len(), move |c| c < sinks || tiles.contains(&c))
    }
}

impl DenseMask {
    /// Whether each 64x64 block of each plane has a kept score, `[planes, qb, kb]`.
    fn block_classes(&self, sq: usize, sk: usize) -> Vec<bool> {
        let (qb, kb) = (sq.div_ceil(64), sk.div_ceil(64));
        let planes = self.planes[0] * self.planes[1];
        let mut out = vec![false; planes * qb * kb];
        for p in 0..planes {
            for i in 0..sq {
                for j in 0..sk {
                    if self.keep[(p * sq + i) * sk + j] {
                        out[(p * qb + i / 64) * kb + j / 64] = true;
                    }
                }
            }
        }
        out
    }
}

/// Row `i`'s band without the sinks: keys `lo..hi` (the reference's reading of [`Band`]).
pub(crate) fn band_keys(band: &Band, sq: usize, sk: usize, i: usize) -> (usize, usize) {
    let diagonal = match band.compress {
        0 => i as i64 + sk as i64 - sq as i64,
        c => (i / c as usize) as i64,
    };
    let hi = if band.right == Band::NONE { sk as i64 } else { (diagonal + band.right as i64 + 1).clamp(0, sk as i64) };
    let lo = if band.left == Band::NONE { 0 } else { (diagonal - band.left as i64).clamp(0, sk as i64) };
    (lo as usize, hi as usize)
}

/// Keys `0..n` exempt from the band's left edge.
pub(crate) fn sink_keys(band: &Band, sk: usize) -> usize {
    if band.left == Band::NONE { 0 } else { (band.sinks as usize).min(sk) }
}

/// The tiles of `block_n` keys that query rows `row0..row0 + rows` (`rows >= 1`) of a `sq x sk`
/// call see some key of under `band`, as the kernels visit them (`Visibility::key_tiles`): the
/// sink tiles before the band's, then the band's, from its first row's first key to its last
/// row's end. Between them every tile is seen: each row's ends move by at most one key a row
/// (a compressed band's by at most one every `compress` rows), and a row that sees nothing
/// sees nothing at either end. Rows whose band lies wholly past the keys (ends clamped to `sk`)
/// see no tile: the kernels' `key_tiles` rounds such an empty run to the tile holding key `sk`
/// and visits it for nothing (every score hidden), which the estimates here do not count.
pub(crate) fn band_tiles(band: &Band, sq: usize, sk: usize, row0: usize, rows: usize, block_n: usize) -> (usize, Range<usize>) {
    let (lo, _) = band_keys(band, sq, sk, row0);
    let (_, hi) = band_keys(band, sq, sk, row0 + rows - 1);
    // The ends never decrease along the rows: `lo >= hi` leaves every row nothing.
    let (begin, end) = if lo < hi { (lo / block_n, hi.div_ceil(block_n)) } else { (hi.div_ceil(block_n), hi.div_ceil(block_n)) };
    (sink_keys(band, sk).min(hi).div_ceil(block_n).min(begin), begin..end)
}

/// Whether the band shows key `j` to query `i`.
pub(crate) fn band_visible(band: &Band, sq: usize, sk: usize, i: usize, j: usize) -> bool {
    let (lo, hi) = band_keys(band, sq, sk, i);
    j < hi && (j >= lo || j < sink_keys(band, sk))
}

/// Checks a block size: the kernels' block classes are 64x64, so blocks are 64 or 128.
pub(crate) fn check_block(block: usize) -> Result<()> {
    if block == 64 || block == 128 {
        Ok(())
    } else {
        Err(Error::Param { arg: "block", reason: format!("block size {block} is not supported (64 or 128)") })
    }
}

/// A part's shape: 4-D, plane dims first, then `rows` and `cols` exactly (or 1 where `may_bcast`).
pub(crate) fn check_part_shape(t: &Tensor, arg: &'static str, dtype: DType, rows: usize, cols: usize, may_bcast: [bool; 2]) -> Result<[usize; 4]> {
    if t.dtype() != dtype {
        return Err(Error::DType { arg, expected: format!("{dtype:?}"), got: t.dtype() });
    }
    let expected = || {
        let dim = |n: usize, b: bool| if b { format!("{{1|{n}}}") } else { n.to_string() };
        format!("[{{1|batch}}, {{1|kv_heads|heads}}, {}, {}]", dim(rows, may_bcast[0]), dim(cols, may_bcast[1]))
    };
    let s = <[usize; 4]>::try_from(t.shape()).map_err(|_| Error::Shape { arg, expected: expected(), got: t.shape().to_vec() })?;
    let fits = |n: usize, want: usize, b: bool| n == want || (b && n == 1);
    if !(fits(s[2], rows, may_bcast[0]) && fits(s[3], cols, may_bcast[1])) || s[0] == 0 || s[1] == 0 {
        return Err(Error::Shape { arg, expected: expected(), got: s.to_vec() });
    }
    Ok(s)
}

/// The `[batch, heads]` plane dims of a combination: each part's 1 broadcasts; other counts must agree.
pub(crate) fn combine_planes(planes: impl IntoIterator<Item = (&'static str, [usize; 2])>) -> Result<[usize; 2]> {
    let mut out = [1, 1];
    for (arg, p) in planes {
        for d in 0..2 {
            if p[d] != 1 && out[d] != 1 && p[d] != out[d] {
                let what = ["batch", "heads"][d];
                return Err(Error::Shape { arg, expected: format!("{what} dim 1 or {} (as the mask's other parts)", out[d]), got: p.to_vec() });
            }
            out[d] = out[d].max(p[d]);
        }
    }
    Ok(out)
}

/// BCSR checked on the host and turned into kept flags `[planes, q_blocks, k_blocks]` (the plane
/// dims are returned).
pub(crate) fn bcsr_to_bitset(row_ptr: &Tensor, col_idx: &Tensor, block: usize, sq: usize, sk: usize) -> Result<([usize; 2], Vec<u8>)> {
    check_block(block)?;
    let (qb, kb) = (sq.div_ceil(block), sk.div_ceil(block));
    let expected = format!("[{{1|batch}}, {{1|kv_heads|heads}}, {}] (ceil(seqlen_q / block) + 1)", qb + 1);
    if row_ptr.dtype() != DType::I32 {
        return Err(Error::DType { arg: "row_ptr", expected: "I32".into(), got: row_ptr.dtype() });
    }
    if col_idx.dtype() != DType::I32 {
        return Err(Error::DType { arg: "col_idx", expected: "I32".into(), got: col_idx.dtype() });
    }
    let rp = row_ptr.shape();
    if rp.len() != 3 || rp[2] != qb + 1 || rp[0] == 0 || rp[1] == 0 {
        return Err(Error::Shape { arg: "row_ptr", expected, got: rp.to_vec() });
    }
    let ci = col_idx.shape();
    if ci.len() != 3 || ci[..2] != rp[..2] {
        return Err(Error::Shape { arg: "col_idx", expected: format!("[{}, {}, nnz] (the plane dims of row_ptr)", rp[0], rp[1]), got: ci.to_vec() });
    }
    let (planes, nnz) = (rp[0] * rp[1], ci[2]);
    let (ptrs, idx) = (row_ptr.to_vec::<i32>()?, col_idx.to_vec::<i32>()?);
    let mut kept = vec![0u8; planes * qb * kb];
    for p in 0..planes {
        let ptr = &ptrs[p * (qb + 1)..][..qb + 1];
        if ptr[0] != 0 {
            return Err(Error::Param { arg: "row_ptr", reason: format!("plane {p} starts at {}, not 0", ptr[0]) });
        }
        for r in 0..qb {
            let (a, b) = (ptr[r], ptr[r + 1]);
            if b < a || b as usize > nnz {
                return Err(Error::Param {
                    arg: "row_ptr",
                    reason: format!("plane {p}: row {r} spans {a}..{b}; row pointers must be non-decreasing and at most nnz = {nnz}"),
                });
            }
            for &c in &idx[p * nnz + a as usize..p * nnz + b as usize] {
                if c < 0 || c as usize >= kb {
                    return Err(Error::Param { arg: "col_idx", reason: format!("plane {p}, query block {r}: key block {c} is outside 0..{kb}") });
                }
                kept[(p * qb + r) * kb + c as usize] = 1;
            }
        }
    }
    Ok(([rp[0], rp[1]], kept))
}

/// Whether per-query lists run over each query's own keys rather than on the dense tiles of
/// their mask: where the tiles the dense path visits (`visited_tiles`, 64 x 64, every plane's)
/// hold at least [`LISTS_PAY_RATIO`] times the lists' entries the band shows (`list_entries`,
/// estimated: every plane's rows times the width, times the band's share of the tiles). A listed key costs the lists forward a K and V row of its own (no
/// query shares it), a score on a dense tile a share of one.
pub(crate) fn lists_pay(visited_tiles: usize, list_entries: f64) -> bool {
    visited_tiles as f64 * 4096.0 >= LISTS_PAY_RATIO * list_entries
}

/// Whether per-query index lists are a window about the diagonal, from their rows summed up on
/// the device (`s`: every plane's `sq` rows over `sk` keys): its `[left, right]` where every
/// row's keys, in every plane, are exactly `i + sk - sq - left ..= i + sk - sq + right` clipped to
/// the keys, the rows with none lying wholly before or after the rows with some. Where no row
/// shows a side unclipped, that side is the least that shows each row its keys. Lists with no
/// key at all are not taken for a window.
pub(crate) fn lists_band(s: &ListsBand, planes: usize, sq: usize, sk: usize) -> Option<[usize; 2]> {
    const UNSET: i32 = i32::MIN;
    if s.broken != 0 || s.last_row == UNSET {
        return None;
    }
    let (first_row, last_row) = (-(s.first_row_neg as i64), s.last_row as i64);
    // Each plane's rows with keys are one run, the same in every plane.
    if (planes * sq) as i64 - s.empty_rows as i64 != planes as i64 * (last_row - first_row + 1) {
        return None;
    }
    // A side: the one value every row that shows it unclipped has (none negative), at least what
    // the clipped rows need; where no row shows it, what they need.
    let side = |max: i32, min_neg: i32, clipped_need: i64| match max {
        UNSET => Some(clipped_need.max(0)),
        _ if max >= 0 && max as i64 == -(min_neg as i64) && clipped_need <= max as i64 => Some(max as i64),
        _ => None,
    };
    // A row that starts at key 0 needs `diag <= left`; one that ends at the last key `diag + right >= sk - 1`.
    let left = side(s.left_max, s.left_min_neg, s.clipped_left_diag as i64)?;
    let right = side(s.right_max, s.right_min_neg, sk as i64 - 1 + s.clipped_right_diag_neg as i64)?;
    // The rows with no key: the window shows them none (it ends before key 0, or starts past the
    // last key); the rows beyond them the more so.
    let diag = |i: i64| i + sk as i64 - sq as i64;
    if first_row > 0 && diag(first_row - 1) + right >= 0 {
        return None;
    }
    if last_row + 1 < sq as i64 && diag(last_row + 1) - left <= sk as i64 - 1 {
        return None;
    }
    Some([left as usize, right as usize])
}

/// See [`lists_pay`]. H200, b1 h2 hk1 d64 32K causal, random lists of 1024 (the `indices` bench):
/// every tile visited, 32 times the entries, and the lists forward took 0.82 of the dense-tile
/// forward's time: they break even near 26. Measured with the kernel that reads a bias (`_mods`);
/// the lean one (no bias or softcap) took 0.65 of it, breaking even near 21, where the ratio
/// still sends lists to the dense tiles. Since the dense form runs the d64 mask-only kernel, the
/// lean lists break even near 32 (H200, 2026-11-29: 32K 0.99x, 64K 0.50x; `docs/perf-notes.md`);
/// with a bias both take other kernels, not measured there. Kept until that is.
const LISTS_PAY_RATIO: f64 = 24.0;

std::thread_local! {
    static FORCED_ROW_LISTS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Testing hook: while `Some(on)`, per-query index lists this thread prepares on the GPU run
/// over each query's own keys (`true`) or on dense tiles (`false`) whatever [`lists_pay`] says,
/// and are never prepared as the window they may be; `None`: its choice.
#[doc(hidden)]
pub fn force_per_query_lists(on: Option<bool>) {
    FORCED_ROW_LISTS.with(|f| f.set(on));
}

/// Checks an index-list tensor (`SparseMask::indices`): I32, `[pb, ph, {1|sq}, w]` with `w >= 1`.
/// Returns its shape.
pub(crate) fn check_indices_shape(t: &Tensor, sq: usize) -> Result<[usize; 4]> {
    if t.dtype() != DType::I32 {
        return Err(Error::DType { arg: "indices", expected: "I32".into(), got: t.dtype() });
    }
    let expected = format!("[{{1|batch}}, {{1|kv_heads|heads}}, {{1|{sq}}}, w] with w >= 1 (key indices, -1 = padding)");
    let s = <[usize; 4]>::try_from(t.shape()).map_err(|_| Error::Shape { arg: "indices", expected: expected.clone(), got: t.shape().to_vec() })?;
    if !(s[2] == 1 || s[2] == sq) || s[3] == 0 || s[0] == 0 || s[1] == 0 {
        return Err(Error::Shape { arg: "indices", expected, got: s.to_vec() });
    }
    Ok(s)
}

/// The error of an index outside `-1..sk`.
pub(crate) fn index_range_error(sk: usize, got: Option<i64>) -> Error {
    let got = got.map_or(String::new(), |g| format!(" (found {g})"));
    Error::Param { arg: "indices", reason: format!("entries must be -1 (padding) or key indices in 0..{sk}{got}") }
}

/// Index lists read on the host as a keep table `[pb, ph, rows, sk]`, with the lists' shape.
pub(crate) fn indices_keep(t: &Tensor, sq: usize, sk: usize) -> Result<([usize; 4], Vec<bool>)> {
    let s = check_indices_shape(t, sq)?;
    let values = t.to_f64_vec()?;
    let rows = s[0] * s[1] * s[2];
    let mut keep = vec![false; rows * sk];
    for (x, &v) in values.iter().enumerate() {
        let key = v as i64;
        if key < -1 || key >= sk as i64 {
            return Err(index_range_error(sk, Some(key)));
        }
        if key >= 0 {
            keep[(x / s[3]) * sk + key as usize] = true;
        }
    }
    Ok(([s[0], s[1], s[2], sk], keep))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `dmattn_indices_row_bits` sums up of a keep table `[planes, sq, sk]` (its model).
    fn summed(keep: &[bool], planes: usize, sq: usize, sk: usize) -> ListsBand {
        let mut s = ListsBand::NONE;
        let raise = |f: &mut i32, v: i64| *f = (*f).max(v as i32);
        for (n, row) in keep.chunks(sk).enumerate().take(planes * sq) {
            let i = (n % sq) as i64;
            let keys: Vec<i64> = (0..sk as i64).filter(|&j| row[j as usize]).collect();
            let (Some(&first), Some(&last)) = (keys.first(), keys.last()) else {
                s.empty_rows += 1;
                continue;
            };
            let diag = i + sk as i64 - sq as i64;
            if keys.len() as i64 != last - first + 1 {
                s.broken = 1;
            }
            raise(&mut s.last_row, i);
            raise(&mut s.first_row_neg, -i);
            if first > 0 {
                raise(&mut s.left_max, diag - first);
                raise(&mut s.left_min_neg, first - diag);
            } else {
                raise(&mut s.clipped_left_diag, diag);
            }
            if last < sk as i64 - 1 {
                raise(&mut s.right_max, last - diag);
                raise(&mut s.right_min_neg, diag - last);
            } else {
                raise(&mut s.clipped_right_diag_neg, -diag);
            }
        }
        s
    }

    /// The window a keep table is, by brute force: the least sides that show every row its keys,
    /// then every score compared.
    fn window_of(keep: &[bool], planes: usize, sq: usize, sk: usize) -> Option<[usize; 2]> {
        let diag = |i: usize| i as i64 + sk as i64 - sq as i64;
        let rows = || keep.chunks(sk).enumerate().take(planes * sq).map(|(n, row)| (n % sq, row));
        let ends = |row: &[bool]| Some((row.iter().position(|&k| k)? as i64, row.iter().rposition(|&k| k)? as i64));
        let (mut left, mut right, mut any) = (0, 0, false);
        for (i, row) in rows() {
            if let Some((first, last)) = ends(row) {
                (left, right, any) = (left.max(diag(i) - first), right.max(last - diag(i)), true);
            }
        }
        let shows = |i: usize, j: usize| diag(i) - left <= j as i64 && j as i64 <= diag(i) + right;
        let same = rows().all(|(i, row)| (0..sk).all(|j| row[j] == shows(i, j)));
        (any && same).then_some([left as usize, right as usize])
    }

    fn band_table(planes: usize, sq: usize, sk: usize, left: i64, right: i64) -> Vec<bool> {
        let diag = |i: usize| i as i64 + sk as i64 - sq as i64;
        (0..planes * sq * sk).map(|e| ((e / sk) % sq, (e % sk) as i64)).map(|(i, j)| diag(i) - left <= j && j <= diag(i) + right).collect()
    }

    /// The summary's reading agrees with brute force on every window (sides 0 to past the
    /// lengths, one or two planes, up to 6 x 6) and every table one score away from one, and on
    /// tables from a seeded generator (tending to runs of keys).
    #[test]
    fn lists_band_reads_the_summary_as_brute_force_does() {
        let check = |keep: &[bool], planes: usize, sq: usize, sk: usize| {
            assert_eq!(lists_band(&summed(keep, planes, sq, sk), planes, sq, sk), window_of(keep, planes, sq, sk), "{planes} x {sq} x {sk}: {keep:?}");
        };
        let (mut windows, mut near) = (0, 0);
        for (sq, sk, planes) in (1..=6).flat_map(|sq| (1..=6).flat_map(move |sk| (1..=2).map(move |p| (sq, sk, p)))) {
            for (left, right) in (-1..=8).flat_map(|l| (-1..=8).map(move |r| (l, r))) {
                let keep = band_table(planes, sq, sk, left, right);
                check(&keep, planes, sq, sk);
                windows += window_of(&keep, planes, sq, sk).is_some() as usize;
                for e in 0..keep.len() {
                    let mut flipped = keep.clone();
                    flipped[e] = !flipped[e];
                    check(&flipped, planes, sq, sk);
                    near += window_of(&flipped, planes, sq, sk).is_some() as usize;
                }
            }
        }
        // Both answers occur, among the flipped tables too (a window's edge moved by one).
        assert!(windows > 1000 && near > 100, "{windows} windows, {near} near ones");
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..20_000 {
            let (sq, sk, planes) = (1 + next(9) as usize, 1 + next(9) as usize, 1 + next(3) as usize);
            let (left, right) = (next(12) as i64 - 2, next(12) as i64 - 2);
            let mut keep = band_table(planes, sq, sk, left, right);
            for _ in 0..next(4) {
                let e = next(keep.len() as u64) as usize;
                keep[e] = !keep[e];
            }
            check(&keep, planes, sq, sk);
        }
    }
}
