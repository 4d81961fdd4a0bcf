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
//! dQ and dbias are added to their f32 accumulators with `red.add` (on Hopper dQ's laid out as
//! the products leave it, `dmattn_abi::DqConvertParams`). In any order by default; in
//! the `DET` variant in a fixed one: dQ tile (b, h, m) receives key tile n's contribution on turn
//! n (a counter per dQ tile), and CTAs sharing a broadcast dbias column take it in turns in
//! block order, so that each element sees the same sequence of additions on every run (a turn
//! passes with a barrier and a release, after the CTA's additions). Turns only wait on CTAs of
//! lower block index, which are scheduled first, so they cannot deadlock.
//!
//! [`backward`] is the CTA's walk; the rest live in modules with one job each: `key_block`
//! (where the CTA works and its operands' addresses), `smem` (shared tiles and the stages'
//! copies), `step` (one step's phases: S -> P, dP -> dS, dK/dV, dQ), `sm90` (the Hopper
//! products), `reduce` (dQ, dbias, dK and dV out to global memory) and `turns` (deterministic
//! mode); on Hopper, the d64 and d128 kernels without a bias, mask or band (at d128 nor a split)
//! take `transposed`, the step with its scores transposed.
mod key_block;
mod reduce;
mod sm90;
mod smem;
mod step;
mod transposed;
mod turns;

use crate::arch::*;
use crate::elem::Elem;
use crate::mask::{MapCols, Tile, TileCursor, block_map_plane, map_planes};
use crate::scores::Mods;
use crate::seq::{localize, localize_split};
use dmattn_abi::{BWD_PARAMS_BYTES, BwdParams, modifiers};
use key_block::{KeyBlock, position};
use reduce::{add_dbias, add_dbias_columns, store_dkdv};
use smem::{Smem, load_stage, store_bias_row};
use step::{Step, bias_columns, score_key_tile};
use turns::{dbias_turn, pass_skipped_turns};

