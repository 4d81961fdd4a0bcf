//! The Hopper forward for lean calls (no mask, bias or softcap; the band, GQA, fixed lengths or
//! a packed batch), warp-specialised (sm_90a). A producer warpgroup copies Q and a ring of K and
//! V tiles (`cp.async`) and announces each on an `mbarrier`; two consumer warpgroups, 64 query
//! rows each, wait for them alone (no CTA-wide barrier in the loop) and run S = QKᵀ and O += PV
//! on `wgmma`. Each consumer keeps two products in flight: key tile i's QKᵀ and tile i-1's PV are
//! issued together, and tile i's softmax runs while PV still multiplies (FlashAttention-3's
//! intra-warpgroup overlap); and the two consumers take turns issuing ([`Turns`], its ping-pong),
//! so that one's softmax runs under the other's products. The producer hands most of its
//! registers to the consumers (`setmaxnreg`).
use crate::arch::*;
use crate::block_info::BlockInfo;
use crate::elem::{Elem, wgmma_wait};
use crate::fwd::write_output;
use crate::gemm::{pack_p, wgmma_pv, wgmma_tiles};
use crate::mask::KeyTiles;
use crate::scores::{Mods, WarpScores};
use crate::softmax::OnlineSoftmax;
use crate::tile::SmemTile;
use dmattn_abi::{FWD_WS_CONSUMER_REGS, FWD_WS_PRODUCER_REGS, FWD_WS_STAGES, FwdParams, modifiers};

const STAGES: u32 = FWD_WS_STAGES;
const PRODUCERS: u32 = 128;
const CONSUMERS: u32 = 256;

/// The barriers, by role: Q landed; per ring slot, its K (V) tile landed (`FULL_*`, the
/// producer's threads arrive once their copies have) or read (`EMPTY_*`, the consumers' threads
/// arrive once their products have).
const BAR_Q: u32 = 0;
const FULL_K: u32 = 1;
const FULL_V: u32 = FULL_K + STAGES;
const EMPTY_K: u32 = FULL_V + STAGES;
const EMPTY_V: u32 = EMPTY_K + STAGES;
const BARRIERS: u32 = EMPTY_V + STAGES;

/// The consumers' barrier before the epilogue's store (0 is the CTA's).
const EPILOGUE_BARRIER: u32 = 1;

/// The consumer warpgroups take turns issuing their products (FlashAttention-3's ping-pong):
/// warpgroup `w` waits on barrier `TURN + w` before issuing and then lets the other go, so
/// that one's softmax runs while the other's products keep the tensor cores busy.
const TURN: u32 = 2;

/// A consumer warpgroup's turns at issuing products (see [`TURN`]).
#[derive(Clone, Copy)]
struct Turns {
    group: u32,
}

impl Turns {
    /// Warpgroup 1 starts by letting warpgroup 0 have the first turn.
    #[inline(always)]
    fn new(group: u32) -> Self {
        if group == 1 {
            named_barrier_arrive(TURN, CONSUMERS);
        }
        Turns { group }
    }

    /// Waits for this warpgroup's turn.
    #[inline(always)]
    fn take(self) {
        named_barrier(TURN + self.group, CONSUMERS);
    }

    /// Hands the turn over; `last`: this warpgroup's final turn, after which warpgroup 1 owes
    /// warpgroup 0 nothing (warpgroup 0 takes as many turns as it was given).
    #[inline(always)]
    fn pass(self, last: bool) {
        if !(last && self.group == 1) {
            named_barrier_arrive(TURN + (self.group ^ 1), CONSUMERS);
        }
    }
}

/// Shared memory: Q, the K ring, the V ring, the consumers' softmax state, the barriers
/// (`FwdTile::smem_bytes`).
#[derive(Clone, Copy)]
struct Smem {
    q: SmemTile,
    ring: u32,
    tile_bytes: u32,
    softmax: u32,
    bars: u32,
}

impl Smem {
    #[inline(always)]
    fn new<const D: usize, const BM: usize, const BN: usize>() -> Self {
        let q = SmemTile::new(smem_base(), BM, D * 2);
        let tile_bytes = (BN * D * 2) as u32;
        let ring = q.base + q.bytes();
        let softmax = ring + 2 * STAGES * tile_bytes;
        Self { q, ring, tile_bytes, softmax, bars: softmax + CONSUMERS * 16 }
    }

