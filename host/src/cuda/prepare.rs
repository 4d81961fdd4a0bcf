//! A [`SparseMask`](crate::SparseMask)'s data parts turned into what the kernels read, on the
//! device: a class per 64x64 block (`dmattn_abi::block_class`) and, with a score mask, its bits
//! packed one per score in the MMA accumulator order. A score mask is packed by `dmattn_mask_pack`
//! (bool; `dmattn_mask_pack_keys` where it has one row a plane) or `dmattn_mask_pack_bits`
//! (bit-packed); each block mask (a bitset, BCSR as a bitset, or a bitset built
//! from a dense mask by the pack kernel's classes) then narrows the classes with
//! `dmattn_block_mask`.
use super::launch::{Launch, launch};
use super::gather::KeyListsBuf;
use super::{BACKEND, broadcast_view, packed_view};
use crate::device::CudaDevice;
use crate::dtype::DType::{Bool, U8};
use crate::error::{Error, Result};
use crate::memory::DeviceBuffer;
use crate::sparse::{Part, bcsr_to_bitset, check_block, check_part_shape, combine_planes};
use crate::tensor::Tensor;
use crate::problem::PackedLayout;
use crate::seqlens::SeqLens;
use dmattn_abi::{BLOCK_MAP_K, BLOCK_MAP_Q, BLOCK_MASK_THREADS, BlockMaskParams, MASK_PACK_BITS_THREADS, MASK_PACK_THREADS, MaskPackParams, MaskSeqsParams, Seqs, View4, names};
use std::sync::Arc;

/// The GPU's prepared mask: block classes `[pb, ph, {1|q_blocks}, k_blocks]` and its bits
/// `[.., .., {1|sq}, k_blocks]` (u64 words), zero strides where broadcast: a score mask's, or for
/// block masks alone one row of all-ones words broadcast over every row.
#[derive(Clone)]
pub(crate) struct PreparedMask {
    pub classes: View4,
    pub bits: View4,
    pub planes: [usize; 2],
    /// It has block parts: its block classes may hide blocks its bits show.
    pub blocks: bool,
    /// A query-broadcast score mask alone, run as gather attention: its key lists (`classes` and
    /// `bits` are then absent; see `gather`).
    pub gather: Option<Arc<KeyListsBuf>>,
    /// Per-query index lists alone, where running each query over its own keys pays: the lists
    /// laid out, each row's keys ascending (the forward's; `classes` and `bits` serve the
    /// backward; see `lists`).
    pub rows: Option<Arc<super::lists::RowLists>>,
    /// Per-query index lists alone: their keep table and shape, until `PreparedMask::prepare`
    /// has decided whether to lay them out for the lists forward (`rows`).
    pub index_bits: Option<(Tensor, [usize; 4])>,
    /// A key-side bool mask left as the caller gave it (`classes` and `bits` are then absent):
    /// the decoding kernel reads its bytes, every other kernel takes it prepared
    /// ([`KeyBytes::prepared`]).
    pub key_bytes: Option<KeyBytes>,
    /// Per-query index lists alone that are a window about the diagonal (`sparse::lists_band`):
    /// its left and right sides, and no data (the mask is that band; `planes` are the lists').
    pub lists_band: Option<[usize; 2]>,
    bytes: usize,
    /// The buffers the views point into (one may serve several masks: `to_sequences`).
    _bufs: Vec<Arc<DeviceBuffer>>,
}

impl PreparedMask {
    /// The mask's buffer that holds device address `ptr`.
    fn buffer_holding(&self, ptr: u64) -> Option<&Arc<DeviceBuffer>> {
        self._bufs.iter().find(|b| b.ptr() <= ptr && ptr < b.ptr() + b.bytes() as u64)
    }

    /// The first `len` bytes of the block classes, read back from the device.
    pub fn classes_to_host(&self, len: usize) -> Result<Vec<u8>> {
        let ptr = self.classes.ptr;
        let buf = self.buffer_holding(ptr).expect("the classes live in one of the mask's buffers");
        buf.to_host((ptr - buf.ptr()) as usize, len)
    }

