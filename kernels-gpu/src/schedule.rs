//! Which CTA runs which query tile. Under a mask, query tiles visit very different numbers of
//! key tiles; run in grid order, the last wave is whatever is left, and SMs idle while a few
//! heavy tiles finish. This pass orders the forward's grid heaviest first (longest processing
//! time first), so the light tiles fill the gaps at the end. The work count reads the block map
//! through the same `MapRows` and limits the forward walks.
use crate::arch::*;
use crate::block_info::BlockInfo;
use crate::mask::{MapRows, TileLine};
use dmattn_abi::{FWD_ORDER_BUCKETS, FWD_ORDER_WARPS, FwdOrderParams, packed_position};

const THREADS: u32 = 32 * FWD_ORDER_WARPS;
/// Buckets each thread owns in the sort's prefix sum (consecutive ones).
const BUCKETS_PER_THREAD: u32 = FWD_ORDER_BUCKETS / THREADS;

/// The work order of a `BM x BN` forward (modifier variant, no splits). Each warp counts the key
/// tiles of one forward CTA, its lanes classifying 32 tiles at a time; the CTA that finishes
/// last sorts all the counts (one launch, not a count pass and a sort pass).
#[inline(always)]
pub unsafe fn fwd_order<const BM: usize, const BN: usize>(p: &FwdOrderParams) {
    const { assert!(FWD_ORDER_BUCKETS % THREADS == 0) };
    let f = &p.fwd;
    let tid = thread_idx();
    let lane = tid % 32;
    let grid = [f.seqlen_q.div_ceil(BM as u32), f.heads, f.batch];
    let items = grid[0] * grid[1] * grid[2];
    let item = block_idx().0 * FWD_ORDER_WARPS + tid / 32;
    if item < items {
        let (bx, rest) = (item % grid[0], item / grid[0]);
        let b = BlockInfo::at::<true>(f, BM as u32, grid[0], (bx, rest % f.heads, rest / f.heads));
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
            fence_acq_rel_gpu();
        }
    }
    // The last CTA to take a ticket sees every count (fence, ticket; ticket, fence).
    sync_threads();
    let last = tid == 0 && unsafe { atom_add_gpu_u32(p.ticket, 1) } == grid_dim_x() - 1;
    if sync_threads_or(last) {
        fence_acq_rel_gpu();
        unsafe { sort(p, grid, tid) };
        if tid == 0 {
            unsafe { *(p.ticket as *mut u32) = 0 };
        }
    }
}

/// Counting sort of the `grid` positions by their counts, heaviest first. Positions of equal
/// work keep roughly their grid order (neighbouring query tiles of a head share its K/V in L2),
/// though not exactly: slots within a bucket go by atomics.
#[inline(always)]
unsafe fn sort(p: &FwdOrderParams, [gx, gy, gz]: [u32; 3], tid: u32) {
    let items = gx * gy * gz;
    let counts = smem_base();
    let warp_totals = counts + 4 * FWD_ORDER_BUCKETS;
    let own = counts + 4 * BUCKETS_PER_THREAD * tid;
    let bucket = |i: u32| {
        // Other CTAs wrote the counts: a strong load, never a stale cached copy.
        let work = unsafe { ld_acquire_u32(p.work + 4 * i as u64) };
        counts + 4 * (FWD_ORDER_BUCKETS - 1 - work.min(FWD_ORDER_BUCKETS - 1))
    };
    for r in 0..BUCKETS_PER_THREAD {
        unsafe { st_shared_u32(own + 4 * r, 0) };
    }
    sync_threads();
    let mut i = tid;
    while i < items {
        unsafe { atom_add_shared_u32(bucket(i), 1) };
        i += THREADS;
    }
    sync_threads();

    // Exclusive prefix sum: each thread's buckets, then across lanes by shuffles, then warps.
    let (lane, warp) = (tid % 32, tid / 32);
    let mut total = 0;
    for r in 0..BUCKETS_PER_THREAD {
        total += unsafe { ld_shared_u32(own + 4 * r) };
    }
    let mut inclusive = total;
    let mut delta = 1;
    while delta < 32 {
        let below = shfl_up_u32(inclusive, delta);
        if lane >= delta {
            inclusive += below;
        }
        delta *= 2;
    }
    if lane == 31 {
        unsafe { st_shared_u32(warp_totals + 4 * warp, inclusive) };
    }
    sync_threads();
    let mut first = inclusive - total;
    for w in 0..warp {
        first += unsafe { ld_shared_u32(warp_totals + 4 * w) };
    }
    for r in 0..BUCKETS_PER_THREAD {
        let count = unsafe { ld_shared_u32(own + 4 * r) };
        unsafe { st_shared_u32(own + 4 * r, first) };
        first += count;
    }
    sync_threads();

    let mut i = tid;
    while i < items {
        let slot = unsafe { atom_add_shared_u32(bucket(i), 1) };
        unsafe { *(p.order as *mut u64).add(slot as usize) = packed_position(i % gx, (i / gx) % gy, i / gx / gy) };
        i += THREADS;
    }
}
