//! Which CTA runs which query tile. Under a mask, query tiles visit very different numbers of
//! key tiles; run in grid order, the last wave is whatever is left, and SMs idle while a few
//! heavy tiles finish. These two passes order the forward's grid heaviest first (longest
//! processing time first), so the light tiles fill the gaps at the end. The work count reads the
//! block map through the same `MapRows` and limits the forward walks.
use crate::arch::*;
use crate::block_info::BlockInfo;
use crate::mask::{MapRows, TileLine};
use dmattn_abi::{FWD_WORK_WARPS, FwdWorkParams, TILE_ORDER_BUCKETS, TILE_ORDER_THREADS, TileOrderParams, packed_position};

/// Key tiles visited by each CTA of a `BM x BN` forward (modifier variant, no splits): one warp
/// per grid position, its lanes classifying 32 key tiles at a time.
#[inline(always)]
pub unsafe fn fwd_work<const BM: usize, const BN: usize>(p: &FwdWorkParams) {
    let f = &p.fwd;
    let lane = thread_idx() % 32;
    let item = block_idx().0 * FWD_WORK_WARPS + thread_idx() / 32;
    let grid_x = f.seqlen_q.div_ceil(BM as u32);
    if item >= grid_x * f.heads * f.batch {
        return;
    }
    let (bx, rest) = (item % grid_x, item / grid_x);
    let b = BlockInfo::at::<true>(f, BM as u32, grid_x, (bx, rest % f.heads, rest / f.heads));
    let map = MapRows::<BM, BN>::new(&f.block_map, b.block_map(), b.m_block, &b.vis);
    let (mut n, end) = b.key_tiles(map.end());
    let mut tiles = 0;
    while n < end {
        let t = n + lane;
        tiles += ballot(t < end && map.classify(t).0).count_ones();
        n += 32;
    }
    if lane == 0 {
        unsafe { *(p.work as *mut u32).add(item as usize) = tiles };
    }
}

/// Counting sort of the grid positions by work, heaviest first (one CTA, one bucket per
/// thread). Positions of equal work keep roughly their grid order (neighbouring query tiles of
/// a head share its K/V in L2), though not exactly: slots within a bucket go by atomics.
#[inline(always)]
pub unsafe fn tile_order(p: &TileOrderParams) {
    const { assert!(TILE_ORDER_THREADS == TILE_ORDER_BUCKETS && TILE_ORDER_THREADS % 32 == 0) };
    let tid = thread_idx();
    let [gx, gy, gz] = p.grid;
    let items = gx * gy * gz;
    let counts = smem_base();
    let warp_totals = counts + 4 * TILE_ORDER_BUCKETS;
    let bucket = |i: u32| {
        let work = unsafe { ld_global_nc_u32(p.work + 4 * i as u64) };
        counts + 4 * (TILE_ORDER_BUCKETS - 1 - work.min(TILE_ORDER_BUCKETS - 1))
    };
    unsafe { st_shared_u32(counts + 4 * tid, 0) };
    sync_threads();
    let mut i = tid;
    while i < items {
        unsafe { atom_add_shared_u32(bucket(i), 1) };
        i += TILE_ORDER_THREADS;
    }
    sync_threads();

    // Exclusive prefix sum of the counts: within each warp by shuffles, then across warps.
    let (lane, warp) = (tid % 32, tid / 32);
    let count = unsafe { ld_shared_u32(counts + 4 * tid) };
    let mut inclusive = count;
    for delta in [1, 2, 4, 8, 16] {
        let below = shfl_up_u32(inclusive, delta);
        if lane >= delta {
            inclusive += below;
        }
    }
    if lane == 31 {
        unsafe { st_shared_u32(warp_totals + 4 * warp, inclusive) };
    }
    sync_threads();
    let mut first = inclusive - count;
    for w in 0..warp {
        first += unsafe { ld_shared_u32(warp_totals + 4 * w) };
    }
    unsafe { st_shared_u32(counts + 4 * tid, first) };
    sync_threads();

    let mut i = tid;
    while i < items {
        let slot = unsafe { atom_add_shared_u32(bucket(i), 1) };
        let at = packed_position(i % gx, (i / gx) % gy, i / gx / gy);
        unsafe { *(p.order as *mut u64).add(slot as usize) = at };
        i += TILE_ORDER_THREADS;
    }
}