/// The backward CTA: where it works, K and V loaded, then for each step (query tile, head of
/// the kv group) the stage landed and the next one's copies started, the phases of [`Step`] in
/// order, and at the end dK and dV stored. `MODS` is the variant's score modifiers
/// (`dmattn_abi::modifiers`), `DET` selects the deterministic variant (see the module doc),
/// `WGMMA` the Hopper products (`sm90`; the elementwise work between them is the same),
/// `BIAS_TILE` whether the stages hold a bias tile, `BAND` whether the kernel takes any band (see
/// `Visibility::of_band`), `SPLIT` whether the CTA may walk a share of its key tile's query
/// tiles (`BwdParams::q_split_shift`). The tile shape (see `dmattn_abi::BwdTile`, which the entry points
/// derive it from): head dim `D`, query tile `BM`, key tile `BN`, `STAGES`, `W` warps, and each
/// product's grid of warps (see the `step` module).
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
    const SPLIT: bool,
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
        // Split shares add their dK/dV in any order.
        assert!(!SPLIT || !DET);
    }
    // The walk over query tiles goes down where dQ's additions may come in any order, rotated
    // under windows in the Hopper band kernels (`next_query_tile`; the portable `_mods` kernels,
    // which take any band, sit at the register limit: d96 spilled with it).
    let down = !DET;
    let rotates = BAND && WGMMA;
    // The Hopper `BIAS` variant has no registers for reading block classes (`modifiers::BIAS`).
    let by_class = !(WGMMA && MODS == modifiers::BIAS);
    // The Hopper kernels without a bias, mask or band take the step with its scores transposed
    // (`transposed`; H200: d128 on its 64-row tile dense and causal 2-5 % faster, d64 on its
    // 128-row one 3.5-5 %). Not the band kernels: under a window its per-score test in that
    // layout ran 12 % slower than the row-major step's row bits; nor d128's split ones, where it
    // spilled (every d64 kernel may split).
    let transposed = WGMMA && MODS == modifiers::NONE && (BM == 64 || BM == 128 && D == 64) && KR == 8 && MQ == 1 && DQ == DQT && NC * 8 == BM && 2 * MK == NC && !BAND && (!SPLIT || D == 64);
    let tid = thread_idx();
    // Kernels that may split their query tiles (`dmattn_abi::bwd_splits`, `bwd_split_kernel`).
    let splits = SPLIT;
    // The parameters are read with `ld.shared` (d64 2-3.5 % faster than generic loads, H200)
    // but in the Hopper d128 bias kernels, at the register limit: there the f16 one spilled, and
    // the bf16 one ran 2-5 % slower with 50 % blocks + bias.
    let generic_params = WGMMA && D == 128 && MODS == modifiers::BIAS;
    // A packed sequence's CTA sees its sequence as a fixed-length problem (`seq::localize`), a
    // split CTA its share of the query tiles as one (`seq::localize_split`).
    let p = unsafe {
        params_in_smem(params, smem_base() + params_at, tid, generic_params, |_, dst| {
            // The Hopper products add dQ to its blocked accumulator (`reduce::add_dq_blocked`).
            localize(dst, generic_params, block_idx(), BM as u32, BN as u32, WGMMA);
            if splits {
                localize_split(dst, generic_params, block_idx());
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

    // Steps are (query tile, head of the group), tiles in walk order (`next_query_tile`); a
    // deterministic run also visits the tiles it skips, to pass their dQ turns on.
    let mut cursor = TileCursor::new();
    let mut next_tile = next_query_tile::<BM, BN>(&mut cursor, &kb, splits, down, rotates, None, tid % 32);
    if DET {
        unsafe { pass_skipped_turns(p, &kb, 0, next_tile.map_or(m_tiles, |t| t.n), m_tiles, tid) };
    }
    if let Some(first) = next_tile {
        let columns = bias_columns::<WGMMA>(p, &mods);
        if columns && mods.fold_bias() {
            unsafe { store_bias_row::<E, BN>(&kb, &sm, &mods, tid, threads) };
        }
        unsafe { load_stage::<D, BM, BN>(&kb, &sm.stage(0), &mods, by_class, columns, transposed, first.n, kb.head(0), tid, threads) };
    }
    cp_async_commit();
    // On Hopper with two stages each thread waits for its copies of a step's stage in the
    // previous step, where the P and dS tiles' proxy fence covers them too, rather than at the
    // step's start: there the fence's `MEMBAR` waits for the previous step's dQ reductions in
    // flight (2 % of the d128 backward, H200). Here: K, V and the first stage.
    let early_fence = WGMMA && STAGES == 2;
    if early_fence {
        copies_landed::<WGMMA>();
    }

    // Values read from the parameters are read again inside the loop rather than held across it
    // (see `params_in_smem`).
    let mut stage = 0u32;
    // The kv group's dS summed for dbias, or for a key-side bias every step's (`step::GroupSum`).
    let mut dbias_sum = [[[0f32; 4]; NC]; MS];
    // Per step, the parameters come from an opaque address (see `params_in_smem`).
    let params_now = || -> &BwdParams { unsafe { smem_ref_reads(opaque(smem_base() + params_at), generic_params) } };
    while let Some(tile) = next_tile {
        for hg in 0..params_now().fwd.kv_group {
            let tid = opaque(tid);
            let p = params_now();
            let f = &p.fwd;
            let kb = KeyBlock::reread::<BAND>(p, BN as u32, placed, swaps, slot);
            let mods = Mods::of(f, MODS);
            let (group, m_tiles) = (f.kv_group, f.seqlen_q.div_ceil(BM as u32));
            let h = kb.head(hg);
            let m = tile.n;
            let columns = bias_columns::<WGMMA>(p, &mods);
            let st = sm.stage(stage);

            // This step's stage has landed (and is fenced, where `early_fence`); every warp is
            // done with the previous step.
            if !early_fence {
                copies_landed::<WGMMA>();
            }
            sync_threads();
            // Prefetch the next step: the next head of this tile, or the next tile's first head.
            let (next_m, next_h) = if hg + 1 < group {
                (Some(m), hg + 1)
            } else {
                next_tile = next_query_tile::<BM, BN>(&mut cursor, &kb, splits, down, rotates, Some(m), tid % 32);
                (next_tile.map(|t| t.n), 0)
            };
            if let (2, Some(nm)) = (STAGES, next_m) {
                unsafe { load_stage::<D, BM, BN>(&kb, &sm.stage(1 - stage), &mods, by_class, columns, transposed, nm, kb.head(next_h), tid, threads) };
            }
            cp_async_commit();

            let step = Step::new::<BM, SR, MS, NS>(kb, mods, sm, st, h, m, columns, tid);
            if transposed {
                let frags = unsafe { step.transposed_to_ds::<E, KT, BM, BN, NC, MK>(tile.full) };
                stage_fence(early_fence);
                unsafe { step.transposed_grads::<E, BM, BN, MK, DKV, NK, MQ, DQT, DQ, QR>(&frags, &mut dk[0], &mut dv[0], m_tiles) };
            } else {
                let (p_kept, mut dp_issued) = unsafe { step.scores_to_p::<E, KT, BM, BN, MS, NS, NC, MODS, WGMMA>(tile.full) };
                let group_sum = step.group_sum::<WGMMA>(group, hg);
                if group_sum.on && !group_sum.columns && hg == 0 {
                    dbias_sum = [[[0f32; 4]; NC]; MS];
                }
                unsafe { step.dp_to_ds::<E, KT, BN, MS, NS, NC, MODS, WGMMA>(&mut dp_issued, &p_kept, group_sum, &mut dbias_sum) };
                if WGMMA {
                    stage_fence(early_fence);
                } else {
                    sync_threads();
                }

                // The Hopper dQ product overwrites its accumulators (`sm90::issue_grads`).
                let mut dq_issued: [[[f32; 4]; DQ]; MQ] = core::array::from_fn(|_| if WGMMA { wgmma_scratch() } else { [[0f32; 4]; DQ] });
                if WGMMA {
                    let origin = step.dq_origin::<MQ, DQT, QR>();
                    sm90::issue_grads::<E, DQ, DKV, NK, MK>(&st, &sm, tid / 32, origin, &mut dq_issued[0], &mut dv[0], &mut dk[0]);
                }
                if mods.bias && group_sum.stores {
                    unsafe { add_dbias::<E, BM, BN, WGMMA>(&kb, &st.bias, h, step.row0, step.rows_valid, tid, threads) };
                }
                if !WGMMA {
                    step.dkdv::<E, MKV, DKV, MK, KR>(&mut dk, &mut dv);
                }
                unsafe { step.dq::<E, MQ, DQT, DQ, NK, QR, DET, WGMMA>(&mut dq_issued, m_tiles) };
                if WGMMA {
                    // dV and dK read the P, dS and stage tiles the next step overwrites.
                    sm90::grads_landed::<DKV>(&mut dv[0]);
                }
            }
            if STAGES == 1 {
                // Single stage: load the next step only now that this one is done with it.
                sync_threads();
                if let Some(nm) = next_m {
                    unsafe { load_stage::<D, BM, BN>(&kb, &st, &mods, by_class, columns, transposed, nm, kb.head(next_h), tid, threads) };
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

    // Epilogue: the dbias turn passed on or a key-side bias's sums added, then dK and dV stored.
    let tid = opaque(tid);
    let kb = KeyBlock::reread::<BAND>(p, BN as u32, placed, swaps, slot);
    if bias_columns::<WGMMA>(p, &Mods::of(f, MODS)) {
        unsafe { add_dbias_columns::<MS, NC>(&kb, &dbias_sum, score_key_tile::<SR, MS, NS>(tid / 32), tid % 32) };
    }
    if let Some((lock, turn)) = dbias_turn::<BN, DET>(&kb, &Mods::of(f, MODS)) {
        unsafe { pass_turn(lock, turn + 1, tid) };
    }
    unsafe { store_dkdv::<E, MKV, DKV, KR, WGMMA>(p, &kb, &sm, &dk, &dv, splits, tid, threads) };
}

/// The CTA's query tile after `after` in its walk (its first where `None`): the tiles with a
/// visible score from `Visibility::query_tile_begin` (a split CTA's share from its first tile,
/// `seq::localize_split`) to the block map's end, up from the first or, where `down`, down from
/// the last. Down is FlashAttention's order: under causal and compressed masks (a band bounded
/// on the right only) every key tile's walk reaches the last query tile, so CTAs started
/// together begin there together and add to the same dQ tiles while those are in L2. Walking
/// up, their walks start at different tiles (key tile n at query tile 4n under cf 4), the
/// tiles in flight spread over the sequence, and dQ's f32 lines go to memory and back between
/// additions. Under a window (where `rotates`, `Visibility::query_tile_period`), each key tile's
/// run is at most a period `L` of query tiles long and starts at a different tile, so that a
/// plain walk keeps every query tile of the sequence in flight at once: there the walk goes
/// down from its tile `pivot` with `pivot % L == L - 1`, then down from the last to just above
/// the pivot, so that at every step all CTAs started together are at tiles of one residue mod
/// `L`, the CTAs sharing a query tile (one per key tile in its window) visit it together. The
/// deterministic kernels walk up: their dQ turns pass in tile order.
#[inline(always)]
fn next_query_tile<const BM: usize, const BN: usize>(
    cursor: &mut TileCursor,
    kb: &KeyBlock,
    splits: bool,
    down: bool,
    rotates: bool,
    after: Option<u32>,
    lane: u32,
) -> Option<Tile> {
    let (p, f) = (kb.p, &kb.p.fwd);
    let map = MapCols::<BM, BN>::new(&f.block_map, block_map_plane(f, kb.batch, kb.kv_head), map_planes(f), kb.n_block, &kb.vis);
    let begin = kb.vis.query_tile_begin(kb.col0, BM as u32);
    let begin = if splits { begin.max(p.first_tile) } else { begin };
    if !down {
        return cursor.next(after.map_or(begin, |m| m + 1), lane, &map);
    }
    let period = if rotates { kb.vis.query_tile_period(BN as u32, BM as u32) } else { None };
    // Tiles at or below the pivot first (all of them without a period), then those above it;
    // one call site of the cursor's walk, which inlines.
    let pivot = period.map_or(u32::MAX, |l| begin + (l - 1 - begin % l));
    let (mut top, mut lower) = match after {
        None => (pivot.saturating_add(1), begin),
        Some(m) if m <= pivot => (m, begin),
        Some(m) => (m, pivot + 1),
    };
    loop {
        let tile = cursor.prev(top, lower, lane, &map);
        if tile.is_some() || pivot == u32::MAX || lower > pivot {
            return tile;
        }
        (top, lower) = (u32::MAX, pivot + 1);
    }
}

/// Hopper, between a step's dS and its dQ/dV/dK: the P and dS tiles are whole and visible to
/// the async proxy; where `early_fence`, so is the next step's stage, its copies started at this
/// step's start.
#[inline(always)]
fn stage_fence(early_fence: bool) {
    if early_fence {
        cp_async_wait_all();
    }
    fence_proxy_async();
    sync_threads();
}
