//! The mask's encoding, shared by every kernel that reads one: the 64x64 block map and its
//! classes, the packed bit order of a mask word, and the parameters of the kernels that prepare a
//! mask (packing, block masks).
use crate::{Seqs, View4};

/// Granularity of the mask block map: one class per `BLOCK_MAP_Q x BLOCK_MAP_K` tile. Every
/// kernel tile is a whole number of these, so forward and backward read the same map.
pub const BLOCK_MAP_Q: u32 = 64;

pub const BLOCK_MAP_K: u32 = 64;

/// Class of one mask block.
pub mod block_class {
    /// No visible key: the tile is skipped entirely.
    pub const EMPTY: u8 = 0;
    /// Some keys visible: the mask is applied element by element.
    pub const PARTIAL: u8 = 1;
    /// Every in-bounds element visible: no mask load and no mask math.
    pub const FULL: u8 = 2;

    /// The class of a block in which `any` score is visible and `all` in-bounds ones are.
    pub const fn of(any: bool, all: bool) -> u8 {
        match (any, all) {
            (false, _) => EMPTY,
            (true, true) => FULL,
            (true, false) => PARTIAL,
        }
    }
}

/// Keys per packed mask word.
pub const MASK_WORD_KEYS: u32 = 64;

/// Bit of key `k` (0..64) within its packed mask word. Ordered for the MMA accumulator layout:
/// with `k = 8 nt + 2 t + e` (n8 tile `nt`, quad lane `t`, element `e`), bit `16 t + 2 nt + e`,
/// so each lane finds all of its keys of a row in one 16-bit half-word (`t`).
pub const fn mask_bit(k: u32) -> u32 {
    let (nt, t, e) = (k / 8, (k % 8) / 2, k % 2);
    16 * t + 2 * nt + e
}

/// The packed bits ([`mask_bit`] order) of keys `k..k + 4` from their four mask bytes `x`
/// (little-endian; a nonzero byte is visible), `k` a multiple of 4: a few word operations
/// instead of four byte tests.
pub const fn mask_bits_of_bytes(x: u32, k: u32) -> u64 {
    // 0x80 in each nonzero byte (0x7f + 0x7f carries into no other byte).
    let nonzero = (((x & 0x7f7f_7f7f) + 0x7f7f_7f7f) | x) & 0x8080_8080;
    // Keys k + 1, k + 2, k + 3 sit 1, 16 and 17 bits above key k.
    let spread = ((nonzero >> 7) & 0x0001_0001) | ((nonzero >> 14) & 0x0002_0002);
    (spread as u64) << mask_bit(k)
}

/// A word of 64 keys' bits in key order (bit `k` for key `k`) in [`mask_bit`] order. Key `k =
/// 8 nt + 2 t + e` moves to bit `16 t + 2 nt + e`: the bit index's fields `(nt, t)` trade places,
/// four exchanges of one index bit with another (each a delta swap), not 64 single-bit moves.
pub const fn mask_word_of_bits(bits: u64) -> u64 {
    // Index bit 1 goes to 4, 4 to 2, 2 to 5, 5 to 3 and 3 to 1: exchanging index bit 1 with 4,
    // 2, 5 and 3 in turn takes each to its place. A swap's mask selects the indices with bit 1
    // set and bit j clear; their partners sit 2^j - 2 bits higher.
    const fn swap_mask(j: u32) -> u64 {
        let (mut mask, mut i) = (0u64, 0);
        while i < 64 {
            if i & 2 != 0 && i & (1 << j) == 0 {
                mask |= 1 << i;
            }
            i += 1;
        }
        mask
    }
    const SWAPS: [(u32, u64); 4] = [(4, swap_mask(4)), (2, swap_mask(2)), (5, swap_mask(5)), (3, swap_mask(3))];
    let mut x = bits;
    let mut s = 0;
    while s < SWAPS.len() {
        let (j, mask) = SWAPS[s];
        let delta = (1 << j) - 2;
        let t = ((x >> delta) ^ x) & mask;
        x ^= t ^ (t << delta);
        s += 1;
    }
    x
}

/// Keys `8 nt..8 nt + 8` of a packed mask word ([`mask_bit`] order) as a byte, bit `k` for key
/// `8 nt + k`: the inverse of the packing for one n8 tile's keys.
pub const fn mask_word_byte(word: u64, nt: u32) -> u32 {
    // Key 8 nt + 2 t + e is bit 16 t + 2 nt + e: shifted down by 2 nt, bits 16 t + e; each
    // quad-lane pair moves down to bits 2 t + e.
    let x = (word >> (2 * nt)) & 0x0003_0003_0003_0003;
    ((x | x >> 14 | x >> 28 | x >> 42) & 0xff) as u32
}

