//! Backward attention: one CTA per (key tile, kv head, batch), or where key tiles are too few to
//! fill the GPU, several per key tile, each walking a share of its query tiles and adding its dK
//! and dV to f32 accumulators (`BwdParams::q_split_shift`, `seq::localize_split`). K and V of the
//! tile stay in shared memory while the CTA walks the query tiles that can see them (the mask's
//! block map and the causal rule skip the rest) and, inside each, the query heads of its kv
//! group; the next query tile's Q, dO, bias and mask load while the current one computes. Per
//! step, on tensor cores: S = QKᵀ and dP = dO Vᵀ, then P and dS = P (dP - delta) through shared
//! memory into dV += Pᵀ dO, dK += dSᵀ Q (registers, summed over the group: GQA needs no
//! reduction pass) and dQ = dS K, added to an f32 accumulator. dS also replaces the bias in its
//! shared tile, from where it is added to the f32 dbias accumulator at the bias's own
//! (broadcast) coordinates.
//! Each product spreads the CTA's warps over a grid of its own (`dmattn_abi::BwdTile`), so that
//! every warp's share is large enough to use each operand fragment it loads several times. On
//! Hopper (the sm_90a module) each product is instead a `wgmma` of a warpgroup, its operands read
//! from the same shared tiles (their layout is wgmma's 128-byte swizzle).
//!
//! dQ and dbias are added to their f32 accumulators with `red.add`. In any order by default; in
//! the `DET` variant in a fixed one: dQ tile (b, h, m) receives key tile n's contribution on turn
//! n (a counter per dQ tile), and CTAs sharing a broadcast dbias column take it in turns in
//! block order, so that each element sees the same sequence of additions on every run (a turn
//! passes with a barrier and a release, after the CTA's additions). Turns only wait on CTAs of
//! lower block index, which are scheduled first, so they cannot deadlock.
use crate::arch::*;
use crate::elem::{Elem, wgmma_wait};
use crate::mask::{MapCols, TileCursor, Visibility, block_map_plane, load_mask_tile, map_planes};
use crate::scores::{LOG2E, Mods, WarpScores};
use crate::seq::{localize, localize_split};
use crate::tile::{Fragments, SmemTile};
use dmattn_abi::{
    BWD_DQ_STAGE_BYTES, BWD_DQ_STAGE_TILES, BWD_PARAMS_BYTES, BwdParams, bwd_splits, bwd_stage_bytes, flags, mask_tile_bytes, modifiers,
    packed_position, unpacked_position,
};

/// One pipeline stage: everything that belongs to one (query tile, query head).
#[derive(Clone, Copy)]
struct Stage {
    q: SmemTile,
    dout: SmemTile,
    bias: SmemTile,
    mask: u32,
    lse: u32,
    delta: u32,
}

#[derive(Clone, Copy)]
struct Smem {
    k: SmemTile,
    v: SmemTile,
    p: SmemTile,
    ds: SmemTile,
    shape: (usize, usize, usize),
    stages: u32,
    /// The stages hold a bias tile (`BwdTile::bias`).
    bias: bool,
}

impl Smem {
    #[inline(always)]
    fn new(d: usize, bm: usize, bn: usize, stages: usize, bias: bool) -> Self {
        let k = SmemTile::new(smem_base(), bn, d * 2);
        let v = SmemTile::new(k.base + k.bytes(), bn, d * 2);
        let p = SmemTile::new(v.base + v.bytes(), bm, bn * 2);
        let ds = SmemTile::new(p.base + p.bytes(), bm, bn * 2);
        Smem { k, v, p, ds, shape: (d, bm, bn), stages: stages as u32, bias }
    }

    #[inline(always)]
    fn stage_bytes(&self) -> u32 {
        let (d, bm, bn) = self.shape;
        bwd_stage_bytes(bm as u32, bn as u32, d as u32, self.bias)
    }

    /// Warp `w`'s dQ staging slice, after the stages.
    #[inline(always)]
    fn dq_stage(&self, w: u32) -> u32 {
        self.ds.base + self.ds.bytes() + self.stages * self.stage_bytes() + w * BWD_DQ_STAGE_BYTES
    }

    /// Pipeline stage `i` (computed, not indexed: a runtime index into an array of tiles would
    /// put the array in local memory). Without a bias tile, `bias` is empty (no variant that
    /// runs on such a tile reads it).
    #[inline(always)]
    fn stage(&self, i: u32) -> Stage {
        let (d, bm, bn) = self.shape;
        let q = SmemTile::new(self.ds.base + self.ds.bytes() + i * self.stage_bytes(), bm, d * 2);
        let dout = SmemTile::new(q.base + q.bytes(), bm, d * 2);
        let bias = SmemTile::new(dout.base + dout.bytes(), if self.bias { bm } else { 0 }, bn * 2);
        let mask = bias.base + bias.bytes();
        let lse = mask + mask_tile_bytes(bm as u32, bn as u32);
        Stage { q, dout, bias, mask, lse, delta: lse + 4 * bm as u32 }
    }
}

/// The CTA's key tile, kv head and batch, and the addresses derived from them; rebuilt from
/// opaque indices inside loops (see `block_info`).
#[derive(Clone, Copy)]
struct KeyBlock<'a> {
    p: &'a BwdParams,
    n_block: u32,
    kv_head: u32,
    batch: u32,
    col0: u32,
    keys_valid: u32,
    vis: Visibility,
}

