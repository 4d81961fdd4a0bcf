//! Backward attention: one CTA per (key tile, kv head, batch). K and V of the tile stay in
//! shared memory while the CTA walks the query tiles that can see them (the mask's block map and
//! the causal rule skip the rest) and, inside each, the query heads of its kv group; the next
//! query tile's Q, dO, bias and mask load while the current one computes. Per step, on tensor
//! cores (4 x WN warps over rows x columns of each product): S = QKᵀ and dP = dO Vᵀ, then P and dS = P (dP - delta) through shared memory into
//! dV += Pᵀ dO, dK += dSᵀ Q (registers, summed over the group: GQA needs no reduction pass) and
//! dQ = dS K, added to an f32 accumulator. dS also replaces the bias in its shared tile, from
//! where it is added to the f32 dbias accumulator at the bias's own (broadcast) coordinates.
//!
//! Wide heads split D over `SPLITS` CTAs per key tile (each recomputes S and dP, and keeps only
//! its columns of dK and dV in registers).
//!
//! The additions to dq and dbias are atomic by default. With `flags::DETERMINISTIC` they are
//! plain read-add-writes taken in a fixed order instead: dQ tile (b, h, m) receives key tile n's
//! contribution on turn n (a counter per dQ tile), and CTAs sharing a broadcast dbias column
//! take it in turns in block order. Turns only wait on CTAs of lower block index, which are
//! scheduled first, so they cannot deadlock.
use crate::arch::*;
use crate::elem::Elem;
use crate::mask::{MapCols, TileCursor, Visibility};
use crate::scores::{LOG2E, Mods, WarpScores};
use crate::tile::{Fragments, SmemTile, load_mask_bits_async};
use dmattn_abi::{BWD_DQ_STAGE_BYTES, BWD_DQ_STAGE_TILES, BwdParams, bwd_stage_bytes, flags, mask_tile_bytes};

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
}

impl Smem {
    #[inline(always)]
    fn new(d: usize, bm: usize, bn: usize, stages: usize) -> Self {
        let k = SmemTile::new(smem_base(), bn, d * 2);
        let v = SmemTile::new(k.base + k.bytes(), bn, d * 2);
        let p = SmemTile::new(v.base + v.bytes(), bm, bn * 2);
        let ds = SmemTile::new(p.base + p.bytes(), bm, bn * 2);
        Smem { k, v, p, ds, shape: (d, bm, bn), stages: stages as u32 }
    }

    /// Warp `w`'s dQ staging slice, after the stages.
    #[inline(always)]
    fn dq_stage(&self, w: u32) -> u32 {
        let (d, bm, bn) = self.shape;
        self.ds.base + self.ds.bytes() + self.stages * bwd_stage_bytes(bm as u32, bn as u32, d as u32) + w * BWD_DQ_STAGE_BYTES
    }

    /// Pipeline stage `i` (computed, not indexed: a runtime index into an array of tiles would
    /// put the array in local memory).
    #[inline(always)]
    fn stage(&self, i: u32) -> Stage {
        let (d, bm, bn) = self.shape;
        let bytes = bwd_stage_bytes(bm as u32, bn as u32, d as u32);
        let q = SmemTile::new(self.ds.base + self.ds.bytes() + i * bytes, bm, d * 2);
        let dout = SmemTile::new(q.base + q.bytes(), bm, d * 2);
        let bias = SmemTile::new(dout.base + dout.bytes(), bm, bn * 2);
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
    /// Which of the head dim's column splits this CTA accumulates dK, dV and dQ for.
    split: u32,
    kv_head: u32,
    batch: u32,
    col0: u32,
    keys_valid: u32,
    vis: Visibility,
}

impl<'a> KeyBlock<'a> {
    #[inline(always)]
    fn new(p: &'a BwdParams, block_n: u32, splits: u32, hide: bool) -> Self {
        let (bx, kv_head, batch) = block_idx();
        let (bx, kv_head, batch) = if hide { (opaque(bx), opaque(kv_head), opaque(batch)) } else { (bx, kv_head, batch) };
        let f = &p.fwd;
        let n_block = bx / splits;
        let col0 = n_block * block_n;
        KeyBlock {
            p,
            n_block,
            split: bx % splits,
            kv_head,
            batch,
            col0,
            keys_valid: f.seqlen_k - col0,
            vis: Visibility { seqlen_q: f.seqlen_q, seqlen_k: f.seqlen_k, causal: f.flags & flags::CAUSAL != 0 },
        }
    }