/// Parameters of the kernel that prepares a score mask `[mb, mh, mq, sk]` (zero strides where
/// broadcast, a key-broadcast mask given as stride 0 over `sk` keys) for the attention kernels:
/// - `classes`: u8 `[mb, mh, q_blocks, k_blocks]`, one [`block_class`] per 64x64 block;
/// - `bits`: u64 words `[mb, mh, mq, k_blocks]`, the mask packed in [`mask_bit`] order, zero past
///   `sk`;
///
/// each written through its view's strides (in bytes and in words; unit along `k_blocks`).
///
/// A packed batch (`seqs.cu_q` set) gives a mask of each sequence `b` of `mb`: its rows and key 0
/// placed in the mask and in both outputs by the kernels' `Seq::origin` (`stride[0]` per packed
/// key, `stride[2]` per packed query row), its lengths from `seqs`; its rows are its queries
/// where `seq_rows` is set (a query-based mask), else `mq` = 1 row (key-side). Blocks past a
/// sequence's lengths are not written.
///
/// The mask is bool bytes (nonzero = visible) for `dmattn_mask_pack` and `dmattn_mask_pack_keys`,
/// bits for `dmattn_mask_pack_bits` ([`MASK_PACK_BITS_THREADS`]): key `j` of a row is bit `j % 8`
/// of the row's byte `j / 8` (bytes contiguous along the keys, `stride[3]` unused; fixed lengths
/// only). The kernel says which, not a field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MaskPackParams {
    pub mask: View4,
    pub classes: View4,
    pub bits: View4,
    /// `[mb, mh, mq, sk]`; a packed batch's `[sequences, mh, {1|max_seqlen_q}, max_seqlen_k]`.
    pub dims: [u32; 4],
    pub _pad: u32,
    pub seq_rows: u32,
    pub seqs: Seqs,
}

/// Parameters of the kernel that applies a block mask to the 64x64 block classes: output class
/// `[pb, ph, qb, kb]` (contiguous, `dims`) is EMPTY unless the mask's block holding it is kept,
/// else the per-score part's class (`classes_in`, broadcast through zero strides) or FULL without
/// one. The block mask is given as kept flags (u8, nonzero = kept) of `cell`-sized cells
/// `[pb, ph, cell_rows, cell_cols]` (zero strides where broadcast); a block of `block` scores
/// (`block` a multiple of `cell`) is kept if any of its cells is, which turns 64x64 classes into a
/// 128x128 block mask.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockMaskParams {
    pub cells: View4,
    pub cell_rows: u32,
    pub cell_cols: u32,
    pub cell: u32,
    pub block: u32,
    pub classes_in: View4,
    pub classes: u64,
    /// `[pb, ph, q_blocks, k_blocks]` of the output.
    pub dims: [u32; 4],
}

/// Parameters of the kernel that lays a mask prepared per sequence out for a packed batch. Its
/// u64 bits `[pb, ph, {1|max_seqlen_q}, words]` and u8 classes `[pb, ph, {1|q_blocks}, words]`
/// (`src_*`, zero strides where broadcast; sequence `b` reads plane `b`, or plane 0 where `pb`
/// is 1) are copied into `bits` and `classes`, where the kernels' `Seq::origin` places sequence
/// `b`'s rows and its 64-query block rows from its first query's (the layout [`MaskPackParams`]
/// gives a packed batch's query-based mask). Rows past a sequence's queries are not copied;
/// with `bits.ptr` 0 only the classes are (the host reads bits with one row for every row where
/// they are). Grid `(x, ph, sequences)`, [`MASK_PACK_THREADS`] threads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MaskSeqsParams {
    pub src_bits: View4,
    pub src_classes: View4,
    pub bits: View4,
    pub classes: View4,
    /// Words (and classes) per row: `ceil(max_seqlen_k / 64)`.
    pub words: u32,
    pub _pad: u32,
    pub seqs: Seqs,
}

/// Threads per block of the block-mask kernel (one output class each).
pub const BLOCK_MASK_THREADS: u32 = 256;

/// Threads per block of the mask-pack kernel: 4 per row of a 64x64 block.
pub const MASK_PACK_THREADS: u32 = 256;

/// Words (64 keys of every head) each warp of the key-side mask pack (`dmattn_mask_pack_keys`)
/// takes in turn.
pub const MASK_PACK_KEYS_WORDS: u32 = 4;

/// Threads per block of the mask-pack kernel for bits: one 64-key word (column of a block row) each.
pub const MASK_PACK_BITS_THREADS: u32 = 128;