    /// A score mask's classes and bits in `bufs`.
    pub fn new(classes: View4, bits: View4, planes: [usize; 2], bufs: Vec<DeviceBuffer>) -> Self {
        let bytes = bufs.iter().map(DeviceBuffer::bytes).sum();
        PreparedMask { classes, bits, planes, blocks: false, gather: None, rows: None, index_bits: None, key_bytes: None, lists_band: None, bytes, _bufs: bufs.into_iter().map(Arc::new).collect() }
    }

    /// A mask of `planes` with no classes, bits or buffers: the base of the forms that keep
    /// their data elsewhere (key lists, a caller's bytes).
    fn without_data(planes: [usize; 2]) -> Self {
        PreparedMask { classes: View4::ABSENT, bits: View4::ABSENT, planes, blocks: false, gather: None, rows: None, index_bits: None, key_bytes: None, lists_band: None, bytes: 0, _bufs: Vec::new() }
    }

    pub fn memory_bytes(&self) -> usize {
        self.bytes + self.gather.as_ref().map_or(0, |g| g.memory_bytes()) + self.rows.as_ref().map_or(0, |r| r.memory_bytes())
    }

    /// The same data seen through other views (into the same buffers) and planes.
    pub fn viewed(&self, classes: View4, bits: View4, planes: [usize; 2]) -> Self {
        PreparedMask { classes, bits, planes, rows: None, index_bits: None, key_bytes: None, lists_band: None, ..self.clone() }
    }

    /// Whether each 64x64 block of each plane is visited, `[planes, q_blocks, k_blocks]` (read
    /// back from the device).
    pub fn block_classes(&self, q_blocks: usize, k_blocks: usize) -> Result<Vec<bool>> {
        let s = self.classes.stride;
        let rows = if s[2] == 0 { 1 } else { q_blocks };
        let planes = self.planes[0] * self.planes[1];
        let host = self.classes_to_host(planes * rows * k_blocks)?;
        let mut out = Vec::with_capacity(planes * q_blocks * k_blocks);
        for p in 0..planes {
            for i in 0..q_blocks {
                let row = (p * rows + if rows == 1 { 0 } else { i }) * k_blocks;
                out.extend(host[row..row + k_blocks].iter().map(|&c| c != dmattn_abi::block_class::EMPTY));
            }
        }
        Ok(out)
    }
}

/// Bytes past the last row of the bits and of the classes that a kernel tile overhanging the keys
/// may read (one word, one class; read, never used).
pub(crate) const PAD: usize = 8;

/// Strides of a contiguous `dims` array, zero on size-1 dims.
pub(crate) fn strides(dims: [usize; 4]) -> [u64; 4] {
    let mut s = [0u64; 4];
    let mut acc = 1u64;
    for i in (0..4).rev() {
        s[i] = if dims[i] == 1 { 0 } else { acc };
        acc *= dims[i] as u64;
    }
    s
}

/// A score mask's shape, checked: bool `[{1|b}, {1|hk|h}, {1|sq}, {1|sk}]` or bit-packed bytes
/// `[.., .., {1|sq}, ceil(sk / 8)]`.
fn score_shape(t: &Tensor, packed: bool, sq: usize, sk: usize) -> Result<[usize; 4]> {
    if packed { check_part_shape(t, "packed_bits", U8, sq, sk.div_ceil(8), [true, false]) } else { check_part_shape(t, "mask", Bool, sq, sk, [true, true]) }
}

/// A grid z of `n` (`what`: the mask's planes, or a packed batch's sequences), at most 65535
/// (CUDA's grid z limit), else a typed error naming `arg`.
fn grid_z(arg: &'static str, n: usize, what: &str) -> Result<u32> {
    u16::try_from(n).map(u32::from).map_err(|_| Error::Param { arg, reason: format!("{n} {what} exceed the CUDA backend's limit of 65535") })
}

/// A pack's grid z of `planes` mask planes.
fn pack_planes(arg: &'static str, planes: usize) -> Result<u32> {
    grid_z(arg, planes, "planes (batch entries or sequences times heads)")
}