    /// Query head `hg` of the group.
    #[inline(always)]
    fn head(&self, hg: u32) -> u32 {
        self.kv_head * self.p.fwd.kv_group + hg
    }

    /// Byte address of key row `col0` of a `[b, sk, hk, d]` 16-bit operand.
    #[inline(always)]
    fn kv_row(&self, t: &dmattn_abi::View4) -> u64 {
        t.ptr + 2 * (self.batch as u64 * t.stride[0] + self.kv_head as u64 * t.stride[2] + self.col0 as u64 * t.stride[1])
    }

    /// Byte address of row `row0` of head `h` of a `[b, sq, h, d]` operand of `elem` bytes.
    #[inline(always)]
    fn q_row(&self, t: &dmattn_abi::View4, h: u32, row0: u32, elem: u64) -> u64 {
        t.ptr + elem * (self.batch as u64 * t.stride[0] + h as u64 * t.stride[2] + row0 as u64 * t.stride[1])
    }

    /// Index of `[b, h, sq]` row `row` (lse and delta).
    #[inline(always)]
    fn row_index(&self, h: u32, row: u32) -> u64 {
        (self.batch as u64 * self.p.fwd.heads as u64 + h as u64) * self.p.fwd.seqlen_q as u64 + row as u64
    }

    /// Element address of (head `h`, query `row`, key column `col0 + c`) in a broadcast
    /// `[b, h, sq, sk]` operand with `elem`-byte elements, heads mapped through `head_div`.
    #[inline(always)]
    fn broadcast_at(&self, t: &dmattn_abi::View4, head_div: u32, h: u32, row: u32, c: u32, elem: u64) -> u64 {
        let s = t.stride;
        t.ptr
            + elem
                * (self.batch as u64 * s[0]
                    + (h / head_div) as u64 * s[1]
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
        let mb = &f.mask_bits;
        let head = (h / f.mask_head_div) as u64;
        let src = mb.ptr
            + 8 * (kb.batch as u64 * mb.stride[0] + head * mb.stride[1] + row0 as u64 * mb.stride[2] + (kb.col0 / 64) as u64);
        unsafe { load_mask_bits_async(st.mask, src, mb.stride[2], BM, BN, rows, tid, threads) };
    }
}

/// Const parameters: head dim `D`, query tile `BM`, key tile `BN`, `STAGES`, and fragment counts
/// per warp (`4 * WN` warps as 4 row groups x `WN` column groups): `KT = D / 16` k-steps of QKᵀ
/// and dO Vᵀ, `NT = BN / (8 WN)` n8 tiles of a warp's scores, `DT = D / (8 WN)` n8 tiles of a
/// warp's columns of a `D`-wide product, `MK = BM / 16` and `NK = BN / 16` k-steps of the dV/dK and dQ products,
/// and `DQ` n8 tiles per pass of the dQ product.
#[inline(always)]
pub unsafe fn backward<
    E: Elem,
    const D: usize,
    const BM: usize,
    const BN: usize,
    const STAGES: usize,
    const KT: usize,
    const NT: usize,
    const DT: usize,
    const MK: usize,
    const NK: usize,
    const DQ: usize,
    const WN: usize,
    const SPLITS: usize,
    const MODS: bool,
>(
    p: &BwdParams,
) {
    const {
        assert!(KT * 16 == D && NT * 8 * WN == BN && DT * 8 * WN * SPLITS == D && MK * 16 == BM && NK * 16 == BN);
        assert!(BM == 64 && BN % 64 == 0 && NT % 2 == 0 && DT % 2 == 0);
        assert!(DT % DQ == 0 && DQ % 2 == 0);
    }
    let f = &p.fwd;
    let threads = 128 * WN as u32;
    let sm = Smem::new(D, BM, BN, STAGES);
    let mods = Mods::of::<MODS>(f);
    let deterministic = f.flags & flags::DETERMINISTIC != 0;
    let group = f.kv_group;
    let tid = thread_idx();
    let kb = KeyBlock::new(p, BN as u32, SPLITS as u32, false);
    let m_tiles = f.seqlen_q.div_ceil(BM as u32);

    // dbias elements that CTAs of several batches, kv heads or key tiles add to (a bias
    // broadcast over them) are taken in turns in deterministic mode: one turn counter per slot
    // of the dimensions not shared, the sharing CTAs in block order (key tile fastest, as in the
    // grid). Only split 0 adds dbias (every split computes the same dS).
    let bd = p.bias_dims;
    let n_blocks = f.seqlen_k.div_ceil(BN as u32);
    let (sb, sh, sn) = (bd[0] == 1 && f.batch > 1, bd[1] == 1 && p.kv_heads > 1, bd[3] == 1 && n_blocks > 1);
    // Mixed-radix digits (index, extent): shared dimensions number the turn, the others the slot.
    let turn_digit = |shared: bool, index: u32, extent: u32| if shared { (index, extent) } else { (0, 1) };
    let slot_digit = |shared: bool, index: u32, extent: u32| if shared { (0, 1) } else { (index as u64, extent as u64) };
    let ((tb, _), (th, the), (tn, tne)) =
        (turn_digit(sb, kb.batch, f.batch), turn_digit(sh, kb.kv_head, p.kv_heads), turn_digit(sn, kb.n_block, n_blocks));
    let ((xb, _), (xh, xhe), (xn, xne)) =
        (slot_digit(sb, kb.batch, f.batch), slot_digit(sh, kb.kv_head, p.kv_heads), slot_digit(sn, kb.n_block, n_blocks));
    let dbias_turn = (tb * the + th) * tne + tn;
    let slot = (xb * xhe + xh) * xne + xn;
    let dbias_adder = mods.bias && kb.split == 0;
    let dbias_shared = dbias_adder && (sb || sh || sn);
    let dbias_lock = p.dbias_turns + 4 * slot;
    if deterministic && dbias_shared {
        unsafe { wait_turn(dbias_lock, dbias_turn, tid) };
    }

    let mut dk = [[[0f32; 4]; DT]; 1];
    let mut dv = [[[0f32; 4]; DT]; 1];

    // K and V stay for the whole CTA.
    let kv_bytes = (D * 2) as u32;
    unsafe {
        sm.k.load_async(kb.kv_row(&f.k), 2 * f.k.stride[1], kb.keys_valid, kv_bytes, tid, threads);
        sm.v.load_async(kb.kv_row(&f.v), 2 * f.v.stride[1], kb.keys_valid, kv_bytes, tid, threads);
    }

    // Steps are (query tile, head of the group), tiles in order; a deterministic run also visits
    // the tiles it skips, to pass their dQ turns on.
    let map = MapCols::<BM, BN>::new(&f.block_map, block_map_plane(p, &kb), map_planes(p), kb.n_block, &kb.vis);
    let mut cursor = TileCursor::new();
    let m_begin = kb.vis.query_tile_begin(kb.col0, BM as u32);
    let mut next_tile = cursor.next(m_begin, tid % 32, &map);
    if deterministic {
        unsafe { pass_skipped_turns(p, &kb, 0, next_tile.map_or(m_tiles, |t| t.n), m_tiles, SPLITS as u32, tid) };
    }
    if let Some(first) = next_tile {
        unsafe { load_stage::<D, BM, BN>(&kb, &sm.stage(0), &mods, first.n, kb.head(0), tid, threads) };
    }
    cp_async_commit();

    let mut stage = 0u32;
    while let Some(tile) = next_tile {
        for hg in 0..group {
            let tid = opaque(tid);
            let kb = KeyBlock::new(p, BN as u32, SPLITS as u32, true);
            let lane = tid % 32;
            let (g, t) = (lane / 4, lane % 4);
            let (wm, wn) = ((tid / 32) % 4, tid / 128);
            let h = kb.head(hg);
            let m = tile.n;
            let row0 = m * BM as u32;
            let st = sm.stage(stage);

            // This step's stage has landed; every warp is done with the previous step.
            cp_async_wait_all();
            sync_threads();
            // Prefetch the next step: the next head of this tile, or the next tile's first head.
            let (next_m, next_h) = if hg + 1 < group {
                (Some(m), hg + 1)
            } else {
                let map = MapCols::<BM, BN>::new(&f.block_map, block_map_plane(p, &kb), map_planes(p), kb.n_block, &kb.vis);
                next_tile = cursor.next(m + 1, lane, &map);
                (next_tile.map(|t| t.n), 0)
            };
            if let (2, Some(nm)) = (STAGES, next_m) {
                unsafe { load_stage::<D, BM, BN>(&kb, &sm.stage(1 - stage), &mods, nm, kb.head(next_h), tid, threads) };
            }
            cp_async_commit();

            // S = Q Kᵀ on the score offsets, and dP = dO Vᵀ, for the warp's 16 rows x BN / 2 keys.
            let (q_frag, do_frag) = (Fragments::new(st.q, lane), Fragments::new(st.dout, lane));
            let (k_frag, v_frag) = (Fragments::new(sm.k, lane), Fragments::new(sm.v, lane));
            let warp = WarpScores { bias: st.bias, mask: st.mask, mask_row_bytes: (BN / 8) as u32, row0: 16 * wm, nt0: NT as u32 * wn, lane };
            let mut s = [[[0f32; 4]; NT]; 1];
            let rows_valid = f.seqlen_q - row0;
            // Rows past seqlen_q have no LSE: hide them, unlike the forward where they are unread.
            let check = !tile.full || kb.vis.tile_needs_check(row0, kb.col0, BN as u32) || rows_valid < BM as u32;
            let bounds = kb.vis.at_tile(row0, kb.col0).with_rows(rows_valid).shifted(16 * wm + g, 8 * NT as u32 * wn + 2 * t);
            warp.init::<E, 1, NT>(&mut s, &mods, &bounds, check, mods.mask && !tile.full);
            let mut dp = [[[0f32; 4]; NT]; 1];
            for ks in 0..KT as u32 {
                let (a, ad) = unsafe { (q_frag.a(16 * wm, ks), do_frag.a(16 * wm, ks)) };
                for np in 0..NT / 2 {
                    let n0 = 8 * NT as u32 * wn + 16 * np as u32;
                    let (bk, bv) = unsafe { (k_frag.b(n0, ks), v_frag.b(n0, ks)) };
                    E::mma(&mut s[0][2 * np], &a, bk[0], bk[1]);
                    E::mma(&mut s[0][2 * np + 1], &a, bk[2], bk[3]);
                    E::mma(&mut dp[0][2 * np], &ad, bv[0], bv[1]);
                    E::mma(&mut dp[0][2 * np + 1], &ad, bv[2], bv[3]);
                }
            }

            // Logits, P = exp2(logit - lse), dS = P (dP - delta), fused per score pair (no logit or
            // softcap-derivative tile is held). dS goes to dbias; P and dS * scale * d(softcap)
            // to shared memory for the three products below.
            let p_at = sm.p.chunk(g, 0) + 4 * t;
            for hh in 0..2 {
                let r = 16 * wm + 8 * hh as u32 + g;
                let lse = unsafe { f32::from_bits(ld_shared_u32(st.lse + 4 * r)) };
                // An empty row has LSE -inf and P = 0: subtract +inf instead of -inf.
                let lse2 = if lse == f32::NEG_INFINITY { f32::INFINITY } else { lse * LOG2E };
                let delta = unsafe { f32::from_bits(ld_shared_u32(st.delta + 4 * r)) };
                for nt in 0..NT {
                    let acc = [s[0][nt][2 * hh], s[0][nt][2 * hh + 1]];
                    let (x, dcap) = warp.logits::<E>(acc, 8 * hh as u32, nt as u32, &mods);
                    let mut pv = [0f32; 2];
                    let mut dsv = [0f32; 2];
                    let mut dsb = [0f32; 2];
                    for e in 0..2 {
                        let pe = exp2(x[e] - lse2);
                        let ds = pe * (dp[0][nt][2 * hh + e] - delta);
                        pv[e] = pe;
                        dsb[e] = ds;
                        dsv[e] = ds * dcap[e] * (mods.scale_log2 / LOG2E);
                    }
                    if mods.bias {
                        // dS for dbias replaces the bias in the stage's bias tile: the same thread
                        // read these two elements above and nothing else reads them again.
                        let at = st.bias.shift(st.bias.chunk(g, 0) + 4 * t, 16 * wm + 8 * hh as u32, NT as u32 * wn + nt as u32);
                        unsafe { st_shared_u32(at, E::pack(dsb[0], dsb[1])) };
                    }
                    let (dr, chunk) = (16 * wm + 8 * hh as u32, NT as u32 * wn + nt as u32);
                    unsafe {
                        st_shared_u32(sm.p.shift(p_at, dr, chunk), E::pack(pv[0], pv[1]));
                        st_shared_u32(sm.ds.shift(p_at - sm.p.base + sm.ds.base, dr, chunk), E::pack(dsv[0], dsv[1]));
                    }
                }
            }
            sync_threads();
            if dbias_adder {
                unsafe { add_dbias::<E, BM, BN>(&kb, &st.bias, h, row0, rows_valid, deterministic, tid, threads) };
            }

            // dV += Pᵀ dO and dK += dSᵀ Q: the warp's 16 keys x D / 2 columns, k = BM rows.
            let (p_frag, ds_frag) = (Fragments::new(sm.p, lane), Fragments::new(sm.ds, lane));
            let d0 = DT as u32 * (wn + WN as u32 * kb.split); // the warp's first column chunk (8 columns) of D
            for kk in 0..MK as u32 {
                let (ap, ads) = unsafe { (p_frag.a_trans(16 * kk, 2 * wm), ds_frag.a_trans(16 * kk, 2 * wm)) };
                for dq in 0..DT / 2 {
                    let c = d0 + 2 * dq as u32;
                    let (bo, bq) = unsafe { (do_frag.b_trans(16 * kk, c), q_frag.b_trans(16 * kk, c)) };
                    E::mma(&mut dv[0][2 * dq], &ap, bo[0], bo[1]);
                    E::mma(&mut dv[0][2 * dq + 1], &ap, bo[2], bo[3]);
                    E::mma(&mut dk[0][2 * dq], &ads, bq[0], bq[1]);
                    E::mma(&mut dk[0][2 * dq + 1], &ads, bq[2], bq[3]);
                }
            }

            // dQ = dS K for the warp's 16 rows x D / 2 columns, added to the f32 accumulator in
            // passes of `DQ` n8 tiles (fewer registers for wide heads).
            let turn = dq_turn(&kb, h, m, m_tiles, SPLITS as u32);
            if deterministic {
                unsafe { wait_turn(turn, kb.n_block, tid) };
            }
            for pass in 0..(DT / DQ) as u32 {
                let c0 = d0 + pass * DQ as u32;
                let mut dqt = [[0f32; 4]; DQ];
                for kk in 0..NK as u32 {
                    let a = unsafe { ds_frag.a(16 * wm, kk) };
                    for dq in 0..DQ / 2 {
                        let bk = unsafe { k_frag.b_trans(16 * kk, c0 + 2 * dq as u32) };
                        E::mma(&mut dqt[2 * dq], &a, bk[0], bk[1]);
                        E::mma(&mut dqt[2 * dq + 1], &a, bk[2], bk[3]);
                    }
                }
                let rows = kb.q_row(&p.dq_accum, h, row0 + 16 * wm, 4) + 32 * c0 as u64;
                let row_bytes = 4 * p.dq_accum.stride[1];
                let warp_rows = rows_valid.saturating_sub(16 * wm);
                unsafe { add_dq(&dqt, sm.dq_stage(tid / 32), rows, row_bytes, warp_rows, lane, deterministic) };
            }
            if deterministic {
                unsafe { pass_turn(turn, kb.n_block + 1, tid) };
            }
            if STAGES == 1 {
                // Single stage: load the next step only now that this one is done with it.
                sync_threads();
                if let Some(nm) = next_m {
                    unsafe { load_stage::<D, BM, BN>(&kb, &st, &mods, nm, kb.head(next_h), tid, threads) };
                }
                cp_async_commit();
            }
            if STAGES == 2 {
                stage = 1 - stage;
            }
            if hg + 1 == group && deterministic {
                unsafe { pass_skipped_turns(p, &kb, m + 1, next_tile.map_or(m_tiles, |t| t.n), m_tiles, SPLITS as u32, tid) };
            }
        }
    }

    if deterministic && dbias_shared {
        unsafe { pass_turn(dbias_lock, dbias_turn + 1, tid) };
    }

    // Epilogue: dK and dV through the K and V tiles (every warp is past its last read of them)
    // to coalesced stores. A CTA whose key tile no query sees never waited for its K/V copies:
    // they must land before the tiles are overwritten, or they overwrite the zero dK/dV.
    let tid = opaque(tid);
    let kb = KeyBlock::new(p, BN as u32, SPLITS as u32, true);
    let lane = tid % 32;
    let (g, t) = (lane / 4, lane % 4);
    let (wm, wn) = ((tid / 32) % 4, tid / 128);
    cp_async_wait_all();
    sync_threads();
    let at = sm.k.chunk(g, 0) + 4 * t;
    for hh in 0..2 {
        let dr = 16 * wm + 8 * hh as u32;
        for dt in 0..DT {
            let chunk = DT as u32 * (wn + WN as u32 * kb.split) + dt as u32;
            let (k, v) = (&dk[0][dt], &dv[0][dt]);
            unsafe {
                st_shared_u32(sm.k.shift(at, dr, chunk), E::pack(k[2 * hh], k[2 * hh + 1]));
                st_shared_u32(sm.v.shift(at - sm.k.base + sm.v.base, dr, chunk), E::pack(v[2 * hh], v[2 * hh + 1]));
            }
        }
    }
    sync_threads();
    unsafe {
        let (chunk0, chunks) = ((kb.split * (D / SPLITS / 8) as u32), (D / SPLITS / 8) as u32);
        sm.k.store_cols(kb.kv_row(&p.dk), 2 * p.dk.stride[1], kb.keys_valid, chunk0, chunks, tid, threads);
        sm.v.store_cols(kb.kv_row(&p.dv), 2 * p.dv.stride[1], kb.keys_valid, chunk0, chunks, tid, threads);
    }
}

/// Adds a warp's dQ block (16 rows x `8 DQ` columns in the MMA accumulator layout) to the f32
/// accumulator whose row 0, column 0 is at `rows`, rows `row_bytes` apart, `rows_valid` of them
/// inside the sequence. The tiles pass through the warp's staging slice, `BWD_DQ_STAGE_TILES` at
/// a time as 16 x 8 row-major blocks, so that each addition instruction covers 4 rows x 8
/// consecutive columns: whole 32-byte sectors, where the accumulator layout's 8 rows x 4
/// scattered columns used half of each sector (the backward was bound by L2 throughput).
#[inline(always)]
unsafe fn add_dq<const DQ: usize>(dqt: &[[f32; 4]; DQ], stage: u32, rows: u64, row_bytes: u64, rows_valid: u32, lane: u32, deterministic: bool) {
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
                if r < rows_valid {
                    let col = 8 * (chunk * TILES + j) as u64 + (lane % 8) as u64;
                    unsafe { accumulate(rows + r as u64 * row_bytes + 4 * col, v, deterministic) };
                }
            }
        }
        sync_warp();
    }
}