    #[inline(always)]
    fn k<const D: usize, const BN: usize>(&self, slot: u32) -> SmemTile {
        SmemTile::new(self.ring + slot * self.tile_bytes, BN, D * 2)
    }

    #[inline(always)]
    fn v<const D: usize, const BN: usize>(&self, slot: u32) -> SmemTile {
        SmemTile::new(self.ring + (STAGES + slot) * self.tile_bytes, BN, D * 2)
    }

    /// Barrier `role` (of slot `slot`, for the ring's).
    #[inline(always)]
    fn bar(&self, role: u32, slot: u32) -> u32 {
        self.bars + 8 * (role + slot)
    }
}

/// The `i`-th key tile visited: its ring slot, and the parity of that slot's barrier phase
/// (the slot's round).
#[derive(Clone, Copy)]
struct Ring(u32);

impl Ring {
    #[inline(always)]
    fn slot(self) -> u32 {
        self.0 % STAGES
    }

    #[inline(always)]
    fn parity(self) -> u32 {
        (self.0 / STAGES) & 1
    }

    /// The parity a producer waits on for the slot to be free: the previous round's (a fresh
    /// barrier's previous phase counts as complete).
    #[inline(always)]
    fn free_parity(self) -> u32 {
        self.parity() ^ 1
    }
}

/// The key tiles the query tile visits: the band's (the sink tiles, then an interval).
#[inline(always)]
fn key_tiles<const BM: usize, const BN: usize>(b: &BlockInfo) -> KeyTiles {
    b.vis.key_tiles(b.row0, BM as u32, BN as u32)
}

/// Waits for this thread's copies but the newest group, makes them visible to `wgmma` (the
/// async proxy) and arrives on `bar`: the group before the newest has landed.
#[inline(always)]
unsafe fn announce(bar: u32) {
    cp_async_wait_group::<1>();
    fence_proxy_async();
    unsafe { mbarrier_arrive(bar) };
}

/// The producer warpgroup (`ptid` 0..128): Q, then each visited key tile's K and V into the
/// next ring slot once the consumers have freed it. Copies go in as groups Q, K0, V0, K1, ...;
/// after issuing one it announces the one before, so one copy is always in flight.
#[inline(always)]
unsafe fn produce<const D: usize, const BM: usize, const BN: usize, const PACKED: bool>(p: &FwdParams, sm: &Smem, ptid: u32) {
    let b = BlockInfo::new::<false, PACKED>(p, BM as u32, block_idx());
    let tiles = key_tiles::<BM, BN>(&b);
    let row_bytes = (D * 2) as u32;
    let (k_row, v_row) = (2 * p.k.stride[1], 2 * p.v.stride[1]);
    unsafe { sm.q.load_async(b.q(), 2 * p.q.stride[1], b.rows_valid, row_bytes, ptid, PRODUCERS) };
    cp_async_commit();
    let mut pending = sm.bar(BAR_Q, 0);
    let mut n = tiles.next_candidate(0);
    let mut i = 0;
    while n < tiles.end {
        let (r, col0) = (Ring(i), n * BN as u32);
        let keys = b.keys() - col0;
        unsafe {
            mbarrier_wait(sm.bar(EMPTY_K, r.slot()), r.free_parity());
            sm.k::<D, BN>(r.slot()).load_async(b.k() + col0 as u64 * k_row, k_row, keys, row_bytes, ptid, PRODUCERS);
            cp_async_commit();
            announce(pending);
            mbarrier_wait(sm.bar(EMPTY_V, r.slot()), r.free_parity());
            sm.v::<D, BN>(r.slot()).load_async(b.v() + col0 as u64 * v_row, v_row, keys, row_bytes, ptid, PRODUCERS);
            cp_async_commit();
            announce(sm.bar(FULL_K, r.slot()));
        }
        pending = sm.bar(FULL_V, r.slot());
        n = tiles.next_candidate(n + 1);
        i += 1;
    }
    cp_async_wait_all();
    fence_proxy_async();
    unsafe { mbarrier_arrive(pending) };
}

