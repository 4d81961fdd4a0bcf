//! Where one CTA's operands live: its (batch, head, query tile) and the base address of each
//! operand, derived from the kernel parameters and the block index.
//!
//! Kernels rebuild this at the top of every main-loop iteration from [`opaque`] indices: LLVM
//! would otherwise hoist every address out of the loop and hold it in a register across it (a
//! dozen 64-bit values, enough to push a 4-warp tile into spills), while recomputing them costs a
//! few integer multiply-adds per iteration.
use crate::arch::{block_idx, div, grid_dim_x, ld_global_nc_u64, ld_shared_u32, opaque, st_shared_v2};
use crate::mask::Visibility;
use crate::seq::Seq;
use dmattn_abi::{FwdParams, flags, packed_position, unpacked_position};

#[derive(Clone, Copy)]
pub struct BlockInfo<'a> {
    pub p: &'a FwdParams,
    seq: Seq,
    head: u32,
    /// Splits of the key sequence (0 or 1: none, or not compiled in) and this CTA's.
    splits: u32,
    split: u32,
    pub m_block: u32,
    /// First query row of the tile.
    pub row0: u32,
    /// Rows of the tile inside the sequence (see [`Self::has_rows`]).
    pub rows_valid: u32,
    pub vis: Visibility,
}

impl<'a> BlockInfo<'a> {
    /// For the CTA running this code at grid position `at` (see [`position`]).
    #[inline(always)]
    pub fn new<const MODS: bool, const PACKED: bool>(p: &'a FwdParams, block_m: u32, at: (u32, u32, u32)) -> Self {
        Self::at::<MODS, PACKED>(p, block_m, grid_dim_x(), at)
    }

    /// For grid position `(bx, head, z)` of a grid `grid_x` query tiles wide. `MODS` compiles
    /// split-KV in (the modifier variant; the lean one has no registers left), `PACKED` packed
    /// batches (their own variant: the sequence's bounds and origin are loads, where a
    /// fixed-length kernel's fold into constants).
    #[inline(always)]
    pub fn at<const MODS: bool, const PACKED: bool>(p: &'a FwdParams, block_m: u32, grid_x: u32, (bx, head, z): (u32, u32, u32)) -> Self {
        // Heaviest query tiles (the last ones, under causal) start first.
        let m_block = grid_x - 1 - bx;
        let row0 = m_block * block_m;
        let (batch, split) = if MODS && p.splits > 1 { (z / p.splits, z % p.splits) } else { (z, 0) };
        let seq = Seq::of::<PACKED>(p, batch);
        Self {
            p,
            seq,
            head,
            splits: if MODS { p.splits } else { 0 },
            split,
            m_block,
            row0,
            rows_valid: seq.len_q.wrapping_sub(row0),
            vis: Visibility::new(seq.len_q, seq.len_k, p.band),
        }
    }

    /// Whether the tile has rows in its sequence: always in a fixed-length call; in a packed
    /// batch, the grid spans the longest sequence and a shorter one's tiles past its end have
    /// none (the CTA returns at once).
    #[inline(always)]
    pub fn has_rows(&self) -> bool {
        self.row0 < self.seq.len_q
    }

    /// Key rows in the sequence.
    #[inline(always)]
    pub fn keys(&self) -> u32 {
        self.seq.len_k
    }

    /// Whether this CTA is one split of its row tile's keys.
    #[inline(always)]
    fn split_on(&self) -> bool {
        self.splits > 1
    }

    #[inline(always)]
    fn kv_head(&self) -> u64 {
        div(self.head, self.p.kv_group) as u64
    }

    #[inline(always)]
    fn mask_head(&self) -> u64 {
        div(self.head, self.p.mask_head_div) as u64
    }

    /// The coordinates (innermost first: column, head, row, batch) of the query tile's first
    /// element in q's tensor map and of key `col0`'s in K's and V's (`FwdTmaParams`), for a
    /// fixed-length call.
    #[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
    #[inline(always)]
    pub fn tma_coords(&self, col0: u32) -> ([u32; 4], [u32; 4]) {
        let batch = self.seq.batch as u32;
        ([0, self.head, self.row0, batch], [0, self.kv_head() as u32, col0, batch])
    }

    /// Byte address of row 0 of the query tile in q (rows `2 * q.stride[1]` bytes apart).
    #[inline(always)]
    pub fn q(&self) -> u64 {
        let q = &self.p.q;
        q.ptr + 2 * (self.seq.q_offset(&q.stride, self.row0) + self.head as u64 * q.stride[2])
    }

    /// Byte address of row 0 of the query tile in o.
    #[inline(always)]
    pub fn o(&self) -> u64 {
        let o = &self.p.o;
        let split = self.split as u64 * self.p.o_split_stride;
        o.ptr + 2 * (split + self.seq.q_offset(&o.stride, self.row0) + self.head as u64 * o.stride[2])
    }

    /// The key tiles this CTA covers of its row tile's `begin..end`: all of them, or its split's
    /// share, `split_tiles` from `begin` per split, or where that is 0 (gather attention, whose
    /// tile count the host does not know) an even share of `begin..end`.
    #[inline(always)]
    pub fn key_tiles(&self, begin: u32, end: u32) -> (u32, u32) {
        if self.split_on() {
            let per = if self.p.split_tiles != 0 { self.p.split_tiles } else { (end - begin).div_ceil(self.splits) };
            let first = begin + self.split * per;
            (first, end.min(first + per))
        } else {
            (begin, end)
        }
    }