/// A packed batch's sequences along grid z (as every packed call's kernels take them).
fn sequences_z(seqs: &SeqLens) -> Result<u32> {
    grid_z("seqlens", seqs.batch(), "sequences")
}

/// A score mask packed: (classes, bits, planes), in a new buffer.
fn pack(dev: &CudaDevice, t: &Tensor, packed: bool, sq: usize, sk: usize, bufs: &mut Vec<DeviceBuffer>) -> Result<(View4, View4, [usize; 2])> {
    let [mb, mh, mq, mk] = score_shape(t, packed, sq, sk)?;
    if packed && mk > 1 && t.strides()[3] != 1 {
        return Err(Error::Layout { arg: "packed_bits", backend: BACKEND, reason: "the bytes of a row must be contiguous".into() });
    }
    let (q_blocks, k_blocks) = (mq.div_ceil(BLOCK_MAP_Q as usize), sk.div_ceil(BLOCK_MAP_K as usize));
    // The pack kernel writes every word and every class of this buffer but the padding: a kernel
    // tile overhanging the keys reads a word and a class past the last row (`mask::load_mask_tile`).
    let bits_bytes = 8 * mb * mh * mq * k_blocks + PAD;
    let buf = DeviceBuffer::uninit(dev.stream(), bits_bytes + mb * mh * q_blocks * k_blocks + PAD)?;
    let mut view = broadcast_view(t);
    // A key-broadcast mask is read as sk keys of stride 0, so it packs like any other.
    if mk == 1 {
        view.stride[3] = 0;
    }
    let params = MaskPackParams {
        mask: view,
        classes: View4 { ptr: buf.ptr() + bits_bytes as u64, stride: strides([mb, mh, q_blocks, k_blocks]) },
        bits: View4 { ptr: buf.ptr(), stride: strides([mb, mh, mq, k_blocks]) },
        dims: [mb as u32, mh as u32, mq as u32, sk as u32],
        ..MaskPackParams::default()
    };
    // Planes along grid z; a key-side mask's pack takes every head of a batch entry at once.
    if packed {
        let grid = ((k_blocks as u32).div_ceil(MASK_PACK_BITS_THREADS), q_blocks as u32, pack_planes("packed_bits", mb * mh)?);
        launch(dev, &Launch::kernel(names::MASK_PACK_BITS, grid, MASK_PACK_BITS_THREADS, 0), params)?;
    } else if mq == 1 {
        launch(dev, &Launch::mask_pack_keys(k_blocks as u32, pack_planes("mask", mb)?), params)?;
    } else {
        launch(dev, &Launch::mask_pack((k_blocks as u32, q_blocks as u32, pack_planes("mask", mb * mh)?)), params)?;
    }
    bufs.push(buf);
    Ok((params.classes, params.bits, [mb, mh]))
}

