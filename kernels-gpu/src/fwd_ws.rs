//! The Hopper forward for fixed-length calls and lean packed ones, warp-specialised (sm_90a). A
//! producer warpgroup copies Q and a ring of K and V tiles (`cp.async`; with modifiers the bias
//! and packed-mask tiles too) and announces each on an `mbarrier`; two or three consumer
//! warpgroups, 64 query rows each, wait for them alone (no CTA-wide barrier in the loop) and run
//! S = QKᵀ and O += PV on `wgmma`. Each consumer keeps two products in flight: key tile i's QKᵀ
//! and tile i-1's PV are issued together, and tile i's softmax runs while PV still multiplies
//! (FlashAttention-3's intra-warpgroup overlap); and the consumers take turns issuing
//! ([`Turns`], its ping-pong), so that one's softmax runs under the others' products. The
//! producer hands most of its registers to the consumers (`setmaxnreg`).
//!
//! Lean calls (no mask, bias or softcap; fixed lengths, packed batches, or packed over paged K/V)
//! visit every key tile of the band, which producer and consumers each work out. Over fixed
//! lengths the lean kernel is persistent where `fwd_ws_persistent` says so ([`QueryTiles`]): a CTA
//! an SM takes query tiles one after another, and its producer copies the next tile's Q into a second slot, and its first
//! K and V tiles into the ring, while the consumers finish the current tile and store its O.
//! With modifiers
//! (`MODS`: mask, bias, softcap, split-KV, work order; or the mask alone, without the bias ring,
//! on wider key tiles) the producer walks the block map and passes
//! each visited tile's index and fullness to the consumers beside its K.
use crate::arch::*;
use crate::block_info::{BlockInfo, position};
use crate::elem::{Elem, wgmma_wait};
use crate::fwd::{self, load_k_side, load_kv_paged, write_output};
use crate::gemm::{pack_p, wgmma_pv, wgmma_scores};
use crate::mask::{KeyTiles, MapRows, Tile, TileCursor, TileLine};
use crate::scores::{Mods, WarpScores};
use crate::softmax::{InRegisters, OnlineSoftmax, State};
use crate::tile::SmemTile;
use dmattn_abi::{
    FWD_TMA_NEXT_TILE, FWD_WS_BARRIERS, FWD_WS_Q_SLOTS, FWD_WS_STAGES, FwdParams, POSITION_BYTES, TensorMapsParams, flags, fwd_ws_mask_slots, fwd_ws_q_slots, mask_tile_bytes,
    modifiers,
};

const STAGES: u32 = FWD_WS_STAGES;
/// The Q slots turn over as the K/V ring's do ([`Ring`] steps through both).
const Q_SLOTS: u32 = FWD_WS_Q_SLOTS;
const _: () = assert!(Q_SLOTS == STAGES);
// The tile words (4 bytes a slot) keep the position slot and the barriers 8-byte aligned.
const _: () = assert!(STAGES % 2 == 0);
const PRODUCERS: u32 = 128;
/// Threads of a warpgroup (a consumer warpgroup's 64 rows).
const GROUP: u32 = 128;

/// The score modifiers a kernel takes (`dmattn_abi::modifiers`): with `MODS` every one, or
/// without `BIAS` (no bias ring) the mask alone.
#[inline(always)]
const fn modifiers_of<const MODS: bool, const BIAS: bool>() -> u8 {
    match (MODS, BIAS) {
        (false, _) => modifiers::NONE,
        (true, false) => modifiers::MASK,
        (true, true) => modifiers::ALL,
    }
}

/// Whether the ring slots hold bias tiles: then one mask slot serves all, and the consumers keep
/// their softmax state in registers (`dmattn_abi::fwd_ws_mask_slots`).
#[inline(always)]
const fn bias_ring<const MODS: bool, const BIAS: bool>() -> bool {
    MODS && BIAS
}

/// The consumer threads of a `BM`-row tile: a warpgroup per 64 rows.
#[inline(always)]
const fn consumers<const BM: usize>() -> u32 {
    BM as u32 / 64 * GROUP
}

/// The barriers, by role: per Q slot, its Q tile landed (`FULL_Q`) or its query tile's O stored
/// (`EMPTY_Q`, the slot stages O); per ring slot, its K (V) tile landed (`FULL_*`, the
/// producer's threads arrive once their copies have) or read (`EMPTY_*`, the consumers' threads
/// arrive once their products have); beside a bias ring, the single mask slot read (`MASK_READ`,
/// the consumers arrive once per key tile, after its start values: its phase `i` is tile `i`'s).
const FULL_Q: u32 = 0;
const EMPTY_Q: u32 = FULL_Q + Q_SLOTS;
const FULL_K: u32 = EMPTY_Q + Q_SLOTS;
const FULL_V: u32 = FULL_K + STAGES;
const EMPTY_K: u32 = FULL_V + STAGES;
const EMPTY_V: u32 = EMPTY_K + STAGES;
const MASK_READ: u32 = EMPTY_V + STAGES;
const BARRIERS: u32 = MASK_READ + 1;
const _: () = assert!(BARRIERS == FWD_WS_BARRIERS);