/// Adds `v` to the f32 at `at`: a plain read-add-write in deterministic mode (the caller holds
/// the element's turn, and no other thread of the CTA touches it), else an atomic.
#[inline(always)]
unsafe fn accumulate(at: u64, v: f32, deterministic: bool) {
    unsafe {
        if deterministic {
            st_global_f32(at, ld_global_cg_f32(at) + v);
        } else {
            red_add_f32(at, v);
        }
    }
}

/// Adds the dS tile (in the stage's bias tile) to the f32 dbias accumulator at the bias's
/// broadcast coordinates. Where the bias is broadcast over the tile's rows or keys, the tile is
/// first summed over them here, so that each accumulator element gets one addition per tile
/// from one thread (a plain read-add-write is then race-free within the CTA). Atomic, or the
/// plain read-add-write under the CTA's turn.
#[inline(always)]
unsafe fn add_dbias<E: Elem, const BM: usize, const BN: usize>(
    kb: &KeyBlock,
    tile: &SmemTile,
    h: u32,
    row0: u32,
    rows_valid: u32,
    deterministic: bool,
    tid: u32,
    threads: u32,
) {
    let (p, f) = (kb.p, &kb.p.fwd);
    let add = |at: u64, v: f32| unsafe { accumulate(at, v, deterministic) };
    let ds = |r: u32, c: u32| E::unpack(unsafe { ld_shared_u16(tile.chunk(r, c / 8) + 2 * (c % 8)) }).0;
    let (rows, keys) = (rows_valid.min(BM as u32), kb.keys_valid.min(BN as u32));
    let stride = p.dbias_accum.stride;
    let row = |r: u32| kb.broadcast_at(&p.dbias_accum, f.bias_head_div, h, row0 + r, 0, 4);
    match (stride[2] == 0, stride[3] == 0) {
        (false, false) => {
            // Element-wise: consecutive threads take consecutive keys of a row, so that each
            // warp-wide addition covers whole 32-byte sectors.
            for i in 0..(BM * BN).div_ceil(threads as usize) as u32 {
                let e = tid + i * threads;
                let (r, c) = (e / BN as u32, e % BN as u32);
                if r < rows && c < keys {
                    add(row(r) + 4 * c as u64 * stride[3], ds(r, c));
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
                add(row(0) + 4 * c as u64 * stride[3], sum);
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
                add(row(r), sum);
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
                if tid == 0 {
                    add(row(0), sum);
                }
            }
        }
    }
}

/// The block-map plane of the group's first query head.
#[inline(always)]
fn block_map_plane(p: &BwdParams, kb: &KeyBlock) -> u64 {
    let m = &p.fwd.block_map;
    let head = (kb.head(0) / p.fwd.mask_head_div) as u64;
    m.ptr + kb.batch as u64 * m.stride[0] + head * m.stride[1]
}

/// Planes the group's heads read: one per query head when the mask has one per query head
/// (consecutive, stride 1 head), else the group shares one.
#[inline(always)]
fn map_planes(p: &BwdParams) -> u32 {
    let f = &p.fwd;
    if f.mask_head_div == 1 && f.block_map.stride[1] != 0 && f.kv_group > 1 { f.kv_group } else { 1 }
}

/// The dQ turn counter of (head `h`, query tile `m`) for this CTA's column split.
#[inline(always)]
fn dq_turn(kb: &KeyBlock, h: u32, m: u32, m_tiles: u32, splits: u32) -> u64 {
    let tile = kb.row_index(h, 0) / kb.p.fwd.seqlen_q as u64 * m_tiles as u64 + m as u64;
    kb.p.dq_turns + 4 * (tile * splits as u64 + kb.split as u64)
}

/// Deterministic mode: passes on the dQ turns of query tiles `from..to` this CTA skips, for
/// every head of its group (thread 0; no data moves).
#[inline(always)]
unsafe fn pass_skipped_turns(p: &BwdParams, kb: &KeyBlock, from: u32, to: u32, m_tiles: u32, splits: u32, tid: u32) {
    if tid == 0 {
        for m in from..to.min(m_tiles) {
            for hg in 0..p.fwd.kv_group {
                let turn = dq_turn(kb, kb.head(hg), m, m_tiles, splits);
                while unsafe { ld_acquire_u32(turn) } != kb.n_block {}
                unsafe { st_release_u32(turn, kb.n_block + 1) };
            }
        }
    }
}