/// A packed batch's bool mask (`layout`: key-side `[total_k, heads]` or query-based `[total_q,
/// heads, max_seqlen_k]`, checked by `Problem::new`) packed per sequence, its planes
/// `[1, heads]`. The bits and classes are laid out so that `Seq::origin` places a sequence's:
/// - key-side: one row per sequence, its words (and classes) at its first key's index, a word
///   per packed key apart (`stride[0]` 1): a sequence of `n` keys has `ceil(n / 64) <= n`
///   words, so they never reach the next sequence's;
/// - query-based: a row of `ceil(max_seqlen_k / 64)` words per packed query, and a sequence's
///   block rows (`ceil(len_q / 64) <= len_q`) from its first query's row likewise.
///
/// Words and classes past a sequence's keys are never read but for the one past a row that a
/// tile overhanging the keys reads and ignores (`PAD` covers the last one).
pub(crate) fn pack_sequences(dev: &CudaDevice, t: &Tensor, layout: PackedLayout, seqs: &SeqLens) -> Result<PreparedMask> {
    let heads = t.shape()[1];
    let (max_q, max_k) = (seqs.max_seqlen_q(), seqs.max_seqlen_k());
    let k_blocks = max_k.div_ceil(BLOCK_MAP_K as usize);
    // Plane strides only where there is more than one head.
    let plane = |n: usize| if heads == 1 { 0 } else { n as u64 };
    let (rows, q_blocks, words, out_stride) = match layout {
        PackedLayout::KeySide => (1, 1, seqs.total_k(), [1, plane(seqs.total_k()), 0, 1]),
        PackedLayout::PerQuery => {
            let n = seqs.total_q() * k_blocks;
            (max_q, max_q.div_ceil(BLOCK_MAP_Q as usize), n, [0, plane(n), k_blocks as u64, 1])
        }
    };
    let bits_bytes = 8 * heads * words + PAD;
    let buf = DeviceBuffer::uninit(dev.stream(), bits_bytes + heads * words + PAD)?;
    let (cu_q, cu_k) = seqs.device_tensors();
    let ptr = |t: &Tensor| t.device_ptr().expect("CUDA tensor");
    let params = MaskPackParams {
        mask: packed_view(t, layout),
        classes: View4 { ptr: buf.ptr() + bits_bytes as u64, stride: out_stride },
        bits: View4 { ptr: buf.ptr(), stride: out_stride },
        dims: [seqs.batch() as u32, heads as u32, rows as u32, max_k as u32],
        _pad: 0,
        seq_rows: (layout == PackedLayout::PerQuery) as u32,
        seqs: Seqs { cu_q: ptr(cu_q), cu_k: ptr(cu_k), ..Seqs::default() },
    };
    match layout {
        // H100, 64 sequences, 2.1M keys, 8 heads: the block-per-CTA pack was most of a decoding
        // call's time.
        PackedLayout::KeySide => launch(dev, &Launch::mask_pack_keys(k_blocks as u32, sequences_z(seqs)?), params)?,
        PackedLayout::PerQuery => launch(dev, &Launch::mask_pack((k_blocks as u32, q_blocks as u32, pack_planes("mask", seqs.batch() * heads)?)), params)?,
    }
    Ok(PreparedMask::new(params.classes, params.bits, [1, heads], vec![buf]))
}

/// A key-side bool mask left as the caller gave it, prepared by each call of a kernel other
/// than the decoding one (not kept: a backward's form would outlive a graph capture it was made
/// in): a decoding call reads the bytes where they are (no launch before it). Either a
/// packed batch's (`[total_k, heads]`) or a fixed-length call's (`[{1|b}, {1|hk|h}, 1, sk]`,
/// left so only where the decoding kernel reads it: see `decode::reads_key_bytes`).
#[derive(Clone)]
pub(crate) struct KeyBytes {
    /// The mask's bytes as the decoding kernel reads them (`DecodeParams::mask_bytes`).
    pub view: View4,
    mask: Tensor,
    rows: KeyRows,
}

/// Whose keys a [`KeyBytes`] mask's are, which decides its prepared form.
#[derive(Clone)]
enum KeyRows {
    /// A packed batch's sequences: packed per sequence.
    Packed(SeqLens),
    /// A fixed-length call's `seqlen_q x seqlen_k`: prepared as any query-broadcast mask
    /// (compacted into key lists for gather attention).
    Fixed(usize, usize),
}

impl KeyBytes {
    /// The caller's mask the bytes are read from.
    pub fn source(&self) -> &Tensor {
        &self.mask
    }

    /// The mask prepared for every kernel but the decoding one: a packed batch's packed as
    /// [`pack_sequences`] packs a key-side one (one launch), a fixed-length call's as
    /// [`prepare`] prepares it (key lists: two launches).
    pub fn prepared(&self, dev: &CudaDevice) -> Result<PreparedMask> {
        match &self.rows {
            KeyRows::Packed(seqs) => pack_sequences(dev, &self.mask, PackedLayout::KeySide, seqs),
            &KeyRows::Fixed(sq, sk) => prepare(dev, &[Part::Dense(self.mask.clone())], sq, sk, Forms { gather: true, lists_band: false }),
        }
    }
}

/// A packed batch's key-side bool mask `t` (`[total_k, heads]`, checked), left unpacked: see
/// [`KeyBytes`].
pub(crate) fn key_side_bytes(t: &Tensor, seqs: &SeqLens) -> PreparedMask {
    let key_bytes = Some(KeyBytes { view: packed_view(t, PackedLayout::KeySide), mask: t.clone(), rows: KeyRows::Packed(seqs.clone()) });
    PreparedMask { key_bytes, ..PreparedMask::without_data([1, t.shape()[1]]) }
}