/// The consumers' barrier before the epilogue's store (0 is the CTA's).
const EPILOGUE_BARRIER: u32 = 1;

/// The consumer warpgroups take turns issuing their products (FlashAttention-3's ping-pong, a
/// round robin of three where there are three): warpgroup `w` waits on barrier `TURN + w`
/// before issuing and then lets the next go, so that one's softmax runs while the others'
/// products keep the tensor cores busy. Each turn barrier joins the waiting warpgroup and the
/// one before it.
const TURN: u32 = 2;
const TURN_THREADS: u32 = 2 * GROUP;

/// A consumer warpgroup's turns at issuing products (see [`TURN`]). All warpgroups visit the
/// same key tiles (the CTA's), so all take as many turns; a warpgroup skipping a tile alone
/// would hang the others. A warpgroup cannot pass twice before the next has taken its turn:
/// its next pass waits for a whole round.
#[derive(Clone, Copy)]
struct Turns {
    group: u32,
    groups: u32,
}

impl Turns {
    /// The last warpgroup starts by letting warpgroup 0 have the first turn.
    #[inline(always)]
    fn new(group: u32, groups: u32) -> Self {
        if group == groups - 1 {
            named_barrier_arrive(TURN, TURN_THREADS);
        }
        Turns { group, groups }
    }

    /// Waits for this warpgroup's turn.
    #[inline(always)]
    fn take(self) {
        named_barrier(TURN + self.group, TURN_THREADS);
    }

    /// Hands the turn to the next warpgroup; `last`: this warpgroup's final turn, after which
    /// the last warpgroup owes warpgroup 0 nothing (warpgroup 0 takes as many turns as it was
    /// given).
    #[inline(always)]
    fn pass(self, last: bool) {
        if !(last && self.group == self.groups - 1) {
            let next = if self.group + 1 == self.groups { 0 } else { self.group + 1 };
            named_barrier_arrive(TURN + next, TURN_THREADS);
        }
    }
}

/// Shared memory: the Q slots (one with modifiers), the K ring, the V ring, with modifiers the
/// bias ring and the packed-mask slots, the tiles' words (see [`TileWord`]) and the grid
/// position (lean: the Q slots' query tiles, see [`QueryTiles`]), then the consumers' softmax
/// state (none beside a bias ring: [`bias_ring`]) and the barriers (`FwdTile::smem_bytes`).
#[derive(Clone, Copy)]
struct Smem {
    /// Q slot 0.
    q: SmemTile,
    ring: u32,
    tile_bytes: u32,
    bias: u32,
    mask: u32,
    /// Bytes from one ring slot's mask tile to the next (0: one slot serves all).
    mask_step: u32,
    words: u32,
    position: u32,
    softmax: u32,
    bars: u32,
}

impl Smem {
    #[inline(always)]
    fn new<const D: usize, const BM: usize, const BN: usize, const MODS: bool, const BIAS: bool>() -> Self {
        let q = SmemTile::new(smem_base(), BM, D * 2);
        let tile_bytes = (BN * D * 2) as u32;
        let ring = q.base + fwd_ws_q_slots(MODS) * q.bytes();
        let bias = ring + 2 * STAGES * tile_bytes;
        let mask = bias + if bias_ring::<MODS, BIAS>() { STAGES * (BM * BN * 2) as u32 } else { 0 };
        let (mask_bytes, mask_slots) = (mask_tile_bytes(BM as u32, BN as u32), fwd_ws_mask_slots(bias_ring::<MODS, BIAS>()));
        let words = mask + if MODS { mask_slots * mask_bytes } else { 0 };
        let position = words + 4 * if MODS { STAGES } else { Q_SLOTS };
        let softmax = position + if MODS { POSITION_BYTES } else { 0 };
        let softmax_bytes = if bias_ring::<MODS, BIAS>() { 0 } else { consumers::<BM>() * 16 };
        let mask_step = if mask_slots == 1 { 0 } else { mask_bytes };
        Self { q, ring, tile_bytes, bias, mask, mask_step, words, position, softmax, bars: softmax + softmax_bytes }
    }

    /// Q slot `slot` (a lean kernel's; modifiers have slot 0 alone).
    #[inline(always)]
    fn q_slot<const D: usize, const BM: usize>(&self, slot: u32) -> SmemTile {
        SmemTile::new(self.q.base + slot * self.q.bytes(), BM, D * 2)
    }

    /// The query tile a lean kernel's Q slot `slot` holds ([`QueryTiles`]; its count: none).
    #[inline(always)]
    fn q_word(&self, slot: u32) -> u32 {
        self.words + 4 * slot
    }

    #[inline(always)]
    fn k<const D: usize, const BN: usize>(&self, slot: u32) -> SmemTile {
        SmemTile::new(self.ring + slot * self.tile_bytes, BN, D * 2)
    }

    #[inline(always)]
    fn v<const D: usize, const BN: usize>(&self, slot: u32) -> SmemTile {
        SmemTile::new(self.ring + (STAGES + slot) * self.tile_bytes, BN, D * 2)
    }

