//! Applies a block mask (a block bitset or BCSR, given as kept flags per cell) to the 64x64
//! block classes the attention kernels read: a 64x64 block outside every kept block becomes
//! EMPTY and is never visited; inside one it keeps the per-score part's class, or is FULL (no
//! per-score work at all) where there is none.
use crate::arch::*;
use dmattn_abi::{BLOCK_MAP_K, BLOCK_MAP_Q, BLOCK_MASK_THREADS, BlockMaskParams, block_class};

/// One thread per output class, grid-stride over `[pb, ph, q_blocks, k_blocks]`.
#[inline(always)]
pub unsafe fn block_mask(p: &BlockMaskParams) {
    let [pb, ph, qbs, kbs] = p.dims;
    let total = pb as u64 * ph as u64 * qbs as u64 * kbs as u64;
    let mut at = block_idx().0 as u64 * BLOCK_MASK_THREADS as u64 + thread_idx() as u64;
    let step = grid_dim_x() as u64 * BLOCK_MASK_THREADS as u64;
    while at < total {
        let kb = (at % kbs as u64) as u32;
        let qb = (at / kbs as u64 % qbs as u64) as u32;
        let plane = at / (kbs as u64 * qbs as u64);
        let (b, h) = (plane / ph as u64, plane % ph as u64);
        unsafe { *(p.classes as *mut u8).add(at as usize) = class(p, b, h, qb, kb) };
        at += step;
    }
}

/// The class of 64x64 block `(qb, kb)` of plane `(b, h)`.
#[inline(always)]
fn class(p: &BlockMaskParams, b: u64, h: u64, qb: u32, kb: u32) -> u8 {
    let c = &p.cells;
    let plane = c.ptr + b * c.stride[0] + h * c.stride[1];
    // The block holding this 64x64 one, and the cells covering that block.
    let per_block = p.block / p.cell;
    let (q_cell0, k_cell0) = (qb * BLOCK_MAP_Q / p.block * per_block, kb * BLOCK_MAP_K / p.block * per_block);
    let mut kept = false;
    for i in 0..per_block.min(p.cell_rows.saturating_sub(q_cell0)) {
        for j in 0..per_block.min(p.cell_cols.saturating_sub(k_cell0)) {
            let at = plane + (q_cell0 + i) as u64 * c.stride[2] + (k_cell0 + j) as u64 * c.stride[3];
            kept |= unsafe { ld_global_nc_u8(at) } != 0;
        }
    }
    if !kept {
        return block_class::EMPTY;
    }
    let m = &p.classes_in;
    if !m.is_present() {
        return block_class::FULL;
    }
    let at = m.ptr + b * m.stride[0] + h * m.stride[1] + qb as u64 * m.stride[2] + kb as u64 * m.stride[3];
    unsafe { ld_global_nc_u8(at) as u8 }
}