/// One consumer warp's view: its rows, its warpgroup's, and its lane's place in them.
#[derive(Clone, Copy)]
struct Rows {
    /// The warp's first row in the tile (16 rows a warp).
    warp_row0: u32,
    /// Its warpgroup's first row (64 rows a warpgroup).
    group_row0: u32,
    lane: u32,
}

/// Key tile `n`'s score start values in `s`: -inf where the band or the key bound hide a
/// score, else 0.
#[inline(always)]
fn start_scores<E: Elem, const BM: usize, const BN: usize, const NT: usize>(b: &BlockInfo, sm: &Smem, at: Rows, s: &mut [[[f32; 4]; NT]; 1], n: u32) {
    let col0 = n * BN as u32;
    let check = b.vis.tile_needs_check(b.row0, b.rows_valid.min(BM as u32), col0, BN as u32);
    let band = b.vis.at_tile(b.row0, col0).shifted(at.warp_row0 + at.lane / 4, 2 * (at.lane % 4)).rows_bits::<1>(check);
    // No bias or mask: the start values are the band's alone (the bias tile is never read).
    let warp = WarpScores::new::<NT>(sm.q, false, 0, 0, at.warp_row0, 0, at.lane);
    warp.init::<E, 1, NT>(s, &Mods::of(b.p, modifiers::NONE), &band, check, false);
}

/// Waits for the tile of barrier `role` (`FULL_K` or `FULL_V`) at ring position `r` to land.
#[inline(always)]
fn landed(sm: &Smem, role: u32, r: Ring) {
    unsafe { mbarrier_wait(sm.bar(role, r.slot()), r.parity()) };
}

/// S += QKᵀ over the K tile at ring position `r` (landed), for the warpgroup's rows; committed,
/// not waited for.
#[inline(always)]
fn issue_scores<E: Elem, const D: usize, const BN: usize, const NT: usize, const KT: usize>(sm: &Smem, at: Rows, s: &mut [[[f32; 4]; NT]; 1], r: Ring) {
    let k = sm.k::<D, BN>(r.slot());
    wgmma_tiles::<E, NT, KT, 0, 0>(&mut s[0], |ks| sm.q.wgmma_k_major(at.group_row0, ks), |ks| k.wgmma_k_major(0, ks));
}

/// O += P V over the V tile at ring position `r` (landed); committed, not waited for.
#[inline(always)]
fn issue_pv<E: Elem, const D: usize, const BN: usize, const KP: usize, const DT: usize>(sm: &Smem, o: &mut [[f32; 4]; DT], p: &[[u32; 4]; KP], r: Ring) {
    wgmma_pv::<E, KP, DT>(o, p, sm.v::<D, BN>(r.slot()));
}