impl<'a> KeyBlock<'a> {
    /// The CTA's key block at grid position `(n_block, kv_head, batch)` (see [`position`]).
    #[inline(always)]
    /// `BAND`: the kernel takes any band, else only none or causal (see `Visibility::of_band`).
    fn at<const BAND: bool>(p: &'a BwdParams, block_n: u32, (n_block, kv_head, batch): (u32, u32, u32)) -> Self {
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
    fn reread<const BAND: bool>(p: &'a BwdParams, block_n: u32, placed: bool, swaps: bool, slot: u32) -> Self {
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
    fn head(&self, hg: u32) -> u32 {
        self.kv_head * self.p.fwd.kv_group + hg
    }

    /// The head of a mask or bias operand with head divisor `head_div` that query head `h` of
    /// this CTA's group reads: `h / head_div` without the division (a dependent chain of ~25
    /// instructions per use and step), as the host's divisors are 1 or the group size.
    #[inline(always)]
    fn operand_head(&self, h: u32, head_div: u32) -> u32 {
        if head_div == 1 { h } else { self.kv_head }
    }

    /// Byte address of key row `col0` of a `[b, sk, hk, d]` operand of `elem` bytes.
    #[inline(always)]
    fn kv_row(&self, t: &dmattn_abi::View4, elem: u64) -> u64 {
        t.ptr + elem * (self.batch as u64 * t.stride[0] + self.kv_head as u64 * t.stride[2] + self.col0 as u64 * t.stride[1])
    }

    /// Byte address of row `row0` of head `h` of a `[b, sq, h, d]` operand of `elem` bytes.
    #[inline(always)]
    fn q_row(&self, t: &dmattn_abi::View4, h: u32, row0: u32, elem: u64) -> u64 {
        t.ptr + elem * (self.batch as u64 * t.stride[0] + h as u64 * t.stride[2] + row0 as u64 * t.stride[1])
    }

    /// Index of row `row` of head `h` in lse and delta (`dmattn_abi::Seqs::lse_rows`; a packed
    /// sequence's bases are moved to its rows, see `seq::localize`).
    #[inline(always)]
    fn row_index(&self, h: u32, row: u32) -> u64 {
        (self.batch as u64 * self.p.fwd.heads as u64 + h as u64) * self.p.fwd.seqs.lse_rows as u64 + row as u64
    }

    /// Element address of (head `h`, query `row`, key column `col0 + c`) in a broadcast
    /// `[b, h, sq, sk]` operand with `elem`-byte elements, heads mapped through `head_div`.
    #[inline(always)]
    fn broadcast_at(&self, t: &dmattn_abi::View4, head_div: u32, h: u32, row: u32, c: u32, elem: u64) -> u64 {
        let s = t.stride;
        t.ptr
            + elem
                * (self.batch as u64 * s[0]
                    + self.operand_head(h, head_div) as u64 * s[1]
                    + row as u64 * s[2]
                    + (self.col0 + c) as u64 * s[3])
    }
}

/// Starts the copies of (query tile `m`, head `h`)'s Q, dO, bias, packed mask, lse and delta into
/// `st`. All threads call this.
#[inline(always)]
unsafe fn load_stage<const D: usize, const BM: usize, const BN: usize>(
    kb: &KeyBlock,
    st: &Stage,
    mods: &Mods,
    by_class: bool,
    m: u32,
    h: u32,
    tid: u32,
    threads: u32,
) {
    let f = &kb.p.fwd;
    let row0 = m * BM as u32;
    let rows = f.seqlen_q - row0;
    let row_bytes = (D * 2) as u32;
    unsafe {
        st.q.load_async(kb.q_row(&f.q, h, row0, 2), 2 * f.q.stride[1], rows, row_bytes, tid, threads);
        st.dout.load_async(kb.q_row(&kb.p.dout, h, row0, 2), 2 * kb.p.dout.stride[1], rows, row_bytes, tid, threads);
    }
    // lse and delta: one f32 per thread (rows of different heads are not 16-byte aligned).
    if tid < 2 * BM as u32 {
        let (dst, src) = if tid < BM as u32 { (st.lse, f.lse) } else { (st.delta, kb.p.delta) };
        let r = tid % BM as u32;
        let ok = r < rows;
        unsafe { cp_async_4(dst + 4 * r, src + 4 * kb.row_index(h, row0 + if ok { r } else { 0 }), if ok { 4 } else { 0 }) };
    }
    if mods.bias {
        let s = f.bias.stride;
        let base = kb.broadcast_at(&f.bias, f.bias_head_div, h, row0, 0, 2);
        unsafe {
            if f.flags & flags::BIAS_VEC != 0 {
                st.bias.load_async(base, 2 * s[2], rows, 2 * kb.keys_valid, tid, threads);
            } else {
                st.bias.load_strided(2, base, s[2], s[3], rows, kb.keys_valid, tid, threads);
            }
        }
    }
    if mods.mask {
        let (mb, map) = (&f.mask_bits, &f.block_map);
        let head = kb.operand_head(h, f.mask_head_div) as u64;
        let classes =
            map.ptr + kb.batch as u64 * map.stride[0] + head * map.stride[1] + (row0 / 64) as u64 * map.stride[2] + (kb.col0 / 64) as u64;
        let bits = mb.ptr + 8 * (kb.batch as u64 * mb.stride[0] + head * mb.stride[1] + row0 as u64 * mb.stride[2] + (kb.col0 / 64) as u64);
        unsafe { load_mask_tile::<BM, BN>(st.mask, bits, mb.stride[2], classes, map.stride[2], rows, by_class, tid, threads) };
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
fn position(p: &BwdParams, placed: bool, swaps: bool, slot: u32) -> (u32, u32, u32) {
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
fn grid_position(p: &BwdParams, swaps: bool) -> (u32, u32, u32) {
    let (x, y, z) = block_idx();
    if swaps && p.kv_heads_first != 0 { (y, x, z) } else { (x, y, z) }
}

/// Deterministic mode, with a bias whose gradient elements CTAs of several batches, kv heads or
/// key tiles add to (a bias broadcast over them): the CTA's turn lock and turn. The sharing
/// CTAs take the elements in turns in block order (key tile fastest, as in the grid), one turn
/// counter per slot of the dimensions not shared.
#[inline(always)]
fn dbias_turn<const BN: usize, const DET: bool>(kb: &KeyBlock, mods: &Mods) -> Option<(u64, u32)> {
    let (p, f) = (kb.p, &kb.p.fwd);
    let bd = p.bias_dims;
    let n_blocks = f.seqlen_k.div_ceil(BN as u32);
    let (sb, sh, sn) = (bd[0] == 1 && f.batch > 1, bd[1] == 1 && p.kv_heads > 1, bd[3] == 1 && n_blocks > 1);
    if !DET || !mods.bias || !(sb || sh || sn) {
        return None;
    }
    // Mixed-radix digits (index, extent): shared dimensions number the turn, the others the slot.
    let turn_digit = |shared: bool, index: u32, extent: u32| if shared { (index, extent) } else { (0, 1) };
    let slot_digit = |shared: bool, index: u32, extent: u32| if shared { (0, 1) } else { (index as u64, extent as u64) };
    let ((tb, _), (th, the), (tn, tne)) =
        (turn_digit(sb, kb.batch, f.batch), turn_digit(sh, kb.kv_head, p.kv_heads), turn_digit(sn, kb.n_block, n_blocks));
    let ((xb, _), (xh, xhe), (xn, xne)) =
        (slot_digit(sb, kb.batch, f.batch), slot_digit(sh, kb.kv_head, p.kv_heads), slot_digit(sn, kb.n_block, n_blocks));
    Some((p.dbias_turns + 4 * ((xb * xhe + xh) * xne + xn), (tb * the + th) * tne + tn))
}

/// A warp's place in one product's grid of warps: `rows` warps along the rows, the rest along
/// the columns (warp `w` at row group `w % rows`).
#[inline(always)]
fn warp_at(warp: u32, rows: usize) -> (u32, u32) {
    (warp % rows as u32, warp / rows as u32)
}

/// `MODS` is the variant's score modifiers (`dmattn_abi::modifiers`), `DET` selects the
/// deterministic variant (see the module doc), `WGMMA` the Hopper products
/// (`wgmma` from shared memory; the elementwise work between them is the same). Const parameters (see
/// `dmattn_abi::BwdTile`, which the entry points derive them from): head
/// dim `D`, query tile `BM`, key tile `BN`, `STAGES`, `W` warps; `KT = D / 16` k-steps of QKᵀ
/// and dO Vᵀ; for S and dP, `SR` warps along the rows, each with `MS` m16 row tiles and `NS` n8
/// key tiles, computed `NC` at a time; for dK and dV, `KR` warps along the keys, each with `MKV` m16 key tiles and `DKV`
/// n8 column tiles, over `MK = BM / 16` k-steps; for dQ, `QR` warps along the rows, each with
/// `MQ` m16 row tiles and `DQT` n8 column tiles, `DQ` of them per pass, over `NK = BN / 16` k-steps.
#[inline(always)]
pub unsafe fn backward<
    E: Elem,
    const D: usize,
    const BM: usize,
    const BN: usize,
    const STAGES: usize,
    const W: usize,
    const KT: usize,
    const SR: usize,
    const MS: usize,
    const NS: usize,
    const NC: usize,
    const KR: usize,
    const MKV: usize,
    const DKV: usize,
    const MK: usize,
    const QR: usize,
    const MQ: usize,
    const DQT: usize,
    const DQ: usize,
    const NK: usize,
    const MODS: u8,
    const DET: bool,
    const WGMMA: bool,
    const BIAS_TILE: bool,
    const BAND: bool,
>(
    params: &BwdParams,
    params_at: u32,
) {
    const {
        assert!(KT * 16 == D && MK * 16 == BM && NK * 16 == BN && BM % 64 == 0 && BN % 64 == 0);
        assert!(W % SR == 0 && MS * 16 * SR == BM && NS * 8 * (W / SR) == BN && NS % NC == 0 && NC % 2 == 0);
        assert!(W % KR == 0 && MKV * 16 * KR == BN && DKV * 8 * (W / KR) == D && DKV % 2 == 0);
        assert!(W % QR == 0 && MQ * 16 * QR == BM && DQT * 8 * (W / QR) == D && DQT % DQ == 0 && DQ % 2 == 0);
        // wgmma: two warpgroups, each product's warp grid the warpgroups' (see `BwdTile`): with
        // 64 rows they split S, dP and dQ by keys and columns, with 128 rows by rows.
        assert!(!WGMMA || (W == 8 && (BM == 64 && SR == 4 && QR == 4 || BM == 128 && SR == 8 && QR == 8)));
        assert!(!WGMMA || (NC == NS && KR == 8 && DQ == DQT && !DET));
        // A tile without a bias tile serves only variants without a bias.
        assert!(BIAS_TILE || MODS == modifiers::NONE || MODS == modifiers::MASK);
    }
    // The Hopper `BIAS` variant has no registers for reading block classes (`modifiers::BIAS`).
    let by_class = !(WGMMA && MODS == modifiers::BIAS);
    let tid = thread_idx();
    // Kernels that may split their query tiles (`dmattn_abi::bwd_splits`).
    let splits = !DET && bwd_splits(D as u32);
    // A packed sequence's CTA sees its sequence as a fixed-length problem (`seq::localize`), a
    // split CTA its share of the query tiles as one (`seq::localize_split`).
    let p = unsafe {
        params_in_smem(params, smem_base() + params_at, tid, |_, dst| {
            localize(dst, block_idx(), BM as u32, BN as u32);
            if splits {
                localize_split(dst, block_idx());
            }
        })
    };
    let f = &p.fwd;
    let threads = 32 * W as u32;
    let sm = Smem::new(D, BM, BN, STAGES, BIAS_TILE);
    let mods = Mods::of(f, MODS);
    let slot = smem_base() + params_at + BWD_PARAMS_BYTES;
    let (placed, swaps) = (modifiers::bwd_placed(MODS), modifiers::bwd_swaps(MODS));
    let kb = KeyBlock::at::<BAND>(p, BN as u32, position(p, placed, swaps, slot));
    if placed {
        // The loop rereads the stored position before its first barrier: every thread stored
        // the same value, but racecheck rightly asks for the order.
        sync_threads();
    }
    let m_tiles = f.seqlen_q.div_ceil(BM as u32);
    if let Some((lock, turn)) = dbias_turn::<BN, DET>(&kb, &mods) {
        unsafe { wait_turn(lock, turn, tid) };
    }

    let mut dk = [[[0f32; 4]; DKV]; MKV];
    let mut dv = [[[0f32; 4]; DKV]; MKV];

    // K and V stay for the whole CTA.
    let kv_bytes = (D * 2) as u32;
    unsafe {
        sm.k.load_async(kb.kv_row(&f.k, 2), 2 * f.k.stride[1], kb.keys_valid, kv_bytes, tid, threads);
        sm.v.load_async(kb.kv_row(&f.v, 2), 2 * f.v.stride[1], kb.keys_valid, kv_bytes, tid, threads);
    }

    // Steps are (query tile, head of the group), tiles in order; a deterministic run also visits
    // the tiles it skips, to pass their dQ turns on.
    let map = MapCols::<BM, BN>::new(&f.block_map, block_map_plane(f, kb.batch, kb.kv_head), map_planes(f), kb.n_block, &kb.vis);
    let mut cursor = TileCursor::new();
    // A split CTA's share starts at its first tile (`seq::localize_split`).
    let m_begin = kb.vis.query_tile_begin(kb.col0, BM as u32);
    let m_begin = if splits { m_begin.max(p.first_tile) } else { m_begin };
    let mut next_tile = cursor.next(m_begin, tid % 32, &map);
    if DET {
        unsafe { pass_skipped_turns(p, &kb, 0, next_tile.map_or(m_tiles, |t| t.n), m_tiles, tid) };
    }
    if let Some(first) = next_tile {
        unsafe { load_stage::<D, BM, BN>(&kb, &sm.stage(0), &mods, by_class, first.n, kb.head(0), tid, threads) };
    }
    cp_async_commit();

    // Values read from the parameters are read again inside the loop rather than held across it
    // (see `params_in_smem`).
    let mut stage = 0u32;
    // wgmma, with a bias every head of the kv group shares: the group's dS summed in registers
    // over its consecutive steps, and added to the dbias accumulator once per tile (a quarter of
    // the reductions at a group of 4).
    let mut dbias_sum = [[[0f32; 4]; NC]; MS];
    // Per step, the parameters come from an opaque address (see `params_in_smem`).
    let params_now = || -> &BwdParams { unsafe { smem_ref(opaque(smem_base() + params_at)) } };
    while let Some(tile) = next_tile {
        for hg in 0..params_now().fwd.kv_group {
            let tid = opaque(tid);
            let p = params_now();
            let f = &p.fwd;
            let kb = KeyBlock::reread::<BAND>(p, BN as u32, placed, swaps, slot);
            let mods = Mods::of(f, MODS);
            let (group, m_tiles) = (f.kv_group, f.seqlen_q.div_ceil(BM as u32));
            let (warp, lane) = (tid / 32, tid % 32);
            let (g, t) = (lane / 4, lane % 4);
            let h = kb.head(hg);
            let m = tile.n;
            let row0 = m * BM as u32;
            let st = sm.stage(stage);

            // This step's stage has landed; every warp is done with the previous step.
            cp_async_wait_all();
            if WGMMA {
                fence_proxy_async();
            }
            sync_threads();
            // Prefetch the next step: the next head of this tile, or the next tile's first head.
            let (next_m, next_h) = if hg + 1 < group {
                (Some(m), hg + 1)
            } else {
                let map = MapCols::<BM, BN>::new(&f.block_map, block_map_plane(f, kb.batch, kb.kv_head), map_planes(f), kb.n_block, &kb.vis);
                next_tile = cursor.next(m + 1, lane, &map);
                (next_tile.map(|t| t.n), 0)
            };
            if let (2, Some(nm)) = (STAGES, next_m) {
                unsafe { load_stage::<D, BM, BN>(&kb, &sm.stage(1 - stage), &mods, by_class, nm, kb.head(next_h), tid, threads) };
            }
            cp_async_commit();

            // S = Q Kᵀ on the score offsets, for the warp's 16 MS rows x 8 NS keys in chunks of
            // 8 NC keys (fewer accumulators live beside dK and dV where registers are short).
            let (q_frag, do_frag) = (Fragments::new(st.q, lane), Fragments::new(st.dout, lane));
            let (k_frag, v_frag) = (Fragments::new(sm.k, lane), Fragments::new(sm.v, lane));
            let (wr, wc) = warp_at(warp, SR);
            let r0 = 16 * MS as u32 * wr;
            let rows_valid = f.seqlen_q - row0;
            // Rows past seqlen_q have no LSE: hide them, unlike the forward where they are unread.
            let check = !tile.full || kb.vis.tile_needs_check(row0, BM as u32, kb.col0, BN as u32) || rows_valid < BM as u32;
            let softcap = mods.softcap > 0.0;
            let p_at = sm.p.chunk(g, 0) + 4 * t;
            let ds_at = p_at - sm.p.base + sm.ds.base;
            let (lse_at, delta_at) = (st.lse + 4 * (r0 + g), st.delta + 4 * (r0 + g));
            // Chunk c's first n8 key tile, and its scores' addresses.
            let chunk_nt0 = |c: u32| NS as u32 * wc + NC as u32 * c;
            let scores = |c: u32| WarpScores::new::<NC>(st.bias, true, st.mask, (BN / 8) as u32, r0, chunk_nt0(c), lane);
            // wgmma: dP is issued right behind S and computes while P is formed, and P stays in
            // registers for dS (one chunk: S and P are live together) where registers allow: not
            // in d128's softcap variant (`ALL`), beside the softcap's derivative and the dbias sum,
            // nor on the 128-row tile, whose S and dP already take 128.
            let keep_p = WGMMA && NC <= 8 && !(MODS == modifiers::ALL && D > 64);
            let mut dp_issued = [[[0f32; 4]; NC]; MS];
            let mut p_kept = [[[0f32; 4]; NC]; MS];
            for c in 0..(NS / NC) as u32 {
                let nt0 = chunk_nt0(c);
                let warp_scores = scores(c);
                let mut s = [[[0f32; 4]; NC]; MS];
                let bounds = kb.vis.at_tile(row0, kb.col0).with_rows(rows_valid).shifted(r0 + g, 8 * nt0 + 2 * t);
                warp_scores.init::<E, MS, NC>(&mut s, &mods, &bounds, check, mods.mask && !tile.full);
                if WGMMA {
                    // The warpgroup's 64 rows (from its first warp's) x keys from 8 nt0; this warp
                    // holds rows r0.
                    let wg_rows = r0 & !63;
                    wgmma_tiles::<E, NC, KT, 0, 0>(&mut s[0], |ks| st.q.wgmma_k_major(wg_rows, ks), |ks| sm.k.wgmma_k_major(8 * nt0, ks));
                    wgmma_tiles::<E, NC, KT, 0, 0>(&mut dp_issued[0], |ks| st.dout.wgmma_k_major(wg_rows, ks), |ks| {
                        sm.v.wgmma_k_major(8 * nt0, ks)
                    });
                    wgmma_wait::<1, NC>(&mut s[0]);
                } else {
                    let (q, k) = (q_frag.offset(r0, 0), k_frag.offset(8 * nt0, 0));
                    mma_tiles::<E, MS, NC, KT>(&mut s, |mt, ks| unsafe { q.a(16 * mt, ks) }, |np, ks| unsafe { k.b(16 * np, ks) });
                }

                // P = exp2(logit - lse) goes to the P tile (for dV, and read back for dS below
                // unless kept in registers), and under a softcap d(capped)/d(raw) to the dS tile
                // until dS replaces it: S is dead before dP's accumulators are live.
                for mt in 0..MS {
                    for hh in 0..2 {
                        let dr = 16 * mt as u32 + 8 * hh as u32;
                        let lse = unsafe { f32::from_bits(ld_shared_u32(lse_at + 4 * dr)) };
                        // An empty row has LSE -inf and P = 0: subtract +inf instead of -inf.
                        let lse2 = if lse == f32::NEG_INFINITY { f32::INFINITY } else { lse * LOG2E };
                        for nt in 0..NC as u32 {
                            let (x, dcap) = warp_scores.logits::<E>([s[mt][nt as usize][2 * hh], s[mt][nt as usize][2 * hh + 1]], dr, nt, &mods);
                            let pv = [exp2(x[0] - lse2), exp2(x[1] - lse2)];
                            if keep_p {
                                p_kept[mt][nt as usize][2 * hh..2 * hh + 2].copy_from_slice(&pv);
                            }
                            unsafe {
                                st_shared_u32(sm.p.shift(p_at, r0 + dr, nt0 + nt), E::pack(pv[0], pv[1]));
                                if softcap {
                                    st_shared_u32(sm.ds.shift(ds_at, r0 + dr, nt0 + nt), E::pack(dcap[0], dcap[1]));
                                }
                            }
                        }
                    }
                }
            }

            // dP = dO Vᵀ, then dS = P (dP - delta): to the bias tile for dbias, and times
            // scale * d(softcap) to the dS tile for dK and dQ.
            let ds_scale = mods.scale_log2 * core::f32::consts::LN_2;
            let sum_group = WGMMA && mods.bias && group > 1 && (f.bias_head_div == group || p.dbias_accum.stride[1] == 0);
            let last_head = hg + 1 == group;
            if sum_group && hg == 0 {
                dbias_sum = [[[0f32; 4]; NC]; MS];
            }
            for c in 0..(NS / NC) as u32 {
                let nt0 = chunk_nt0(c);
                let mut dp = [[[0f32; 4]; NC]; MS];
                if WGMMA {
                    wgmma_wait::<0, NC>(&mut dp_issued[0]);
                    dp = dp_issued;
                } else {
                    let (d_o, v) = (do_frag.offset(r0, 0), v_frag.offset(8 * nt0, 0));
                    mma_tiles::<E, MS, NC, KT>(&mut dp, |mt, ks| unsafe { d_o.a(16 * mt, ks) }, |np, ks| unsafe { v.b(16 * np, ks) });
                }
                for mt in 0..MS {
                    for hh in 0..2 {
                        let dr = 16 * mt as u32 + 8 * hh as u32;
                        let delta = unsafe { f32::from_bits(ld_shared_u32(delta_at + 4 * dr)) };
                        for nt in 0..NC as u32 {
                            let (p_sh, ds_sh) = (sm.p.shift(p_at, r0 + dr, nt0 + nt), sm.ds.shift(ds_at, r0 + dr, nt0 + nt));
                            let pv = if keep_p {
                                let p = &p_kept[mt][nt as usize];
                                (p[2 * hh], p[2 * hh + 1])
                            } else {
                                E::unpack(unsafe { ld_shared_u32(p_sh) })
                            };
                            let dcap = if softcap { E::unpack(unsafe { ld_shared_u32(ds_sh) }) } else { (1.0, 1.0) };
                            let d = &dp[mt][nt as usize];
                            let dsb = [pv.0 * (d[2 * hh] - delta), pv.1 * (d[2 * hh + 1] - delta)];
                            unsafe {
                                if mods.bias {
                                    // dS for dbias replaces the bias in the stage's bias tile: the
                                    // same thread read these two elements above and nothing else
                                    // reads them again.
                                    let v = if sum_group {
                                        let acc = &mut dbias_sum[mt][nt as usize];
                                        acc[2 * hh] += dsb[0];
                                        acc[2 * hh + 1] += dsb[1];
                                        [acc[2 * hh], acc[2 * hh + 1]]
                                    } else {
                                        dsb
                                    };
                                    if !sum_group || last_head {
                                        st_shared_u32(scores(c).bias_at_pair(dr, nt), E::pack(v[0], v[1]));
                                    }
                                }
                                st_shared_u32(ds_sh, E::pack(dsb[0] * dcap.0 * ds_scale, dsb[1] * dcap.1 * ds_scale));
                            }
                        }
                    }
                }
            }
            if WGMMA {
                fence_proxy_async();
            }
            sync_threads();

            // wgmma: dQ, dV and dK are issued at once and compute while dbias is added; dQ's
            // reductions then go out while dV and dK still compute.
            let (wq, wqd) = warp_at(warp, QR);
            let q_row0 = 16 * MQ as u32 * wq;
            let mut dq_issued = [[[0f32; 4]; DQ]; MQ];
            if WGMMA {
                // Aᵀ (M-major) from the P and dS tiles at the warpgroup's 64 keys, B (N-major) the
                // whole dO and Q tiles; for dQ, the warpgroup's 64 rows (from its first warp's) x
                // columns from chunk DQT wqd, K read N-major.
                let keys = 8 * (warp / 4);
                wgmma_tiles::<E, DQ, NK, 0, 1>(&mut dq_issued[0], |kk| sm.ds.wgmma_k_major(q_row0 & !63, kk), |kk| {
                    sm.k.wgmma_mn_major(kk, DQT as u32 * wqd)
                });
                wgmma_tiles::<E, DKV, MK, 1, 1>(&mut dv[0], |kk| sm.p.wgmma_mn_major(kk, keys), |kk| st.dout.wgmma_mn_major(kk, 0));
                wgmma_tiles::<E, DKV, MK, 1, 1>(&mut dk[0], |kk| sm.ds.wgmma_mn_major(kk, keys), |kk| st.q.wgmma_mn_major(kk, 0));
            }
            if mods.bias && (!sum_group || last_head) {
                unsafe { add_dbias::<E, BM, BN, WGMMA>(&kb, &st.bias, h, row0, rows_valid, tid, threads) };
            }

            // dV += Pᵀ dO and dK += dSᵀ Q: the warp's 16 MKV keys x 8 DKV columns, k = BM rows.
            let (p_frag, ds_frag) = (Fragments::new(sm.p, lane), Fragments::new(sm.ds, lane));
            let (wk, wd) = warp_at(warp, KR);
            let key_chunk = 2 * MKV as u32 * wk;
            let (col_base, col_call) = chunk_split(DKV as u32 * wd, DKV);
            // Aᵀ of the [rows][keys] P and dS tiles, B of the [rows][d] dO and Q tiles.
            let acc_atb = |acc: &mut [[[f32; 4]; DKV]; MKV], a: Fragments, b: Fragments| {
                let (a, b) = (a.offset(0, key_chunk), b.offset(0, col_base));
                mma_tiles::<E, MKV, DKV, MK>(acc, |mt, kk| unsafe { a.a_trans(16 * kk, 2 * mt) }, |np, kk| unsafe {
                    b.b_trans(16 * kk, col_call + 2 * np)
                });
            };
            if !WGMMA {
                acc_atb(&mut dv, p_frag, do_frag);
                acc_atb(&mut dk, ds_frag, q_frag);
            }

            // dQ = dS K for the warp's 16 MQ rows x 8 DQT columns, added to the f32 accumulator in
            // passes of `DQ` n8 tiles (the accumulators are live beside dK and dV).
            let turn = dq_turn(&kb, h, m, m_tiles);
            if DET {
                unsafe { wait_turn(turn, kb.n_block, tid) };
            }
            for pass in 0..(DQT / DQ) as u32 {
                let c0 = DQT as u32 * wqd + pass * DQ as u32;
                let mut dqt = [[[0f32; 4]; DQ]; MQ];
                if WGMMA {
                    wgmma_wait::<2, DQ>(&mut dq_issued[0]);
                    dqt = dq_issued;
                } else {
                    mma_tiles::<E, MQ, DQ, NK>(&mut dqt, |mt, kk| unsafe { ds_frag.a(q_row0 + 16 * mt, kk) }, |np, kk| unsafe {
                        k_frag.b_trans(16 * kk, c0 + 2 * np)
                    });
                }
                for mt in 0..MQ as u32 {
                    let r = q_row0 + 16 * mt;
                    let rows = kb.q_row(&p.dq_accum, h, row0 + r, 4) + 32 * c0 as u64;
                    let (dq, row_bytes, valid) = (&dqt[mt as usize], 4 * p.dq_accum.stride[1], rows_valid.saturating_sub(r));
                    if WGMMA {
                        unsafe { add_dq_v2(dq, rows, row_bytes, valid, lane) };
                    } else {
                        unsafe { add_dq(dq, sm.dq_stage(warp), rows, row_bytes, valid, lane) };
                    }
                }
            }
            if DET {
                unsafe { pass_turn(turn, kb.n_block + 1, tid) };
            }
            if WGMMA {
                // dV and dK read the P, dS and stage tiles the next step overwrites.
                wgmma_wait::<0, DKV>(&mut dv[0]);
            }
            if STAGES == 1 {
                // Single stage: load the next step only now that this one is done with it.
                sync_threads();
                if let Some(nm) = next_m {
                    unsafe { load_stage::<D, BM, BN>(&kb, &st, &mods, by_class, nm, kb.head(next_h), tid, threads) };
                }
                cp_async_commit();
            }
            if STAGES == 2 {
                stage = 1 - stage;
            }
            if hg + 1 == group && DET {
                unsafe { pass_skipped_turns(p, &kb, m + 1, next_tile.map_or(m_tiles, |t| t.n), m_tiles, tid) };
            }
        }
    }

    // Epilogue: the dbias turn passed on, then dK and dV stored.
    let tid = opaque(tid);
    let kb = KeyBlock::reread::<BAND>(p, BN as u32, placed, swaps, slot);
    if let Some((lock, turn)) = dbias_turn::<BN, DET>(&kb, &Mods::of(f, MODS)) {
        unsafe { pass_turn(lock, turn + 1, tid) };
    }
    unsafe { store_dkdv::<E, MKV, DKV, KR, WGMMA>(p, &kb, &sm, &dk, &dv, splits, tid, threads) };
}

/// Epilogue: dK and dV out of their accumulators. A CTA with a share of its key tile's query
/// tiles (a kernel that `splits`, `BwdParams::q_split_shift`) adds them to the f32
/// accumulators; otherwise they go through the K and V tiles (every warp is past its last read
/// of them) to coalesced stores. A CTA whose key tile no query sees never waited for its K/V
/// copies: they land before the tiles are overwritten, or they would overwrite dK/dV. The
/// parameters come as a pointer: as a reference argument LLVM would take them as unwritten
/// through the step and reorder its address arithmetic (the kernels sit at the register limit).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn store_dkdv<E: Elem, const MKV: usize, const DKV: usize, const KR: usize, const WGMMA: bool>(
    p: *const BwdParams,
    kb: &KeyBlock,
    sm: &Smem,
    dk: &[[[f32; 4]; DKV]; MKV],
    dv: &[[[f32; 4]; DKV]; MKV],
    splits: bool,
    tid: u32,
    threads: u32,
) {
    let p = unsafe { &*p };
    let lane = tid % 32;
    let (g, t) = (lane / 4, lane % 4);
    let (wk, wd) = warp_at(tid / 32, KR);
    cp_async_wait_all();
    sync_threads();
    if splits && p.q_split_shift != 0 {
        // A share of the query tiles: added to the f32 accumulators (their keys past the
        // CTA's `seqlen_k` got nothing from it, see `seq::localize_split`).
        let (dk_at, dv_at) = (kb.kv_row(&p.dk, 4), kb.kv_row(&p.dv, 4));
        let row_bytes = 4 * p.dk.stride[1];
        for mt in 0..MKV {
            for hh in 0..2 {
                let key = 16 * (MKV as u32 * wk + mt as u32) + 8 * hh as u32 + g;
                let ok = key < kb.keys_valid;
                for dt in 0..DKV {
                    let at = key as u64 * row_bytes + 4 * (8 * (DKV as u32 * wd + dt as u32) + 2 * t) as u64;
                    let (k, v) = (&dk[mt][dt], &dv[mt][dt]);
                    unsafe {
                        add_pair::<WGMMA>(ok, dk_at + at, [k[2 * hh], k[2 * hh + 1]]);
                        add_pair::<WGMMA>(ok, dv_at + at, [v[2 * hh], v[2 * hh + 1]]);
                    }
                }
            }
        }
        return;
    }
    let at = sm.k.chunk(g, 0) + 4 * t;
    for mt in 0..MKV {
        for hh in 0..2 {
            let dr = 16 * (MKV as u32 * wk + mt as u32) + 8 * hh as u32;
            for dt in 0..DKV {
                let chunk = DKV as u32 * wd + dt as u32;
                let (k, v) = (&dk[mt][dt], &dv[mt][dt]);
                unsafe {
                    st_shared_u32(sm.k.shift(at, dr, chunk), E::pack(k[2 * hh], k[2 * hh + 1]));
                    st_shared_u32(sm.v.shift(at - sm.k.base + sm.v.base, dr, chunk), E::pack(v[2 * hh], v[2 * hh + 1]));
                }
            }
        }
    }
    sync_threads();
    unsafe {
        sm.k.store(kb.kv_row(&p.dk, 2), 2 * p.dk.stride[1], kb.keys_valid, tid, threads);
        sm.v.store(kb.kv_row(&p.dv, 2), 2 * p.dv.stride[1], kb.keys_valid, tid, threads);
    }
}

/// Adds two consecutive f32 (8-byte aligned) where `ok`: one vector reduction where the device
/// has sm_90's (`V2`).
#[inline(always)]
unsafe fn add_pair<const V2: bool>(ok: bool, addr: u64, v: [f32; 2]) {
    unsafe {
        if V2 {
            red_add_v2_f32_if(ok, addr, v);
        } else {
            red_add_f32_if(ok, addr, v[0]);
            red_add_f32_if(ok, addr + 4, v[1]);
        }
    }
}

/// Splits a warp's chunk offset (a multiple of `span`, the chunks the warp covers) into the
/// part [`Fragments::offset`] can take (all of it where `span` is a power of two) and the part
/// each fragment load adds itself.
#[inline(always)]
fn chunk_split(chunks: u32, span: usize) -> (u32, u32) {
    if span.is_power_of_two() { (chunks, 0) } else { (0, chunks) }
}

/// `acc += A B` over `KT` k-steps for a warp's `MT` m16 x `NT` n8 accumulator tiles, where
/// `a(mt, k)` loads the A fragment of row tile `mt` and `b(np, k)` the B fragments of n8 tiles
/// `2 np` and `2 np + 1` at k-step `k`. Every product of the backward is one of these, its
/// operands read straight or transposed out of their shared tiles.
#[inline(always)]
fn mma_tiles<E: Elem, const MT: usize, const NT: usize, const KT: usize>(
    acc: &mut [[[f32; 4]; NT]; MT],
    a: impl Fn(u32, u32) -> [u32; 4],
    b: impl Fn(u32, u32) -> [u32; 4],
) {
    for k in 0..KT as u32 {
        let af: [[u32; 4]; MT] = core::array::from_fn(|mt| a(mt as u32, k));
        for np in 0..NT / 2 {
            let bf = b(np as u32, k);
            for mt in 0..MT {
                E::mma(&mut acc[mt][2 * np], &af[mt], bf[0], bf[1]);
                E::mma(&mut acc[mt][2 * np + 1], &af[mt], bf[2], bf[3]);
            }
        }
    }
}

/// `acc += A B` over `KT` k16 steps of a warpgroup's product (sm_90a), `a(k)` and `b(k)` the
/// operands' descriptors at step `k`, `TA`/`TB` their majorness (see [`Elem::wgmma`]): issued
/// back to back and committed as one group, for [`wgmma_wait`] to wait for.
#[inline(always)]
fn wgmma_tiles<E: Elem, const NT: usize, const KT: usize, const TA: u32, const TB: u32>(
    acc: &mut [[f32; 4]; NT],
    a: impl Fn(u32) -> u64,
    b: impl Fn(u32) -> u64,
) {
    wgmma_fence();
    for k in 0..KT as u32 {
        E::wgmma::<NT, TA, TB>(acc, a(k), b(k));
    }
    wgmma_commit();
}

/// Adds a warp's dQ block (16 rows x `8 DQ` columns in the MMA accumulator layout) to the f32
/// accumulator whose row 0, column 0 is at `rows`, rows `row_bytes` apart, `rows_valid` of them
/// inside the sequence. The tiles pass through the warp's staging slice, `BWD_DQ_STAGE_TILES` at
/// a time as 16 x 8 row-major blocks, so that each addition instruction covers 4 rows x 8
/// consecutive columns: whole 32-byte sectors, where the accumulator layout's 8 rows x 4
/// scattered columns used half of each sector (the backward was bound by L2 throughput).
#[inline(always)]
unsafe fn add_dq<const DQ: usize>(dqt: &[[f32; 4]; DQ], stage: u32, rows: u64, row_bytes: u64, rows_valid: u32, lane: u32) {
    const TILES: usize = BWD_DQ_STAGE_TILES as usize;
    const { assert!(DQ % TILES == 0) };
    let (g, t) = (lane / 4, lane % 4);
    for chunk in 0..DQ / TILES {
        for j in 0..TILES {
            let v = &dqt[chunk * TILES + j];
            for hh in 0..2 {
                let at = stage + 512 * j as u32 + 4 * (8 * (8 * hh as u32 + g) + 2 * t);
                unsafe { st_shared_v2(at, [v[2 * hh].to_bits(), v[2 * hh + 1].to_bits()]) };
            }
        }
        sync_warp();
        for j in 0..TILES {
            for i in 0..4u32 {
                let r = 4 * i + lane / 8;
                let v = f32::from_bits(unsafe { ld_shared_u32(stage + 512 * j as u32 + 128 * i + 4 * lane) });
                let col = 8 * (chunk * TILES + j) as u64 + (lane % 8) as u64;
                unsafe { red_add_f32_if(r < rows_valid, rows + r as u64 * row_bytes + 4 * col, v) };
            }
        }
        sync_warp();
    }
}

/// Adds a warp's dQ block (16 rows x `8 DQ` columns in the MMA accumulator layout, rows
/// `row_bytes` apart from `rows`, `rows_valid` of them inside the sequence) to the f32
/// accumulator straight from the registers, with sm_90's 8-byte vector reductions: a quad's four
/// lanes cover 32 consecutive bytes of a row, a whole sector, with no staging.
#[inline(always)]
unsafe fn add_dq_v2<const DQ: usize>(dqt: &[[f32; 4]; DQ], rows: u64, row_bytes: u64, rows_valid: u32, lane: u32) {
    let (g, t) = (lane / 4, lane % 4);
    let add = |full: bool| {
        for hh in 0..2 {
            let r = g + 8 * hh as u32;
            let at = rows + r as u64 * row_bytes + 8 * t as u64;
            for (j, v) in dqt.iter().enumerate() {
                unsafe { red_add_v2_f32_if(full || r < rows_valid, at + 32 * j as u64, [v[2 * hh], v[2 * hh + 1]]) };
            }
        }
    };
    // Whole tiles (the common case) without predicates.
    if rows_valid >= 16 { add(true) } else { add(false) }
}

/// Adds the dS tile (in the stage's bias tile) to the f32 dbias accumulator at the bias's
/// broadcast coordinates. Where the bias is broadcast over the tile's rows or keys, the tile is
/// first summed over them here, so that each accumulator element gets one addition per tile
/// from one thread (a plain read-add-write is then race-free within the CTA). `V2`: the device
/// has sm_90's vector reductions.
#[inline(always)]
unsafe fn add_dbias<E: Elem, const BM: usize, const BN: usize, const V2: bool>(
    kb: &KeyBlock,
    tile: &SmemTile,
    h: u32,
    row0: u32,
    rows_valid: u32,
    tid: u32,
    threads: u32,
) {
    let (p, f) = (kb.p, &kb.p.fwd);
    let ds = |r: u32, c: u32| E::unpack(unsafe { ld_shared_u16(tile.chunk(r, c / 8) + 2 * (c % 8)) }).0;
    let (rows, keys) = (rows_valid.min(BM as u32), kb.keys_valid.min(BN as u32));
    // Read once: the parameters live in shared memory and would be reloaded after every addition.
    let stride = p.dbias_accum.stride;
    let (row_bytes, key_bytes) = (4 * stride[2], 4 * stride[3]);
    let base = kb.broadcast_at(&p.dbias_accum, f.bias_head_div, h, row0, 0, 4);
    match (stride[2] == 0, stride[3] == 0) {
        (false, false) => {
            // Element-wise, a pair of keys per thread: consecutive threads take consecutive
            // pairs of a row, so that each warp-wide addition covers whole 32-byte sectors.
            const { assert!(BN % 64 == 0) };
            let pairs = (BN / 2) as u32;
            let c = 2 * (tid % pairs);
            let (r_first, r_step) = (tid / pairs, threads / pairs);
            let at = base + r_first as u64 * row_bytes + c as u64 * key_bytes;
            // sm_90: the pair in one vector reduction where both keys are in and 8-byte aligned.
            let pair = V2 && c + 1 < keys && key_bytes == 4 && row_bytes % 8 == 0 && base % 8 == 0;
            for i in 0..BM as u32 / r_step {
                let r = r_first + i * r_step;
                let (d0, d1) = E::unpack(unsafe { ld_shared_u32(tile.chunk(r, c / 8) + 2 * (c % 8)) });
                let at = at + (i * r_step) as u64 * row_bytes;
                unsafe {
                    if pair {
                        red_add_v2_f32_if(r < rows, at, [d0, d1]);
                    } else {
                        red_add_f32_if(r < rows && c < keys, at, d0);
                        red_add_f32_if(r < rows && c + 1 < keys, at + key_bytes, d1);
                    }
                }
            }
        }
        (true, false) => {
            // One bias row for all query rows: column sums.
            let mut c = tid;
            while c < keys {
                let mut sum = 0.0;
                for r in 0..rows {
                    sum += ds(r, c);
                }
                unsafe { red_add_f32_if(true, base + c as u64 * key_bytes, sum) };
                c += threads;
            }
        }
        (false, true) => {
            // One bias value per query row: row sums.
            let mut r = tid;
            while r < rows {
                let mut sum = 0.0;
                for c in 0..keys {
                    sum += ds(r, c);
                }
                unsafe { red_add_f32_if(true, base + r as u64 * row_bytes, sum) };
                r += threads;
            }
        }
        (true, true) => {
            // One value for the whole tile: warp 0 sums it.
            if tid < 32 {
                let mut sum = 0.0;
                let mut r = tid;
                while r < rows {
                    for c in 0..keys {
                        sum += ds(r, c);
                    }
                    r += 32;
                }
                let sum = warp_sum(sum);
                unsafe { red_add_f32_if(tid == 0, base, sum) };
            }
        }
    }
}

/// The dQ turn counter of (head `h`, query tile `m`).
#[inline(always)]
fn dq_turn(kb: &KeyBlock, h: u32, m: u32, m_tiles: u32) -> u64 {
    let tile = (kb.batch as u64 * kb.p.fwd.heads as u64 + h as u64) * m_tiles as u64 + m as u64;
    kb.p.dq_turns + 4 * tile
}

/// Deterministic mode: passes on the dQ turns of query tiles `from..to` this CTA skips, for
/// every head of its group (thread 0; no data moves).
#[inline(always)]
unsafe fn pass_skipped_turns(p: &BwdParams, kb: &KeyBlock, from: u32, to: u32, m_tiles: u32, tid: u32) {
    if tid == 0 {
        for m in from..to.min(m_tiles) {
            for hg in 0..p.fwd.kv_group {
                let turn = dq_turn(kb, kb.head(hg), m, m_tiles);
                while unsafe { ld_acquire_u32(turn) } != kb.n_block {}
                unsafe { st_release_u32(turn, kb.n_block + 1) };
            }
        }
    }
}
