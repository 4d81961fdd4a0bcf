//! Decoding: the forward for calls whose queries are few. One CTA takes one sequence's queries for
//! all the query heads of one kv head (its rows are `query * kv_group + head in the group`), so
//! that each K and V row is read once per kv head rather than once per query head, and none of a
//! 64-row tile is spent on rows that do not exist. A key-side mask's kept keys are compacted as
//! the CTA goes: it scans the mask (its packed bits, or a packed batch's bool bytes as the caller
//! gave them), [`DECODE_SCAN_KEYS`] keys a round, into a queue of kept positions, and each key
//! tile is the next [`DECODE_KEYS`] of them, K, V and bias read at those positions: a hidden key
//! costs a bit or a byte, never a row.

use crate::FwdParams;

/// Query rows of a decoding CTA (a kv group's heads times a sequence's queries fit in them).
pub const DECODE_ROWS: u32 = 64;
/// Kept keys per key tile.
pub const DECODE_KEYS: u32 = 64;
pub const DECODE_THREADS: u32 = 128;
/// Keys each scan round examines: 8 per thread (one byte of a packed mask word, or 8 bool bytes).
pub const DECODE_SCAN_KEYS: u32 = 8 * DECODE_THREADS;
/// Entries of the queue of kept key positions (u32): a round adds at most [`DECODE_SCAN_KEYS`]
/// to fewer than [`DECODE_KEYS`] waiting, and the entries of the tiles in flight stay put until
/// their CTA has moved on.
pub const DECODE_QUEUE: u32 = 2 * DECODE_SCAN_KEYS;
/// Keys per split are a multiple of this (whole scan rounds).
pub const DECODE_SPLIT_ALIGN: u32 = DECODE_SCAN_KEYS;
/// Head dims up to this read a key-side mask's bytes (`DecodeParams::mask_bytes`); past it the
/// kernels take packed bits only (a round's bytes read ahead are 6 registers more than its word,
/// and the d192 kernels spilled).
pub const DECODE_MASK_BYTES_DIMS: u32 = 128;
/// Head dims with a decoding kernel.
pub const DECODE_HEAD_DIMS: [u32; 6] = [32, 64, 96, 128, 192, 256];

/// Parameters of `dmattn_decode_<elem>_d<dim>[_paged]` ([`crate::names::DECODE_PREFIX`]): grid
/// `(kv_heads, splits, batch)` of [`DECODE_THREADS`] threads and
/// [`decode_smem_bytes`] of dynamic shared memory. `fwd` is the forward's (packed batches and
/// paged K/V as there; `fwd.splits`, `o_split_stride`, `lse_split_stride` as for the split-KV
/// combine), with these restrictions, which the host checks: `kv_group * seqlen_q <=`
/// [`DECODE_ROWS`] (the longest sequence's queries); a mask, if any, has no query dimension and
/// no block parts, with 1 or `kv_heads` heads: packed bits (`mask_bits`, `stride[2] == 0`, one
/// word per 64 keys) or bool bytes (`mask_bytes`); a bias, if any, has no query dimension and
/// 1 or `kv_heads` heads; the band has no sinks and no compression.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeParams {
    pub fwd: FwdParams,
    /// Keys per split, a multiple of [`DECODE_SPLIT_ALIGN`]: split `s` (grid y) scans its
    /// sequence's keys `s * split_keys..(s + 1) * split_keys`.
    pub split_keys: u32,
    pub _pad: u32,
    /// A packed batch's key-side bool mask read as it is, a byte a key, at head dims up to
    /// [`DECODE_MASK_BYTES_DIMS`] (absent: `fwd.mask_bits`, if present, is the mask): laid out
    /// as a key-side bias is (`stride[1]` between heads, `stride[3]` between keys, a sequence's
    /// first key at `Seq::origin`), heads as `fwd.mask_head_div` divides them. The decoding
    /// call then needs no pack launch before it (H100, the 64-sequence decode batch: 16-18 us
    /// of its 0.41 ms).
    pub mask_bytes: crate::View4,
}

/// Dynamic shared memory of a decoding CTA at `head_dim`: Q, two slots of K and V tiles, two bias
/// rows, the queue of kept keys, the scan's 33 words, the online softmax's running state, then
/// (paged K/V) the pages of a tile's keys.
pub const fn decode_smem_bytes(head_dim: u32) -> u32 {
    let tiles = (DECODE_ROWS + 4 * DECODE_KEYS) * head_dim * 2;
    let bias = 2 * DECODE_KEYS * 2;
    let softmax = DECODE_THREADS * 2 * 2 * 4;
    tiles + bias + 4 * DECODE_QUEUE + 4 * 33 + softmax + 4 * DECODE_KEYS
}
