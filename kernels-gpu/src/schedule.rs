//! Which CTA runs which tile. Under a mask, tiles visit very different numbers of tiles of the
//! other side; run in grid order, the last wave is whatever is left, and SMs idle while a few
//! heavy CTAs finish. This pass orders a grid heaviest first (longest processing time first),
//! so the light CTAs fill the gaps at the end: the forward's (query tiles, each visiting key
//! tiles) and the backward's (key tiles, each visiting query tiles). The counts read the block
//! map through the same `MapRows` / `MapCols` and limits the kernels' walks do.
use crate::arch::*;
use crate::block_info::BlockInfo;
use crate::mask::{MapCols, MapRows, TileLine, Visibility, block_map_plane, map_planes};
use dmattn_abi::{BLOCK_MAP_Q, ORDER_BUCKETS, ORDER_WARPS, OrderParams, packed_position};

const THREADS: u32 = 32 * ORDER_WARPS;
/// Buckets each thread owns in the sort's prefix sum (consecutive ones).
const BUCKETS_PER_THREAD: u32 = ORDER_BUCKETS / THREADS;

/// The work order of a `BM x BN` forward (modifier variant, no splits): a CTA's work is the key
/// tiles its query tile visits.
#[inline(always)]
pub unsafe fn fwd_order<const BM: usize, const BN: usize>(p: &OrderParams) {
    let f = &p.fwd;
    let grid = [f.seqlen_q.div_ceil(BM as u32), f.heads, f.batch];
    unsafe {
        order(p, grid, false, |bx, head, batch, lane| {
            let b = BlockInfo::at::<true, false>(f, BM as u32, grid[0], (bx, head, batch));
            let map = MapRows::<BM, BN>::new(&f.block_map, b.block_map(), b.m_block, &b.vis);
            let (begin, end) = b.key_tiles(0, map.end());
            visited(&map, map.next_candidate(begin), end, lane)
        })
    }
}

/// The work order of a backward with `BN`-key tiles: a CTA's work is the query tiles its key
/// tile visits, counted in block-map rows (the query tile only scales it).
#[inline(always)]
pub unsafe fn bwd_order<const BN: usize>(p: &OrderParams) {
    let f = &p.fwd;
    let (n_blocks, kv_heads) = (f.seqlen_k.div_ceil(BN as u32), f.heads / f.kv_group);
    let kv_first = p.kv_heads_first != 0;
    let grid = if kv_first { [kv_heads, n_blocks, f.batch] } else { [n_blocks, kv_heads, f.batch] };
    unsafe {
        order(p, grid, true, |x, y, batch, lane| {
            let (n_block, kv_head) = if kv_first { (y, x) } else { (x, y) };
            let vis = Visibility::of(f);
            let map = MapCols::<{ BLOCK_MAP_Q as usize }, BN>::new(&f.block_map, block_map_plane(f, batch, kv_head), map_planes(f), n_block, &vis);
            visited(&map, vis.query_tile_begin(n_block * BN as u32, BLOCK_MAP_Q), map.end(), lane)
        })
    }
}

/// The tiles of `line` from `begin` to `end` that are visited, counted by a warp 32 at a time.
#[inline(always)]
fn visited(line: &impl TileLine, begin: u32, end: u32, lane: u32) -> u32 {
    let (mut n, mut tiles) = (begin, 0);
    while n < end {
        let t = n + lane;
        tiles += ballot(t < end && line.classify(t).0).count_ones();
        n += 32;
    }
    tiles
}

/// Each warp counts the work of one CTA of `grid` (`work(x, y, z, lane)`, warp-collective); the
/// CTA that finishes last sorts all the counts (one launch, not a count pass and a sort pass),
/// or where `keeps_balanced` and the counts vary little (`balanced`) keeps the grid order.
#[inline(always)]
unsafe fn order(p: &OrderParams, grid: [u32; 3], keeps_balanced: bool, work: impl Fn(u32, u32, u32, u32) -> u32) {
    const { assert!(ORDER_BUCKETS % THREADS == 0) };
    let tid = thread_idx();
    let lane = tid % 32;
    let items = grid[0] * grid[1] * grid[2];
    let item = block_idx().0 * ORDER_WARPS + tid / 32;
    if item < items {
        let (x, rest) = (item % grid[0], item / grid[0]);
        let tiles = work(x, rest % grid[1], rest / grid[1], lane);
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
        if keeps_balanced && unsafe { balanced(p, grid, tid) } {
            unsafe { keep_grid_order(p, grid, tid) };
        } else {
            unsafe { sort(p, grid, tid) };
        }
        if tid == 0 {
            unsafe { *(p.ticket as *mut u32) = 0 };
        }
    }
}