/// A fixed-length call's query-broadcast bool mask `t` (`[{1|b}, {1|hk|h}, 1, sk]`, checked)
/// for calls of `sq x sk`, left unpacked: see [`KeyBytes`].
pub(crate) fn fixed_key_bytes(t: &Tensor, sq: usize, sk: usize) -> PreparedMask {
    let key_bytes = Some(KeyBytes { view: broadcast_view(t), mask: t.clone(), rows: KeyRows::Fixed(sq, sk) });
    PreparedMask { key_bytes, ..PreparedMask::without_data([t.shape()[0], t.shape()[1]]) }
}

/// A score mask alone in the dense-tile form (block classes and packed bits).
pub(crate) fn pack_score_mask(dev: &CudaDevice, t: &Tensor, packed: bool, sq: usize, sk: usize) -> Result<PreparedMask> {
    let mut bufs = Vec::new();
    let (classes, bits, planes) = pack(dev, t, packed, sq, sk, &mut bufs)?;
    Ok(PreparedMask::new(classes, bits, planes, bufs))
}

/// A block part as kept flags per cell: (cells, cell grid, cell size, block size, planes). Buffers
/// made for it go to `temps`, freed (in stream order) once the classes are built.
fn cells(dev: &CudaDevice, part: &Part, sq: usize, sk: usize, temps: &mut Vec<DeviceBuffer>) -> Result<(View4, [usize; 2], usize, usize, [usize; 2])> {
    Ok(match part {
        Part::Bitset { kept, block } => {
            check_block(*block)?;
            let (rows, cols) = (sq.div_ceil(*block), sk.div_ceil(*block));
            let s = check_part_shape(kept, "block_bitset", Bool, rows, cols, [false, false])?;
            (broadcast_view(kept), [rows, cols], *block, *block, [s[0], s[1]])
        }
        Part::Bcsr { row_ptr, col_idx, block } => {
            let (planes, kept) = bcsr_to_bitset(row_ptr, col_idx, *block, sq, sk)?;
            let (rows, cols) = (sq.div_ceil(*block), sk.div_ceil(*block));
            let buf = DeviceBuffer::from_host(dev.stream(), &kept)?;
            let view = View4 { ptr: buf.ptr(), stride: strides([planes[0], planes[1], rows, cols]) };
            temps.push(buf);
            (view, [rows, cols], *block, *block, planes)
        }
        Part::DenseBlocks { mask, block } => {
            check_block(*block)?;
            let (classes, _, planes) = pack(dev, mask, false, sq, sk, temps)?;
            // A query-broadcast mask's one row of classes (stride 0) serves every query block.
            (classes, [sq.div_ceil(BLOCK_MAP_Q as usize), sk.div_ceil(BLOCK_MAP_K as usize)], BLOCK_MAP_Q as usize, *block, planes)
        }
        Part::Dense(_) | Part::Packed(_) | Part::Indices(_) => unreachable!("score masks are packed, not applied as blocks"),
    })
}

/// The forms [`prepare`] may give a mask besides block classes and bits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Forms {
    /// A query-broadcast score mask alone as gather attention's key lists (never a packed
    /// batch's).
    pub gather: bool,
    /// Per-query index lists alone as the window they are, where they are one
    /// ([`PreparedMask::lists_band`]; not where the mask's band could not take it in).
    pub lists_band: bool,
}

impl Forms {
    /// Block classes and bits only.
    pub const TILES: Forms = Forms { gather: false, lists_band: false };
}