    /// The bias tile of ring slot `slot` (modifiers only).
    #[inline(always)]
    fn bias<const BM: usize, const BN: usize>(&self, slot: u32) -> SmemTile {
        SmemTile::new(self.bias + slot * (BM * BN * 2) as u32, BM, BN * 2)
    }

    /// The packed mask tile of ring slot `slot` (modifiers only; beside a bias ring, the one
    /// slot).
    #[inline(always)]
    fn mask(&self, slot: u32) -> u32 {
        self.mask + slot * self.mask_step
    }

    /// The [`TileWord`] of ring slot `slot` (modifiers only).
    #[inline(always)]
    fn word(&self, slot: u32) -> u32 {
        self.words + 4 * slot
    }

    /// Barrier `role` (of slot `slot`, for the ring's).
    #[inline(always)]
    fn bar(&self, role: u32, slot: u32) -> u32 {
        self.bars + 8 * (role + slot)
    }
}

/// How the producer tells the consumers which key tile a ring slot holds (modifiers only): its
/// index, bit 31 its fullness; [`TileWord::END`] past the last, a slot with no tile.
struct TileWord;

impl TileWord {
    const END: u32 = u32::MAX;

    #[inline(always)]
    fn of(t: Option<Tile>) -> u32 {
        t.map_or(Self::END, |t| t.n | (t.full as u32) << 31)
    }