    /// Byte offset of this (batch, head)'s plane in the gathered keys' ranks and positions.
    #[inline(always)]
    fn key_plane(&self) -> u64 {
        let r = &self.p.key_ranks;
        4 * (self.seq.batch * r.batch + div(self.head, r.head_div) as u64 * r.head)
    }

    /// Byte address of this (batch, head)'s key ranks (gather attention).
    #[inline(always)]
    pub fn key_ranks(&self) -> u64 {
        self.p.key_ranks.ptr + self.key_plane()
    }

    /// Byte address of this (batch, head)'s kept keys' positions (gather attention).
    #[inline(always)]
    pub fn key_pos(&self) -> u64 {
        self.p.key_pos + self.key_plane()
    }

    /// Byte address of key 0 of this head's kv head in k.
    #[inline(always)]
    pub fn k(&self) -> u64 {
        let k = &self.p.k;
        k.ptr + 2 * (self.seq.k_offset(&k.stride, 0) + self.kv_head() * k.stride[2])
    }

    #[inline(always)]
    pub fn v(&self) -> u64 {
        let v = &self.p.v;
        v.ptr + 2 * (self.seq.k_offset(&v.stride, 0) + self.kv_head() * v.stride[2])
    }

    /// Paged K/V (`dmattn_abi::Seqs::block_table`, the paged forward variant): byte address of
    /// this head's kv head in row 0 of page 0 of k or v (`t`); [`Self::paged_row`] adds a key's.
    #[inline(always)]
    pub fn paged_base(&self, t: &dmattn_abi::View4) -> u64 {
        t.ptr + 2 * self.kv_head() * t.stride[2]
    }

    /// Paged K/V: the byte offset from [`Self::paged_base`] (k or v, of strides `stride`) of the
    /// row holding the sequence's key `j` (looked up per row copied: holding a tile's pages
    /// spilled the Hopper kernels, and the table's line stays in L1).
    #[inline(always)]
    pub fn paged_row(&self, stride: &[u64; 4], j: u32) -> u64 {
        2 * self.seq.paged_offset(self.p, stride, j)
    }

    /// Byte address of the bias at (row0, the sequence's key 0) (a packed batch's, see
    /// `Seq::origin`).
    #[inline(always)]
    pub fn bias(&self) -> u64 {
        let b = &self.p.bias;
        let head = div(self.head, self.p.bias_head_div) as u64;
        b.ptr + 2 * (self.seq.origin(&b.stride) + head * b.stride[1] + self.row0 as u64 * b.stride[2])
    }

    /// Byte address of the packed mask word of (row0, the sequence's key 0).
    #[inline(always)]
    pub fn mask_bits(&self) -> u64 {
        let m = &self.p.mask_bits;
        m.ptr + 8 * (self.seq.origin(&m.stride) + self.mask_head() * m.stride[1] + self.row0 as u64 * m.stride[2])
    }

    /// Byte address of this (sequence, head)'s block-map plane.
    #[inline(always)]
    pub fn block_map(&self) -> u64 {
        let m = &self.p.block_map;
        m.ptr + self.seq.origin(&m.stride) + self.mask_head() * m.stride[1]
    }

    /// Index of the LSE of the tile's row `r`.
    #[inline(always)]
    pub fn lse_index(&self, r: u32) -> u64 {
        let split = self.split as u64 * self.p.lse_split_stride;
        split + self.seq.lse_index(self.p, self.head, self.row0 + r)
    }
}

/// This CTA's grid position `(bx, by, bz)`: its block index, or in the modifier variant where
/// the work order sends it, which is also stored at shared address `slot` (a `packed_position`;
/// every thread stores the same value) for [`reread_position`].
#[inline(always)]
pub fn position<const MODS: bool>(p: &FwdParams, slot: u32) -> (u32, u32, u32) {
    let (bx, by, bz) = block_idx();
    if !MODS {
        return (bx, by, bz);
    }
    let at = if p.order != 0 {
        let linear = bx + grid_dim_x() * (by + p.heads * bz);
        unsafe { ld_global_nc_u64(p.order + 8 * linear as u64) }
    } else if p.flags & flags::HEADS_FIRST != 0 {
        let linear = bx + grid_dim_x() * by;
        let tile = div(linear, p.heads);
        packed_position(tile, linear - tile * p.heads, bz)
    } else {
        packed_position(bx, by, bz)
    };
    unsafe { st_shared_v2(slot, [at as u32, (at >> 32) as u32]) };
    unpacked_position(at)
}

/// [`position`] again, from opaque sources (the stored copy, or the block index), so that LLVM
/// holds nothing derived from it across a main loop; a barrier must separate it from the store.
#[inline(always)]
pub fn reread_position<const MODS: bool>(slot: u32) -> (u32, u32, u32) {
    if MODS {
        let slot = opaque(slot);
        let (lo, hi) = unsafe { (ld_shared_u32(slot), ld_shared_u32(slot + 4)) };
        unpacked_position(lo as u64 | (hi as u64) << 32)
    } else {
        let (bx, by, bz) = block_idx();
        (opaque(bx), opaque(by), opaque(bz))
    }
}