/// Prepares `parts` (ANDed) for calls with `sq` queries and `sk` keys, in the forms `forms` allows.
pub(crate) fn prepare(dev: &CudaDevice, parts: &[Part], sq: usize, sk: usize, forms: Forms) -> Result<PreparedMask> {
    // Index lists are the bit-packed score masks they describe.
    let mut index_bits = None;
    let alone = parts.len() == 1;
    let mut parts_now = Vec::with_capacity(parts.len());
    for p in parts {
        parts_now.push(match p {
            Part::Indices(t) => {
                let shape = crate::sparse::check_indices_shape(t, sq)?;
                let per_query_alone = alone && shape[2] > 1;
                let (bits, summary) = super::gather::indices_to_bits(dev, t, shape, sk, per_query_alone && forms.lists_band)?;
                if let Some(band) = summary.and_then(|s| crate::sparse::lists_band(&s, shape[0] * shape[1], sq, sk)) {
                    // The lists' planes, which calls still check.
                    return Ok(PreparedMask { lists_band: Some(band), ..PreparedMask::without_data([shape[0], shape[1]]) });
                }
                if per_query_alone {
                    index_bits = Some((bits.clone(), shape));
                }
                Part::Packed(bits)
            }
            p => p.clone(),
        });
    }
    let parts: &[Part] = &parts_now;
    let (mut bufs, mut temps) = (Vec::new(), Vec::new());
    let scores: Vec<_> = parts.iter().filter(|p| matches!(p, Part::Dense(_) | Part::Packed(_))).collect();
    if scores.len() > 1 {
        return Err(Error::Unsupported { what: "more than one score mask (dense or packed bits) in one sparse mask".into(), backend: BACKEND });
    }
    // A query-broadcast score mask alone: gather attention.
    if let (true, [part], [Part::Dense(t) | Part::Packed(t)]) = (forms.gather, parts, scores.as_slice()) {
        let packed = matches!(part, Part::Packed(_));
        // Checked here: the compaction declines what it cannot take, with no error of its own.
        score_shape(t, packed, sq, sk)?;
        if let Some(lists) = super::gather::compact(dev, t, packed, sq, sk)? {
            let planes = lists.planes;
            let gather = Some(Arc::new(lists));
            return Ok(PreparedMask { gather, ..PreparedMask::without_data(planes) });
        }
    }
    let (mut classes, bits, mut planes) = match scores.first() {
        Some(Part::Dense(t)) => pack(dev, t, false, sq, sk, &mut bufs)?,
        Some(Part::Packed(t)) => pack(dev, t, true, sq, sk, &mut bufs)?,
        _ => (View4::ABSENT, View4::ABSENT, [1, 1]),
    };
    let mut plane_list = vec![("mask", planes)];
    let (q_blocks, k_blocks) = (sq.div_ceil(BLOCK_MAP_Q as usize), sk.div_ceil(BLOCK_MAP_K as usize));
    // The classes the last block part wrote: the next one reads them, then they are a temporary.
    let mut block_classes: Option<DeviceBuffer> = None;
    for part in parts.iter().filter(|p| !matches!(p, Part::Dense(_) | Part::Packed(_))) {
        let (cells, [cell_rows, cell_cols], cell, block, part_planes) = cells(dev, part, sq, sk, &mut temps)?;
        plane_list.push((part.tensors()[0].0, part_planes));
        planes = combine_planes(plane_list.iter().copied())?;
        let dims = [planes[0], planes[1], q_blocks, k_blocks];
        let total = dims.iter().product::<usize>();
        let out = DeviceBuffer::uninit(dev.stream(), total + PAD)?;
        let params = BlockMaskParams {
            cells,
            cell_rows: cell_rows as u32,
            cell_cols: cell_cols as u32,
            cell: cell as u32,
            block: block as u32,
            classes_in: classes,
            classes: out.ptr(),
            dims: dims.map(|d| d as u32),
        };
        let blocks = total.div_ceil(BLOCK_MASK_THREADS as usize).clamp(1, 65535) as u32;
        launch(dev, &Launch::kernel(names::BLOCK_MASK, (blocks, 1, 1), BLOCK_MASK_THREADS, 0), params)?;
        classes = View4 { ptr: out.ptr(), stride: strides(dims) };
        temps.extend(block_classes.replace(out));
    }
    bufs.extend(block_classes);
    // Blocks only: the kernels copy each visited tile's mask words from the bits unless the
    // block is empty (`mask::load_mask_tile`): one row of all-ones words serves every row.
    let bits = if bits.is_present() || !classes.is_present() {
        bits
    } else {
        let ones = DeviceBuffer::filled(dev.stream(), 8 * k_blocks + PAD, 0xff)?;
        let view = View4 { ptr: ones.ptr(), stride: [0, 0, 0, 1] };
        bufs.push(ones);
        view
    };
    let bytes = bufs.iter().map(DeviceBuffer::bytes).sum();
    let blocks = parts.iter().any(|p| !matches!(p, Part::Dense(_) | Part::Packed(_)));
    Ok(PreparedMask { classes, bits, planes, blocks, gather: None, rows: None, index_bits, key_bytes: None, lists_band: None, bytes, _bufs: bufs.into_iter().map(Arc::new).collect() })
}