    #[inline(always)]
    fn tile(w: u32) -> Option<Tile> {
        (w != Self::END).then_some(Tile { n: w & !(1 << 31), full: w >> 31 != 0 })
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

/// The key tiles a lean call's query tile visits: the band's (the sink tiles, then an interval).
#[inline(always)]
fn key_tiles<const BM: usize, const BN: usize>(b: &BlockInfo) -> KeyTiles {
    b.vis.key_tiles(b.row0, BM as u32, BN as u32)
}

/// The first tile of `tiles` at or after `n`.
#[inline(always)]
fn band_tile(tiles: &KeyTiles, n: u32) -> Option<Tile> {
    let n = tiles.next_candidate(n);
    (n < tiles.end).then_some(Tile { n, full: true })
}

/// The persistent lean kernel's query tiles (`FwdTmaParams`): `(tile, head, batch)` numbered in
/// grid order, x fastest, as a full grid's CTAs start, so that the CTAs running together share
/// K and V in L2 as before. Each CTA takes tile `blockIdx.x` first, then the next untaken one
/// from the counter beside the tensor maps: CTAs that finish early take more, as the block
/// scheduler gave a full grid's.
#[derive(Clone, Copy)]
struct QueryTiles {
    /// Query tiles a head (a full grid's x).
    x: u32,
    heads: u32,
    count: u32,
}

impl QueryTiles {
    #[inline(always)]
    fn of<const BM: usize>(p: &FwdParams) -> Self {
        let x = p.seqlen_q.div_ceil(BM as u32);
        QueryTiles { x, heads: p.heads, count: x * p.heads * p.batch }
    }

    /// Tile `n`'s grid position `(x, head, batch)`.
    #[inline(always)]
    fn position(self, n: u32) -> (u32, u32, u32) {
        let row = div(n, self.x);
        let z = div(row, self.heads);
        (n - row * self.x, row - z * self.heads, z)
    }
}

/// Waits for this thread's copies but the newest `PENDING` groups, makes them visible to `wgmma`
/// (the async proxy) and arrives on `bar`: the group it announces has landed.
#[inline(always)]
unsafe fn announce<const PENDING: u32>(bar: u32) {
    cp_async_wait_group::<PENDING>();
    fence_proxy_async();
    unsafe { mbarrier_arrive(bar) };
}

/// Bytes a tensor map's box covers in one 128-byte column block: `rows` rows of 128 bytes.
const fn box_bytes(rows: usize) -> u32 {
    rows as u32 * 128
}

/// Starts the bulk tensor copies of `tile` (`D` columns, whose 128-byte column blocks are the
/// maps' boxes) from the map at `map` at `coords` (column 0), completing on `bar`, which the
/// calling thread tells to expect the tile's bytes.
#[inline(always)]
unsafe fn tma_tile<const D: usize>(tile: SmemTile, rows: usize, map: u64, coords: [u32; 4], bar: u32) {
    unsafe {
        mbarrier_arrive_expect_tx(bar, (D / 64) as u32 * box_bytes(rows));
        for block in 0..D as u32 / 64 {
            tma_load_4d(tile.chunk(0, 8 * block), map, [64 * block, coords[1], coords[2], coords[3]], bar);
        }
    }
}

/// The lean fixed-length producer's copies (`PERSISTENT`: [`QueryTiles`]; else the CTA's one
/// tile): one thread takes the CTA's query tiles in turn and starts each one's bulk tensor copies (`maps`: the global
/// address of Q's tensor map, K's and V's following, then the tile counter; `FwdTmaParams`):
/// its Q into the next Q slot once the consumers have stored the O it staged, beside it the
/// tile's number (the count of tiles past the last), then its K and V tiles into the ring as
/// the consumers free its slots, each completing on its "full" barrier; the copy engine
/// zero-fills rows past the sequence.
#[inline(always)]
unsafe fn produce_tma<const D: usize, const BM: usize, const BN: usize, const PERSISTENT: bool>(p: &FwdParams, sm: &Smem, maps: u64) {
    let map = |i: u64| maps + i * core::mem::size_of::<dmattn_abi::TensorMap>() as u64;
    for i in 0..3 {
        unsafe { fence_proxy_tensormap_acquire(map(i)) };
    }
    let tiles = QueryTiles::of::<BM>(p);
    // Not persistent: the one tile of this CTA's block index.
    let (bx, by, bz) = block_idx();
    let mut next = if PERSISTENT { bx } else { bx + tiles.x * (by + tiles.heads * bz) };
    let (mut t, mut i) = (0, 0);
    loop {
        let q = Ring(t);
        unsafe {
            mbarrier_wait(sm.bar(EMPTY_Q, q.slot()), q.free_parity());
            st_shared_u32(sm.q_word(q.slot()), next.min(tiles.count));
        }
        if next >= tiles.count {
            // The release of the arrival publishes the word: the consumers stop.
            unsafe { mbarrier_arrive(sm.bar(FULL_Q, q.slot())) };
            return;
        }
        let b = BlockInfo::at::<false, false>(p, BM as u32, tiles.x, tiles.position(next));
        let (q_at, _) = b.tma_coords(0);
        unsafe { tma_tile::<D>(sm.q_slot::<D, BM>(q.slot()), BM, map(0), q_at, sm.bar(FULL_Q, q.slot())) };
        // Taken now, used after this tile's copies: the atomic's latency hides behind them.
        next = if PERSISTENT { grid_dim_x() + unsafe { atom_add_gpu_u32(maps + FWD_TMA_NEXT_TILE, 1) } } else { tiles.count };
        let band = key_tiles::<BM, BN>(&b);
        let mut tile = band_tile(&band, 0);
        while let Some(k) = tile {
            let (r, (_, kv_at)) = (Ring(i), b.tma_coords(k.n * BN as u32));
            unsafe {
                mbarrier_wait(sm.bar(EMPTY_K, r.slot()), r.free_parity());
                tma_tile::<D>(sm.k::<D, BN>(r.slot()), BN, map(1), kv_at, sm.bar(FULL_K, r.slot()));
                mbarrier_wait(sm.bar(EMPTY_V, r.slot()), r.free_parity());
                tma_tile::<D>(sm.v::<D, BN>(r.slot()), BN, map(2), kv_at, sm.bar(FULL_V, r.slot()));
            }
            tile = band_tile(&band, k.n + 1);
            i += 1;
        }
        t += 1;
    }
}

/// `dmattn_store_tensor_maps` (one thread): the maps of `p` to `p.dst`, for [`produce_tma`], and
/// the tile counter after them zeroed ([`QueryTiles`]).
#[inline(always)]
pub unsafe fn store_tensor_maps(p: &TensorMapsParams) {
    let dst = p.dst as *mut u64;
    // Constant indices only (loops that unroll): an index into the parameter that is not one
    // copies the whole block to local memory.
    for (m, map) in p.maps.iter().enumerate() {
        for (i, &word) in map.iter().enumerate() {
            unsafe { dst.add(16 * m + i).write(word) };
        }
    }
    unsafe { ((p.dst + FWD_TMA_NEXT_TILE) as *mut u32).write(0) };
}

/// The producer warpgroup (`ptid` 0..128) of a CTA a query tile, at grid position `pos`: Q into
/// slot 0, then each visited key tile's K (with modifiers its
/// bias and mask tiles and its [`TileWord`]) and V into the next ring slot once the consumers have
/// freed it. Copies go in as groups Q, K0, V0, K1, ...: after issuing K(i) it announces V(i-1)
/// (or Q), then K(i) as soon as it lands, before waiting for V(i)'s slot, which the consumers
/// free only after their softmax of tile i-1; announcing K(i) after V(i)'s issue held each
/// consumer's QKᵀ(i) back until both had finished that softmax, defeating their turns. With
/// modifiers a last slot says the walk is over.
#[inline(always)]
unsafe fn produce<const D: usize, const BM: usize, const BN: usize, const PACKED: bool, const PAGED: bool, const MODS: bool, const BIAS: bool>(
    p: &FwdParams,
    sm: &Smem,
    pos: (u32, u32, u32),
    ptid: u32,
) {
    let b = BlockInfo::new::<MODS, PACKED>(p, BM as u32, pos);
    let mods = Mods::of(p, modifiers_of::<MODS, BIAS>());
    let row_bytes = (D * 2) as u32;
    let (k_row, v_row) = (2 * p.k.stride[1], 2 * p.v.stride[1]);
    // The walk: with modifiers the block map's non-empty tiles within the band and this CTA's
    // split share (each warp runs the cursor, warp-collective, to the same answers).
    let tiles = key_tiles::<BM, BN>(&b);
    let map = MapRows::<BM, BN>::new(&p.block_map, b.block_map(), b.m_block, &b.vis);
    let (first, end) = b.key_tiles(0, map.end());
    let line = map.until(end);
    let mut cursor = TileCursor::new();
    let mut next = |n: u32| if MODS { cursor.next(line.next_candidate(n.max(first)), ptid % 32, &line) } else { band_tile(&tiles, n) };
    unsafe { sm.q.load_async_fast(b.q(), 2 * p.q.stride[1], b.rows_valid, row_bytes, ptid, PRODUCERS) };
    cp_async_commit();
    let mut pending = sm.bar(FULL_Q, 0);
    let mut tile = next(0);
    let mut i = 0;
    while let Some(t) = tile {
        let (r, col0) = (Ring(i), t.n * BN as u32);
        let keys = b.keys() - col0;
        unsafe {
            mbarrier_wait(sm.bar(EMPTY_K, r.slot()), r.free_parity());
            if MODS {
                // The portable forward's K-side copies (K, bias and mask tiles) into this slot;
                // beside a bias ring, a partial tile's mask bits once the consumers have read the
                // last tile's (its start values: phase i - 1 of `MASK_READ`).
                let slot = fwd::Smem::k_side(sm.k::<D, BN>(r.slot()), sm.bias::<BM, BN>(r.slot()), sm.mask(r.slot()));
                let mask_later = bias_ring::<MODS, BIAS>() && mods.mask && !t.full && i > 0;
                let k_side = if mask_later { Mods { mask: false, ..mods } } else { mods };
                load_k_side::<D, BM, BN, false, PACKED, false>(&b, &slot, k_side, t, b.keys(), ptid, PRODUCERS, true);
                if mask_later {
                    mbarrier_wait(sm.bar(MASK_READ, 0), (i - 1) & 1);
                    fwd::load_mask_side::<BM, BN>(&b, sm.mask(r.slot()), col0, ptid, PRODUCERS);
                }
                if ptid == 0 {
                    st_shared_u32(sm.word(r.slot()), TileWord::of(Some(t)));
                }
            } else if PAGED {
                load_kv_paged::<BN>(&b, sm.k::<D, BN>(r.slot()), &p.k, t.n, keys, ptid, PRODUCERS);
            } else {
                sm.k::<D, BN>(r.slot()).load_async_fast(b.k() + col0 as u64 * k_row, k_row, keys, row_bytes, ptid, PRODUCERS);
            }
            cp_async_commit();
            announce::<1>(pending);
            announce::<0>(sm.bar(FULL_K, r.slot()));
            mbarrier_wait(sm.bar(EMPTY_V, r.slot()), r.free_parity());
            if PAGED {
                load_kv_paged::<BN>(&b, sm.v::<D, BN>(r.slot()), &p.v, t.n, keys, ptid, PRODUCERS);
            } else {
                sm.v::<D, BN>(r.slot()).load_async_fast(b.v() + col0 as u64 * v_row, v_row, keys, row_bytes, ptid, PRODUCERS);
            }
            cp_async_commit();
        }
        pending = sm.bar(FULL_V, r.slot());
        tile = next(t.n + 1);
        i += 1;
    }
    cp_async_wait_all();
    fence_proxy_async();
    unsafe { mbarrier_arrive(pending) };
    if MODS {
        let r = Ring(i);
        unsafe {
            mbarrier_wait(sm.bar(EMPTY_K, r.slot()), r.free_parity());
            if ptid == 0 {
                st_shared_u32(sm.word(r.slot()), TileWord::of(None));
            }
            mbarrier_arrive(sm.bar(FULL_K, r.slot()));
        }
    }
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

/// Whether the bias folds into the scores after their product ([`scores_landed`]) rather than
/// as its start values: beside a bias ring, where no softcap keeps it out of the accumulators.
/// Start values are read and converted before the product is issued, on the consumer's path
/// from its softmax to its next turn; added after, the same work runs while the other consumer
/// warpgroup's products do (d128 50 % blocks + a `[b, 1, s, s]` bias 8K, H200: 2.68 -> 2.46 ms).
#[inline(always)]
fn bias_after<const MODS: bool, const BIAS: bool>(mods: &Mods) -> bool {
    bias_ring::<MODS, BIAS>() && mods.fold_bias()
}

/// Waits for the scores' product (at most `PENDING` product groups left in flight) and, where
/// [`bias_after`], adds the bias to them. The bias words are read after the wait: read before
/// it, beside S, O and P (160 of a consumer's 216 registers at d128), they spilled 84 bytes.
#[inline(always)]
fn scores_landed<E: Elem, const NT: usize, const PENDING: u32, const MODS: bool, const BIAS: bool>(
    warp: &WarpScores,
    mods: &Mods,
    s: &mut [[[f32; 4]; NT]; 1],
) {
    wgmma_wait::<PENDING, NT>(&mut s[0]);
    if bias_after::<MODS, BIAS>(mods) {
        WarpScores::add_bias::<E, NT>(&mut s[0], &warp.bias_words::<NT>(), mods);
    }
}

/// Key tile `tile`'s score start values in `s` (ring position `r`; with modifiers its bias and
/// mask tiles have landed): -inf where the mask, the band or the key bound hide a score, the bias
/// where it folds in before the product (not [`bias_after`]). Returns the warp's view of the
/// slot's bias for the logits, and whether the product accumulates onto `s`: a tile of zeros is
/// not written, its product starts from nothing.
#[inline(always)]
fn start_scores<E: Elem, const BM: usize, const BN: usize, const NT: usize, const MODS: bool, const BIAS: bool>(
    b: &BlockInfo,
    sm: &Smem,
    at: Rows,
    mods: &Mods,
    s: &mut [[[f32; 4]; NT]; 1],
    tile: Tile,
    r: Ring,
) -> (WarpScores, bool) {
    let col0 = tile.n * BN as u32;
    let check = !tile.full || b.vis.tile_needs_check(b.row0, b.rows_valid.min(BM as u32), col0, BN as u32);
    let band = b.vis.at_tile(b.row0, col0).shifted(at.warp_row0 + at.lane / 4, 2 * (at.lane % 4)).rows_bits::<1>(check);
    // A lean call has no bias or mask tiles (the Q tile stands in, never read).
    let bias = if MODS && BIAS { sm.bias::<BM, BN>(r.slot()) } else { sm.q };
    let bias_rows = b.p.flags & flags::BIAS_ROW == 0;
    let warp = WarpScores::new::<NT>(bias, bias_rows, sm.mask(r.slot()), (BN / 8) as u32, at.warp_row0, 0, at.lane);
    let start = if bias_after::<MODS, BIAS>(mods) { Mods { bias: false, ..*mods } } else { *mods };
    let accumulate = WarpScores::has_start_values(&start, check);
    if accumulate {
        warp.init::<E, 1, NT>(s, &start, &band, check, mods.mask && !tile.full);
    }
    (warp, accumulate)
}

/// The scores to base-2 logits where a softcap needs them first (reading the slot's bias):
/// returns the scale the softmax applies (1 after the cap, else the scale itself).
#[inline(always)]
fn logits<E: Elem, const NT: usize>(warp: &WarpScores, mods: &Mods, s: &mut [[[f32; 4]; NT]; 1]) -> f32 {
    if mods.softcap > 0.0 {
        warp.to_logits::<E, 1, NT>(s, mods);
        1.0
    } else {
        mods.scale_log2
    }
}

/// The key tile at ring position `r`, after `prev`: with modifiers what the producer wrote there
/// (its K side has landed), else the band's next.
#[inline(always)]
fn fetch<const MODS: bool>(sm: &Smem, tiles: &KeyTiles, prev: Option<u32>, r: Ring) -> Option<Tile> {
    if MODS {
        landed(sm, FULL_K, r);
        TileWord::tile(unsafe { ld_shared_u32(sm.word(r.slot())) })
    } else {
        band_tile(tiles, prev.map_or(0, |n| n + 1))
    }
}

/// Beside a bias ring: this thread has read its key tile's mask bits (its start values), and
/// the producer may copy the next tile's into the one mask slot.
#[inline(always)]
fn mask_read<const MODS: bool, const BIAS: bool>(sm: &Smem) {
    if bias_ring::<MODS, BIAS>() {
        unsafe { mbarrier_arrive(sm.bar(MASK_READ, 0)) };
    }
}

/// Waits for the tile of barrier `role` (`FULL_Q`, `FULL_K` or `FULL_V`) at ring position `r`
/// to land.
#[inline(always)]
fn landed(sm: &Smem, role: u32, r: Ring) {
    unsafe { mbarrier_wait(sm.bar(role, r.slot()), r.parity()) };
}

/// S += QKᵀ (S = QKᵀ where not `accumulate`) of the Q tile `q` and the K tile at ring position
/// `r` (landed), for the warpgroup's rows; committed, not waited for.
#[inline(always)]
fn issue_scores<E: Elem, const D: usize, const BN: usize, const NT: usize, const KT: usize>(
    sm: &Smem,
    q: SmemTile,
    at: Rows,
    s: &mut [[[f32; 4]; NT]; 1],
    r: Ring,
    accumulate: bool,
) {
    let k = sm.k::<D, BN>(r.slot());
    wgmma_scores::<E, NT, KT>(&mut s[0], q, k, at.group_row0, accumulate);
}

/// O += P V over the V tile at ring position `r` (landed); committed, not waited for.
#[inline(always)]
fn issue_pv<E: Elem, const D: usize, const BN: usize, const KP: usize, const DT: usize>(sm: &Smem, o: &mut [[f32; 4]; DT], p: &[[u32; 4]; KP], r: Ring) {
    wgmma_pv::<E, DT>(o, KP, |kk| p[kk], sm.v::<D, BN>(r.slot()));
}

/// A consumer thread (`ctid` 0..`BM / 64 * 128`) on the query tile at grid position `pos`
/// (`grid_x` query tiles a head), whose Q is in Q slot `q.slot()` (landed) and whose first key
/// tile is the ring's `ring0`-th: its warpgroup's 64 rows through every visited key tile, then
/// the epilogue, which stages O in the Q slot (and, `PERSISTENT`, frees the slot and the last V
/// slot for later query tiles). Returns the ring position after the tile's last key tile.
#[inline(always)]
unsafe fn consume<
    E: Elem,
    const D: usize,
    const BM: usize,
    const BN: usize,
    const NT: usize,
    const KT: usize,
    const DT: usize,
    const KP: usize,
    const PACKED: bool,
    const MODS: bool,
    const BIAS: bool,
    const PERSISTENT: bool,
    S: State,
>(
    p: &FwdParams,
    sm: &Smem,
    (pos, grid_x): ((u32, u32, u32), u32),
    q: Ring,
    ring0: u32,
    ctid: u32,
    mut softmax: OnlineSoftmax<1, S>,
) -> u32 {
    let b = BlockInfo::at::<MODS, PACKED>(p, BM as u32, grid_x, pos);
    let q_tile = sm.q_slot::<D, BM>(q.slot());
    let mods = Mods::of(p, modifiers_of::<MODS, BIAS>());
    let lane = ctid % 32;
    let warp_row0 = (ctid / 32) * 16;
    let at = Rows { warp_row0, group_row0: warp_row0 & !63, lane };
    let consumers = consumers::<BM>();
    softmax.reset();
    let tiles = key_tiles::<BM, BN>(&b);
    let mut o = [[[0f32; 4]; DT]; 1];
    let mut s = [[[0f32; 4]; NT]; 1];
    let mut i = ring0;
    if let Some(mut tile) = fetch::<MODS>(sm, &tiles, None, Ring(i)) {
        let turns = Turns::new(ctid / GROUP, consumers / GROUP);
        // The first tile alone: its probabilities need no output to rescale. A turn holds
        // only the products' issue: start values and waits for data come before it.
        let (warp, accumulate) = start_scores::<E, BM, BN, NT, MODS, BIAS>(&b, sm, at, &mods, &mut s, tile, Ring(i));
        mask_read::<MODS, BIAS>(sm);
        landed(sm, FULL_K, Ring(i));
        turns.take();
        issue_scores::<E, D, BN, NT, KT>(sm, q_tile, at, &mut s, Ring(i), accumulate);
        turns.pass(false);
        scores_landed::<E, NT, 0, MODS, BIAS>(&warp, &mods, &mut s);
        let scale = logits::<E, NT>(&warp, &mods, &mut s);
        unsafe { mbarrier_arrive(sm.bar(EMPTY_K, Ring(i).slot())) };
        softmax.update(&mut s, scale);
        let mut probs = pack_p::<E, NT, KP>(&s[0]);
        i += 1;
        while let Some(next) = fetch::<MODS>(sm, &tiles, Some(tile.n), Ring(i)) {
            tile = next;
            let (r, prev) = (Ring(i), Ring(i - 1));
            let (warp, accumulate) = start_scores::<E, BM, BN, NT, MODS, BIAS>(&b, sm, at, &mods, &mut s, tile, r);
            mask_read::<MODS, BIAS>(sm);
            landed(sm, FULL_K, r);
            landed(sm, FULL_V, prev);
            turns.take();
            issue_scores::<E, D, BN, NT, KT>(sm, q_tile, at, &mut s, r, accumulate);
            issue_pv::<E, D, BN, KP, DT>(sm, &mut o[0], &probs, prev);
            turns.pass(false);
            // This tile's scores (the older group) are in: its softmax runs under the PV.
            scores_landed::<E, NT, 1, MODS, BIAS>(&warp, &mods, &mut s);
            let scale = logits::<E, NT>(&warp, &mods, &mut s);
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
        // The persistent kernel's producer fills the slot again for a later query tile.
        if PERSISTENT {
            unsafe { mbarrier_arrive(sm.bar(EMPTY_V, Ring(i - 1).slot())) };
        }
    }
    // This warpgroup's QKᵀ were its last reads of its Q rows: they stage its O. Then, in the
    // persistent kernel, the slot is free for a later query tile's Q, which the copy engine
    // writes (the async proxy: hence the fence).
    unsafe {
        write_output::<E, 1, DT, S>(p, &b, q_tile, softmax, &o, ctid, consumers, || named_barrier(EPILOGUE_BARRIER, consumers));
        if PERSISTENT {
            fence_proxy_async();
            mbarrier_arrive(sm.bar(EMPTY_Q, q.slot()));
        }
    }
    i
}

/// Whether the producer uses the bulk tensor copy engine: lean fixed-length calls (the packed
/// ones' sequences are rows of one tensor, whose ends the engine does not know, and the paged
/// ones' rows are anywhere). That kernel is persistent where `fwd_ws_persistent` says so
/// ([`QueryTiles`]).
const fn tma<const PACKED: bool, const MODS: bool>() -> bool {
    !PACKED && !MODS
}

/// Const parameters: head dim `D`, tile `BM x BN` (`BM` = 128 or 192: two or three consumer
/// warpgroups), `NT = BN / 8`, `KT = D / 16`, `DT = D / 8`, `KP = BN / 16` (spelled out: no
/// const-generic arithmetic); `PACKED` for a packed batch (lean only), `PAGED` (with `PACKED`)
/// over paged K/V, `MODS` for the modifier variant (`BIAS`: with a bias ring, and bias and
/// softcap taken; else the mask alone, see [`modifiers_of`]), `PERSISTENT` for the persistent lean
/// fixed-length kernel ([`QueryTiles`]); `setmaxnreg` gives the producer warpgroup
/// `PRODUCER_REGS` registers and each consumer one `CONSUMER_REGS` (`FwdTile::ws_registers`).
/// Launched with `BM / 64 * 128 + 128` threads (`FwdTile::threads`). `maps`: where [`tma`], the
/// global address of the Q, K and V tensor maps (`FwdTmaParams::maps`), else unused.
#[inline(always)]
pub unsafe fn forward<
    E: Elem,
    const D: usize,
    const BM: usize,
    const BN: usize,
    const NT: usize,
    const KT: usize,
    const DT: usize,
    const KP: usize,
    const PACKED: bool,
    const PAGED: bool,
    const MODS: bool,
    const BIAS: bool,
    const PERSISTENT: bool,
    const PRODUCER_REGS: u32,
    const CONSUMER_REGS: u32,
>(
    p: &FwdParams,
    maps: u64,
) {
    const {
        assert!(matches!(BM, 128 | 192) && NT * 8 == BN && KT * 16 == D && DT * 8 == D && KP * 2 == NT);
        assert!(matches!(NT, 4 | 8 | 16) && matches!(DT, 4 | 8 | 16));
        assert!(!(PACKED && MODS) && (!PAGED || PACKED) && (!PERSISTENT || tma::<PACKED, MODS>()));
    }
    let tid = thread_idx();
    let sm = Smem::new::<D, BM, BN, MODS, BIAS>();
    // A CTA a query tile but for the persistent kernel, which takes its own.
    let pos = position::<MODS>(p, sm.position);
    if !PERSISTENT && !BlockInfo::new::<MODS, PACKED>(p, BM as u32, pos).has_rows() {
        return;
    }
    if tid == 0 {
        for role in 0..BARRIERS {
            // The consumers free slots; the bulk copies' barriers take one arrival (with the
            // bytes to expect).
            let freed = role >= EMPTY_K || (EMPTY_Q..FULL_K).contains(&role);
            let count = if freed { consumers::<BM>() } else if tma::<PACKED, MODS>() { 1 } else { PRODUCERS };
            unsafe { mbarrier_init(sm.bar(role, 0), count) };
        }
        if tma::<PACKED, MODS>() {
            unsafe { fence_barrier_init() };
        }
    }
    sync_threads();
    if tid < PRODUCERS {
        setmaxnreg::<false, PRODUCER_REGS>();
        if tma::<PACKED, MODS>() {
            if tid == 0 {
                unsafe { produce_tma::<D, BM, BN, PERSISTENT>(p, &sm, maps) };
            }
        } else {
            unsafe { produce::<D, BM, BN, PACKED, PAGED, MODS, BIAS>(p, &sm, pos, tid) };
        }
    } else {
        setmaxnreg::<true, CONSUMER_REGS>();
        let ctid = tid - PRODUCERS;
        if PERSISTENT {
            // The query tiles the producer announces in the Q slots, until it says there are
            // no more.
            let tiles = QueryTiles::of::<BM>(p);
            let (mut t, mut i) = (0, 0);
            loop {
                let q = Ring(t);
                landed(&sm, FULL_Q, q);
                let n = unsafe { ld_shared_u32(sm.q_word(q.slot())) };
                if n >= tiles.count {
                    return;
                }
                i = unsafe { consume_tile::<E, D, BM, BN, NT, KT, DT, KP, PACKED, MODS, BIAS, PERSISTENT>(p, &sm, (tiles.position(n), tiles.x), q, i, ctid) };
                t += 1;
            }
        } else {
            landed(&sm, FULL_Q, Ring(0));
            unsafe { consume_tile::<E, D, BM, BN, NT, KT, DT, KP, PACKED, MODS, BIAS, PERSISTENT>(p, &sm, (pos, grid_dim_x()), Ring(0), 0, ctid) };
        }
    }
}

/// [`consume`] with the softmax state the kernel keeps: in registers beside a bias ring, else in
/// shared memory.
#[inline(always)]
unsafe fn consume_tile<
    E: Elem,
    const D: usize,
    const BM: usize,
    const BN: usize,
    const NT: usize,
    const KT: usize,
    const DT: usize,
    const KP: usize,
    const PACKED: bool,
    const MODS: bool,
    const BIAS: bool,
    const PERSISTENT: bool,
>(
    p: &FwdParams,
    sm: &Smem,
    at: ((u32, u32, u32), u32),
    q: Ring,
    ring0: u32,
    ctid: u32,
) -> u32 {
    unsafe {
        if bias_ring::<MODS, BIAS>() {
            let softmax = OnlineSoftmax::<1, InRegisters<4>>::in_registers();
            consume::<E, D, BM, BN, NT, KT, DT, KP, PACKED, MODS, BIAS, PERSISTENT, _>(p, sm, at, q, ring0, ctid, softmax)
        } else {
            let softmax = OnlineSoftmax::<1>::at(sm.softmax, ctid, consumers::<BM>());
            consume::<E, D, BM, BN, NT, KT, DT, KP, PACKED, MODS, BIAS, PERSISTENT, _>(p, sm, at, q, ring0, ctid, softmax)
        }
    }
}