/// Whether the counts of `grid` vary little: a coefficient of variation under 1/4. There the
/// backward's grid order, neighbouring key tiles of a kv head side by side sharing Q and dO in
/// L2, beats heaviest first; where work varies a lot (causal-like masks), heaviest first wins.
/// H200, d128 b2 h32 hk8, backward, grid order against heaviest first: 50 % random 128-blocks at
/// 8K (variation about 0.1) 7.8 against 8.05 ms; compressed causal (4) as a dense mask, 16K x 4K
/// (about 0.55), 9.8 against 8.45. CTA-collective.
#[inline(always)]
unsafe fn balanced(p: &OrderParams, [gx, gy, gz]: [u32; 3], tid: u32) -> bool {
    let items = gx * gy * gz;
    let (mut sum, mut squares) = (0f32, 0f32);
    let mut i = tid;
    while i < items {
        let w = unsafe { ld_acquire_u32(p.work + 4 * i as u64) } as f32;
        sum += w;
        squares += w * w;
        i += THREADS;
    }
    let (sum, squares) = (warp_sum(sum), warp_sum(squares));
    // The counters' space, before the sort (if any) zeroes it.
    let partial = smem_base();
    let warp = tid / 32;
    if tid % 32 == 0 {
        unsafe {
            st_shared_u32(partial + 8 * warp, sum.to_bits());
            st_shared_u32(partial + 8 * warp + 4, squares.to_bits());
        }
    }
    sync_threads();
    let (mut sum, mut squares) = (0f32, 0f32);
    for w in 0..ORDER_WARPS {
        sum += f32::from_bits(unsafe { ld_shared_u32(partial + 8 * w) });
        squares += f32::from_bits(unsafe { ld_shared_u32(partial + 8 * w + 4) });
    }
    sync_threads();
    let mean = sum / items as f32;
    16.0 * (squares / items as f32 - mean * mean) < mean * mean
}

/// Linear block index `i` of a grid `gx` wide and `gy` high as a [`packed_position`].
#[inline(always)]
fn grid_position(i: u32, gx: u32, gy: u32) -> u64 {
    packed_position(i % gx, (i / gx) % gy, i / gx / gy)
}

/// The identity order: CTA `i` runs grid position `i`.
#[inline(always)]
unsafe fn keep_grid_order(p: &OrderParams, [gx, gy, gz]: [u32; 3], tid: u32) {
    let items = gx * gy * gz;
    let mut i = tid;
    while i < items {
        unsafe { *(p.order as *mut u64).add(i as usize) = grid_position(i, gx, gy) };
        i += THREADS;
    }
}

/// Counting sort of the `grid` positions by their counts, heaviest first. Positions of equal
/// work keep roughly their grid order (neighbouring query tiles of a head share its K/V in L2),
/// though not exactly: slots within a bucket go by atomics.
#[inline(always)]
unsafe fn sort(p: &OrderParams, [gx, gy, gz]: [u32; 3], tid: u32) {
    let items = gx * gy * gz;
    let counts = smem_base();
    let warp_totals = counts + 4 * ORDER_BUCKETS;
    let own = counts + 4 * BUCKETS_PER_THREAD * tid;
    let bucket = |i: u32| {
        // Other CTAs wrote the counts: a strong load, never a stale cached copy.
        let work = unsafe { ld_acquire_u32(p.work + 4 * i as u64) };
        counts + 4 * (ORDER_BUCKETS - 1 - work.min(ORDER_BUCKETS - 1))
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
    let inclusive = warp_scan(total, lane);
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
        unsafe { *(p.order as *mut u64).add(slot as usize) = grid_position(i, gx, gy) };
        i += THREADS;
    }
}