/// A mask prepared per sequence (`prepare` at the longest lengths, sequence `b` in plane `b`, or
/// all in plane 0 where `planes[0]` is 1) laid out for the packed batch `seqs` as
/// `pack_sequences` lays out a query-based mask, planes `[1, ph]`: a row of words per packed
/// query and a sequence's block rows from its first query's row (`dmattn_mask_to_seqs`). Bits
/// with one row for every query and sequence (block parts alone, or a score mask of shape `[1,
/// ph, 1, sk]`) are read where they are: `Seq::origin` places every sequence at their row.
pub(crate) fn to_sequences(dev: &CudaDevice, m: &PreparedMask, seqs: &SeqLens) -> Result<PreparedMask> {
    sequences_z(seqs)?;
    let ph = m.planes[1];
    let words = seqs.max_seqlen_k().div_ceil(BLOCK_MAP_K as usize);
    let n = seqs.total_q() * words;
    let stride = [0, if ph == 1 { 0 } else { n as u64 }, words as u64, 1];
    let one_row = m.bits.stride[0] == 0 && m.bits.stride[2] == 0;
    let bits_bytes = if one_row { 0 } else { 8 * ph * n + PAD };
    let buf = DeviceBuffer::uninit(dev.stream(), bits_bytes + ph * n + PAD)?;
    let (cu_q, cu_k) = seqs.device_tensors();
    let ptr = |t: &Tensor| t.device_ptr().expect("CUDA tensor");
    let params = MaskSeqsParams {
        src_bits: m.bits,
        src_classes: m.classes,
        bits: if one_row { View4::ABSENT } else { View4 { ptr: buf.ptr(), stride } },
        classes: View4 { ptr: buf.ptr() + bits_bytes as u64, stride },
        words: words as u32,
        seqs: Seqs { cu_q: ptr(cu_q), cu_k: ptr(cu_k), ..Seqs::default() },
        ..MaskSeqsParams::default()
    };
    // About four words a thread for the longest sequence.
    let x = (seqs.max_seqlen_q() * words).div_ceil(4 * MASK_PACK_THREADS as usize).clamp(1, 1024) as u32;
    launch(dev, &Launch::kernel(names::MASK_TO_SEQS, (x, ph as u32, seqs.batch() as u32), MASK_PACK_THREADS, 0), params)?;
    let mut bufs = vec![Arc::new(buf)];
    if one_row {
        bufs.extend(m.buffer_holding(m.bits.ptr).cloned());
    }
    let bytes = bufs.iter().map(|b| b.bytes()).sum();
    let bits = if one_row { m.bits } else { params.bits };
    Ok(PreparedMask { classes: params.classes, bits, planes: [1, ph], blocks: m.blocks, gather: None, rows: None, index_bits: None, key_bytes: None, lists_band: None, bytes, _bufs: bufs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_planes_past_the_grid_limit_are_typed_errors() {
        assert_eq!(pack_planes("mask", 65535).unwrap(), 65535);
        assert_eq!(pack_planes("mask", 1).unwrap(), 1);
        // 4096 sequences of a 16-head query-based mask.
        match pack_planes("mask", 4096 * 16) {
            Err(Error::Param { arg, reason }) => {
                assert_eq!(arg, "mask");
                assert!(reason.contains("65536 planes"), "{reason}");
            }
            other => panic!("expected a parameter error naming mask, got {other:?}"),
        }
    }
}
