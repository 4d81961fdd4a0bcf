//! Gather attention's data movement: key compaction, row gathers and scatters, the gathered
//! problem's mask, index lists.
use crate::{Band, View4};

/// Parameters of the key-compaction kernels (a count pass, then the compaction, both over chunks
/// of `COMPACT_THREADS x COMPACT_KEYS_PER_THREAD` keys): for each plane `[mb, mh]` of a
/// query-broadcast mask (`[mb, mh, 1, sk]`, bool bytes, or bits as in [`MaskPackParams::packed`](crate::MaskPackParams::packed)),
/// the kept keys' indices in ascending order (`pos`, i32 `[planes, sk]`, -1 past the count), the
/// kept keys at or before each key (`ranks`, i32 `[planes, sk]`: a kept key `j`'s slot in `pos` is
/// `ranks[j] - 1`, see [`ScatterParams::ranks`]) and the count (`counts`, u32 `[planes]`); `chunk_counts`
/// (u32 `[planes, chunks]`) passes each chunk's count from the first pass to the second. Planes
/// are `plane_stride` elements apart (`sk` rounded up to a 64-key block: a gathered problem's
/// keys, read from `pos`, are whole blocks; -1 past the count up to the stride).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyCompactParams {
    pub mask: View4,
    pub pos: u64,
    pub ranks: u64,
    pub counts: u64,
    pub chunk_counts: u64,
    /// `[mb, mh, sk]`.
    pub dims: [u32; 3],
    pub packed: u32,
    pub plane_stride: u32,
    pub _pad: u32,
}

/// Threads per block of the key-compaction kernels (one block per chunk of a plane) and the keys
/// each thread takes.
pub const COMPACT_THREADS: u32 = 64;

pub const COMPACT_KEYS_PER_THREAD: u32 = 16;

/// Which compacted key list an operand's `(batch, head)` reads: the list of plane
/// `(x * batch, (y / head_div) * head)` (strides in i32 elements, zero where broadcast). A null
/// `ptr` is the identity list (entry `c` is `c`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyLists {
    pub ptr: u64,
    pub batch: u64,
    pub head: u64,
    pub head_div: u32,
    pub _pad: u32,
}

/// Parameters of the row-gather kernel: output row `(x, y, q, c)` of `dims` (`row_bytes` bytes,
/// at `dst + x dst_stride[0] + y dst_stride[1] + q dst_stride[2] + c dst_stride[3]`, byte strides)
/// is source row `(x, y / src_head_div, q, lists[c])` (zero strides where broadcast), or zeros
/// past the list's end (-1). Copied in `unit`-byte pieces (16, or 2 where a row or stride is not
/// 16-byte aligned). Gathers K and V rows and a bias's key columns.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GatherParams {
    pub src: u64,
    pub src_stride: [u64; 4],
    pub dst: u64,
    pub dst_stride: [u64; 4],
    /// `[X, Y, Q, W]` of the output.
    pub dims: [u32; 4],
    pub row_bytes: u32,
    pub unit: u32,
    pub src_head_div: u32,
    /// 1: rows past a list's end are left unwritten (a gathered forward reads none of them)
    /// instead of zeroed.
    pub skip_missing: u32,
    pub lists: KeyLists,
}

/// Parameters of the scatter kernel, the gather's adjoint: output row `(x, y, q, j)` of `dims`
/// (`row_elems` 16-bit elements, byte strides) is the sum over the source rows
/// `(x ratio[0] + a, y ratio[1] + b, q, slot(j))`, `a < ratio[0]`, `b < ratio[1]`, whose key list
/// holds key `j`, in that fixed order (f32 sums; zero where none does). Key `j`'s slot comes from
/// the plane's ranks (`ranks` read at `(x ratio[0] + a, y ratio[1] + b)`): `ranks[j] - 1` where
/// key `j` is kept (`ranks[j] > ranks[j - 1]`, or `ranks[0] > 0`); a null `ranks` is the
/// identity (slot `j`). Writes dK, dV and dbias from their gathered forms.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ScatterParams {
    pub src: u64,
    pub src_stride: [u64; 4],
    pub dst: u64,
    pub dst_stride: [u64; 4],
    /// `[X, Y, Q, sk]` of the output.
    pub dims: [u32; 4],
    pub ratio: [u32; 2],
    pub row_elems: u32,
    pub unit: u32,
    /// The kept keys at or before each key (`KeyCompactParams::ranks`) by source plane.
    pub ranks: KeyLists,
}

