//! Per-query index lists run over each query's own keys (`SparseMask::indices` with a query
//! dimension). Prepared once: each row's keys laid out ascending with padding and repeats dropped,
//! read off the bit mask the lists describe (`dmattn_lists_from_bits`, [`ListBitsParams`]). The forward (`dmattn_lists_fwd_<elem>_d<dim>`,
//! [`ListsParams`]) gives each warp one query and the query heads that share its list: its 16
//! MMA rows are those heads, and its key tiles are the next [`LISTS_KEYS`] listed keys the band
//! shows that query, K and V rows copied by index. Work is O(queries x listed keys), whatever
//! the lists' pattern, where the dense-tile path visits every tile some query of 64 lists a key in.

use crate::{FwdParams, View4};

/// Warps (queries) per CTA of the lists forward.
pub const LISTS_WARPS: u32 = 4;
pub const LISTS_THREADS: u32 = 32 * LISTS_WARPS;
/// Listed keys per key tile.
pub const LISTS_KEYS: u32 = 16;
/// Query heads sharing a list that one warp takes (its MMA rows).
pub const LISTS_ROWS: u32 = 16;
pub const LISTS_BITS_THREADS: u32 = 256;
/// Dynamic shared memory of `dmattn_lists_from_bits`: a round's keys (32 a word, a word a
/// thread) and the block scan's 33 words.
pub const LISTS_BITS_SMEM: u32 = 4 * (32 * LISTS_BITS_THREADS + 33);
/// Head dims with a lists forward (at d192 and d256 a warp's output rows alone fill most of its
/// registers: those run on dense tiles).
pub const LISTS_HEAD_DIMS: [u32; 4] = [32, 64, 96, 128];

/// Parameters of `dmattn_lists_from_bits` ([`crate::names::LISTS_FROM_BITS`]): grid `(rows, ph,
/// pb)` of [`LISTS_BITS_THREADS`] threads and [`LISTS_BITS_SMEM`] bytes of dynamic shared
/// memory. Row `(b, h, i)` of `bits` (the lists' keep table `[pb, ph, rows, sk]`, one bit a key:
/// key `j` at bit `j % 32` of u32 word `j / 32`, `row_words` words a row, rows contiguous) is
/// written to `out` (contiguous `[pb, ph, rows, width]`) as its kept keys ascending, then -1 to
/// the row's end; its count of keys to `counts` (`[pb, ph, rows]`). A row keeps at most `width`
/// keys (its list's width, or `seqlen_k` if less).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ListBitsParams {
    pub bits: u64,
    pub out: u64,
    pub counts: u64,
    pub row_words: u32,
    /// `min(w, seqlen_k)`.
    pub width: u32,
}

/// Parameters of `dmattn_lists_fwd_<elem>_d<dim>[_mods]` ([`crate::names::LISTS_FWD_PREFIX`]): grid
/// `(ceil(seqlen_q / LISTS_WARPS), kv_heads * units, batch)` of [`LISTS_THREADS`] threads and
/// [`lists_smem_bytes`] of dynamic shared memory. Warp `w` of CTA `x` takes query `x *
/// LISTS_WARPS + w` and unit `u = y % units` of kv head `y / units`: query heads `kv_head *
/// kv_group + u * rows ..` (at most `rows` of them, within the group). `fwd` is the forward's (no
/// packed batch, paged K/V, splits, work order or mask bits: the lists are the mask); the bias is
/// read at the listed keys, any broadcast.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ListsParams {
    pub fwd: FwdParams,
    /// The sorted lists (I32, `[pb, ph, seqlen_q, min(w, seqlen_k)]`, zero strides where broadcast) and
    /// their counts (U32, the same with `stride[3]` 0).
    pub lists: View4,
    pub counts: View4,
    /// List head plane = query head / this.
    pub list_head_div: u32,
    /// Query heads a warp takes: [`LISTS_ROWS`] or fewer where the group is smaller, 1 where
    /// every query head has its own list.
    pub rows: u32,
    /// Units per kv head: `ceil(kv_group / rows)`.
    pub units: u32,
    pub _pad: u32,
}

/// Dynamic shared memory of a lists-forward CTA at `head_dim`, per warp: its Q tile
/// ([`LISTS_ROWS`] rows), two slots of K and V tiles, the queue of listed keys (64 entries), and
/// the online softmax's state.
pub const fn lists_smem_bytes(head_dim: u32) -> u32 {
    LISTS_WARPS * lists_warp_bytes(head_dim)
}

/// One warp's share of [`lists_smem_bytes`] (a multiple of 128 bytes: tiles stay aligned).
pub const fn lists_warp_bytes(head_dim: u32) -> u32 {
    let tiles = (LISTS_ROWS + 4 * LISTS_KEYS) * head_dim * 2;
    tiles + 4 * LISTS_QUEUE + 32 * 2 * 2 * 4
}

/// Entries of a warp's queue of listed keys: a scan round adds at most 32 to fewer than
/// [`LISTS_KEYS`] waiting, and a tile's entries stay put until its copies have been issued.
pub const LISTS_QUEUE: u32 = 64;