/// A consumer thread (`ctid` 0..256): its warpgroup's 64 rows through every visited key tile,
/// then the epilogue.
#[inline(always)]
unsafe fn consume<E: Elem, const D: usize, const BM: usize, const BN: usize, const NT: usize, const KT: usize, const DT: usize, const KP: usize, const PACKED: bool>(
    p: &FwdParams,
    sm: &Smem,
    ctid: u32,
) {
    let b = BlockInfo::new::<false, PACKED>(p, BM as u32, block_idx());
    let lane = ctid % 32;
    let warp_row0 = (ctid / 32) * 16;
    let at = Rows { warp_row0, group_row0: warp_row0 & !63, lane };
    let softmax = OnlineSoftmax::<1>::at(sm.softmax, ctid, CONSUMERS);
    softmax.reset();
    let scale = p.scale_log2;
    let tiles = key_tiles::<BM, BN>(&b);
    let mut o = [[[0f32; 4]; DT]; 1];
    let mut s = [[[0f32; 4]; NT]; 1];
    unsafe { mbarrier_wait(sm.bar(BAR_Q, 0), 0) };
    let mut n = tiles.next_candidate(0);
    if n < tiles.end {
        let turns = Turns::new(ctid / 128);
        // The first tile alone: its probabilities need no output to rescale. A turn holds
        // only the products' issue: start values and waits for data come before it.
        start_scores::<E, BM, BN, NT>(&b, sm, at, &mut s, n);
        landed(sm, FULL_K, Ring(0));
        turns.take();
        issue_scores::<E, D, BN, NT, KT>(sm, at, &mut s, Ring(0));
        turns.pass(false);
        wgmma_wait::<0, NT>(&mut s[0]);
        unsafe { mbarrier_arrive(sm.bar(EMPTY_K, 0)) };
        softmax.update(&mut s, scale);
        let mut probs = pack_p::<E, NT, KP>(&s[0]);
        let mut i = 1;
        loop {
            n = tiles.next_candidate(n + 1);
            if n >= tiles.end {
                break;
            }
            let (r, prev) = (Ring(i), Ring(i - 1));
            start_scores::<E, BM, BN, NT>(&b, sm, at, &mut s, n);
            landed(sm, FULL_K, r);
            landed(sm, FULL_V, prev);
            turns.take();
            issue_scores::<E, D, BN, NT, KT>(sm, at, &mut s, r);
            issue_pv::<E, D, BN, KP, DT>(sm, &mut o[0], &probs, prev);
            turns.pass(false);
            // This tile's scores (the older group) are in: its softmax runs under the PV.
            wgmma_wait::<1, NT>(&mut s[0]);
            unsafe { mbarrier_arrive(sm.bar(EMPTY_K, r.slot())) };
            let correction = softmax.update(&mut s, scale);
            wgmma_wait::<0, DT>(&mut o[0]);
            unsafe { mbarrier_arrive(sm.bar(EMPTY_V, prev.slot())) };
            if let Some(c) = correction {
                for dt in 0..DT {
                    for e in 0..4 {
                        o[0][dt][e] *= c[0][e / 2];
                    }
                }
            }
            probs = pack_p::<E, NT, KP>(&s[0]);
            i += 1;
        }
        landed(sm, FULL_V, Ring(i - 1));
        turns.take();
        issue_pv::<E, D, BN, KP, DT>(sm, &mut o[0], &probs, Ring(i - 1));
        turns.pass(true);
        wgmma_wait::<0, DT>(&mut o[0]);
    }
    // This warpgroup's QKᵀ were its last reads of its Q rows: they stage its O.
    unsafe { write_output::<E, 1, DT>(p, &b, sm.q, softmax, &o, ctid, CONSUMERS, || named_barrier(EPILOGUE_BARRIER, CONSUMERS)) };
}

/// Const parameters: head dim `D`, tile `BM x BN` (`BM` = 128, two consumer warpgroups),
/// `NT = BN / 8`, `KT = D / 16`, `DT = D / 8`, `KP = BN / 16` (spelled out: no const-generic
/// arithmetic); `PACKED` for a packed batch. Launched with 384 threads (`FWD_WS_THREADS`).
#[inline(always)]
pub unsafe fn forward<E: Elem, const D: usize, const BM: usize, const BN: usize, const NT: usize, const KT: usize, const DT: usize, const KP: usize, const PACKED: bool>(
    p: &FwdParams,
) {
    const {
        assert!(BM == 128 && NT * 8 == BN && KT * 16 == D && DT * 8 == D && KP * 2 == NT);
        assert!(matches!(NT, 4 | 8 | 16) && matches!(DT, 4 | 8 | 16));
    }
    let tid = thread_idx();
    let sm = Smem::new::<D, BM, BN>();
    if !BlockInfo::new::<false, PACKED>(p, BM as u32, block_idx()).has_rows() {
        return;
    }
    if tid == 0 {
        for role in 0..BARRIERS {
            let count = if role >= EMPTY_K { CONSUMERS } else { PRODUCERS };
            unsafe { mbarrier_init(sm.bar(role, 0), count) };
        }
    }
    sync_threads();
    if tid < PRODUCERS {
        setmaxnreg::<false, FWD_WS_PRODUCER_REGS>();
        unsafe { produce::<D, BM, BN, PACKED>(p, &sm, tid) };
    } else {
        setmaxnreg::<true, FWD_WS_CONSUMER_REGS>();
        unsafe { consume::<E, D, BM, BN, NT, KT, DT, KP, PACKED>(p, &sm, tid - PRODUCERS) };
    }
}
