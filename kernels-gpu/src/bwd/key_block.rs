//! Where a backward CTA works: its (key tile, kv head, batch) from the grid or the work order,
//! and the addresses of the operands' rows and elements it reads and writes.
use crate::arch::*;
use crate::mask::Visibility;
use dmattn_abi::{BwdParams, packed_position, unpacked_position};

/// The CTA's key tile, kv head and batch, and the addresses derived from them; rebuilt from
/// opaque indices inside loops (see `block_info`).
#[derive(Clone, Copy)]
pub(super) struct KeyBlock<'a> {
    pub(super) p: &'a BwdParams,
    pub(super) n_block: u32,
    pub(super) kv_head: u32,
    pub(super) batch: u32,
    pub(super) col0: u32,
    pub(super) keys_valid: u32,
    pub(super) vis: Visibility,
}

impl<'a> KeyBlock<'a> {
    /// The CTA's key block at grid position `(n_block, kv_head, batch)` (see [`position`]).
    #[inline(always)]
    /// `BAND`: the kernel takes any band, else only none or causal (see `Visibility::of_band`).
    pub(super) fn at<const BAND: bool>(p: &'a BwdParams, block_n: u32, (n_block, kv_head, batch): (u32, u32, u32)) -> Self {
        let f = &p.fwd;
        let col0 = n_block * block_n;
        KeyBlock { p, n_block, kv_head, batch, col0, keys_valid: f.seqlen_k - col0, vis: Visibility::of_band::<BAND>(f) }
    }

    /// [`Self::at`] the CTA's position again, from opaque sources so that LLVM holds nothing
    /// derived from it across the main loop: where `placed`, the copy [`position`] stored at
    /// shared address `slot`, else the block index. (The forward's `reread_position` does the
    /// same; calling it here instead reordered the d96/d128 kernels' code into 4-20 bytes of
    /// spills.)
    #[inline(always)]
    pub(super) fn reread<const BAND: bool>(p: &'a BwdParams, block_n: u32, placed: bool, swaps: bool, slot: u32) -> Self {
        let at = if placed {
            let slot = opaque(slot);
            let (lo, hi) = unsafe { (ld_shared_u32(slot), ld_shared_u32(slot + 4)) };
            unpacked_position(lo as u64 | (hi as u64) << 32)
        } else {
            let (x, y, z) = grid_position(p, swaps);
            (opaque(x), opaque(y), opaque(z))
        };
        Self::at::<BAND>(p, block_n, at)
    }

    /// Query head `hg` of the group.
    #[inline(always)]
    pub(super) fn head(&self, hg: u32) -> u32 {
        self.kv_head * self.p.fwd.kv_group + hg
    }

    /// The head of a mask or bias operand with head divisor `head_div` that query head `h` of
    /// this CTA's group reads: `h / head_div` without the division (a dependent chain of ~25
    /// instructions per use and step), as the host's divisors are 1 or the group size.
    #[inline(always)]
    pub(super) fn operand_head(&self, h: u32, head_div: u32) -> u32 {
        if head_div == 1 { h } else { self.kv_head }
    }

    /// Byte address of key row `col0` of a `[b, sk, hk, d]` operand of `elem` bytes.
    #[inline(always)]
    pub(super) fn kv_row(&self, t: &dmattn_abi::View4, elem: u64) -> u64 {
        t.ptr + elem * (self.batch as u64 * t.stride[0] + self.kv_head as u64 * t.stride[2] + self.col0 as u64 * t.stride[1])
    }

    /// Byte address of row `row0` of head `h` of a `[b, sq, h, d]` operand of `elem` bytes.
    #[inline(always)]
    pub(super) fn q_row(&self, t: &dmattn_abi::View4, h: u32, row0: u32, elem: u64) -> u64 {
        t.ptr + elem * (self.batch as u64 * t.stride[0] + h as u64 * t.stride[2] + row0 as u64 * t.stride[1])
    }

    /// Index of row `row` of head `h` in lse and delta (`dmattn_abi::Seqs::lse_rows`; a packed
    /// sequence's bases are moved to its rows, see `seq::localize`).
    #[inline(always)]
    pub(super) fn row_index(&self, h: u32, row: u32) -> u64 {
        (self.batch as u64 * self.p.fwd.heads as u64 + h as u64) * self.p.fwd.seqs.lse_rows as u64 + row as u64
    }

    /// Element address of (head `h`, query `row`, key column `col0 + c`) in a broadcast
    /// `[b, h, sq, sk]` operand with `elem`-byte elements, heads mapped through `head_div`.
    #[inline(always)]
    pub(super) fn broadcast_at(&self, t: &dmattn_abi::View4, head_div: u32, h: u32, row: u32, c: u32, elem: u64) -> u64 {
        let s = t.stride;
        t.ptr
            + elem
                * (self.batch as u64 * s[0]
                    + self.operand_head(h, head_div) as u64 * s[1]
                    + row as u64 * s[2]
                    + (self.col0 + c) as u64 * s[3])
    }
}

/// This CTA's (key tile, kv head, batch). Where `placed` (`modifiers::bwd_placed`): where the
/// work order sends it (`fwd.order`), else its block index, the grid's x and y swapped where
/// `kv_heads_first`; then also stored at shared address `slot` for [`KeyBlock::reread`] (every
/// thread stores the same value; a barrier follows before the loop reads it back). Elsewhere
/// the block index ([`grid_position`]): held across the main loop, a stored copy costs
/// registers (ptxas reads the block index's special registers again at will) that the kernels
/// at the limit do not have.
#[inline(always)]
pub(super) fn position(p: &BwdParams, placed: bool, swaps: bool, slot: u32) -> (u32, u32, u32) {
    if !placed {
        return grid_position(p, swaps);
    }
    let (bx, by, bz) = block_idx();
    let (x, y, z) = if p.fwd.order != 0 {
        let (gx, gy) = (grid_dim_x(), grid_dim_y());
        unpacked_position(unsafe { ld_global_nc_u64(p.fwd.order + 8 * (bx + gx * (by + gy * bz)) as u64) })
    } else {
        (bx, by, bz)
    };
    let at = if p.kv_heads_first != 0 { (y, x, z) } else { (x, y, z) };
    let packed = packed_position(at.0, at.1, at.2);
    unsafe { st_shared_v2(slot, [packed as u32, (packed >> 32) as u32]) };
    at
}

/// The block index as (key tile, kv head, batch): x and y swapped where the variant `swaps`
/// (`modifiers::bwd_swaps`) and the call runs `kv_heads_first` (CTAs key tile by key tile, each
/// kv head's heaviest first under a causal-like band).
#[inline(always)]
pub(super) fn grid_position(p: &BwdParams, swaps: bool) -> (u32, u32, u32) {
    let (x, y, z) = block_idx();
    if swaps && p.kv_heads_first != 0 { (y, x, z) } else { (x, y, z) }
}