/// Parameters of the kernel that writes the mask of a gathered problem: for each plane
/// `[mb, mh]`, block classes `[mb, mh, q_blocks, k_blocks]` and bits `[mb, mh, sq, k_blocks]` (as
/// [`MaskPackParams`](crate::MaskPackParams) writes them, every word written) over the `k_blocks * 64` gathered keys,
/// compacted key `c` of plane `p` being original key `pos[p][c]` (ascending, -1 past the count):
/// visible to query `i` iff `band` shows original key `pos[c]` to it in a problem of `seqlen_q`
/// queries and `seqlen_k` keys.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GatherMaskParams {
    pub pos: u64,
    /// Elements between planes' key lists.
    pub pos_plane: u64,
    pub classes: u64,
    pub bits: u64,
    pub band: Band,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub q_blocks: u32,
    pub k_blocks: u32,
}

/// Parameters of the kernel that turns index lists (`attn_indices`: i32 `[pb, ph, rows, w]` through
/// element strides, -1 = padding) into bit-packed score masks: key `j` of row `r` is bit `j % 32` of
/// u32 word `r * row_words + j / 32` of `bits` (the packed-bits byte order): `dmattn_indices_row_bits`
/// writes whole rows, `dmattn_indices_bits` ORs entries into bits zeroed before. An entry below -1
/// or at or past `seqlen_k` sets `error` to 1. Where `band` is not 0, `dmattn_indices_row_bits`
/// also gathers what tells whether the lists are a window about the diagonal into the
/// [`ListsBand`] there (rows `rows` = `seqlen_q`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IndicesParams {
    pub indices: View4,
    pub bits: u64,
    pub error: u64,
    pub band: u64,
    /// `[pb, ph, rows, w]`.
    pub dims: [u32; 4],
    pub seqlen_k: u32,
    pub row_words: u32,
}

/// Per-query index lists summed up row by row (every plane's rows), to tell whether every row's
/// keys are exactly a window `i + sk - sq - left ..= i + sk - sq + right` clipped to the keys
/// (the host decides, `sparse::lists_band`). `diag` is a row's `i + sk - sq`, `first` and `last`
/// its least and greatest key. Every field but the first two is a maximum (a minimum kept
/// negated), [`ListsBand::NONE`] before any row: the kernel raises each with an atomic max.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListsBand {
    /// Not 0 where some row's keys are not one run of consecutive keys.
    pub broken: u32,
    /// Rows with no key.
    pub empty_rows: u32,
    /// `diag - first` over rows whose first key is past key 0 (the window's left side where
    /// it is not clipped): greatest, and least negated.
    pub left_max: i32,
    pub left_min_neg: i32,
    /// `last - diag` over rows whose last key is before key `sk - 1`.
    pub right_max: i32,
    pub right_min_neg: i32,
    /// The greatest `diag` of rows whose keys start at key 0.
    pub clipped_left_diag: i32,
    /// The least `diag` of rows whose keys end at key `sk - 1`, negated.
    pub clipped_right_diag_neg: i32,
    /// The rows with keys: the greatest index, and the least negated.
    pub last_row: i32,
    pub first_row_neg: i32,
}

impl ListsBand {
    /// Before any row.
    pub const NONE: Self = ListsBand {
        broken: 0,
        empty_rows: 0,
        left_max: i32::MIN,
        left_min_neg: i32::MIN,
        right_max: i32::MIN,
        right_min_neg: i32::MIN,
        clipped_left_diag: i32::MIN,
        clipped_right_diag_neg: i32::MIN,
        last_row: i32::MIN,
        first_row_neg: i32::MIN,
    };

    /// The fields as the 32-bit words they are in memory, in order (`broken` and `empty_rows`
    /// as their bits).
    pub fn to_words(&self) -> [i32; 10] {
        let s = self;
        [s.broken as i32, s.empty_rows as i32, s.left_max, s.left_min_neg, s.right_max, s.right_min_neg, s.clipped_left_diag, s.clipped_right_diag_neg, s.last_row, s.first_row_neg]
    }

    /// The inverse of [`ListsBand::to_words`].
    pub fn from_words(w: [i32; 10]) -> Self {
        let [broken, empty_rows, left_max, left_min_neg, right_max, right_min_neg, clipped_left_diag, clipped_right_diag_neg, last_row, first_row_neg] = w;
        ListsBand { broken: broken as u32, empty_rows: empty_rows as u32, left_max, left_min_neg, right_max, right_min_neg, clipped_left_diag, clipped_right_diag_neg, last_row, first_row_neg }
    }
}

/// The longest row of bits (bytes) `dmattn_indices_row_bits` builds in shared memory: 48 KiB,
/// 393,216 keys, within what every kernel may take without opting in.
pub const INDICES_ROW_SMEM: u32 = 48 * 1024;

/// Threads per block of the gather, scatter and gathered-mask kernels.
pub const GATHER_THREADS: u32 = 256;
