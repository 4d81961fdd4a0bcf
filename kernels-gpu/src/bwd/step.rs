//! One step of the backward's walk, (query tile, query head) against the CTA's key tile, as
//! named phases: S -> P ([`Step::scores_to_p`]), dP -> dS ([`Step::dp_to_ds`]), dK and dV
//! ([`Step::dkdv`]) and dQ ([`Step::dq`]). The kernel (`backward`) runs them in order between
//! its barriers; on Hopper their products are the asynchronous ones of `sm90`. Each phase takes
//! as const parameters only the shapes it uses (see `dmattn_abi::BwdTile`): for S and dP, `SR`
//! warps along the rows, each with `MS` m16 row tiles and `NS` n8 key tiles, `NC` at a time,
//! over `KT = D / 16` k-steps; for dK and dV, `KR` warps along the keys, each with `MKV` m16 key
//! tiles and `DKV` n8 column tiles, over `MK = BM / 16` k-steps; for dQ, `QR` warps along the
//! rows, each with `MQ` m16 row tiles and `DQT` n8 column tiles, `DQ` of them per pass, over
//! `NK = BN / 16` k-steps.
use super::key_block::KeyBlock;
use super::reduce::{add_dq, add_dq_blocked};
use super::sm90;
use super::smem::{Smem, Stage};
use super::turns::dq_turn;
use crate::arch::*;
use crate::elem::Elem;
use crate::gemm::mma_tiles;
use crate::mask::RowBits;
use crate::scores::{LOG2E, Mods, WarpScores};
use crate::tile::Fragments;
use dmattn_abi::{BwdParams, flags, modifiers};

/// One step: the CTA's key block, the stage holding (query tile `m`, head `h`)'s operands, and
/// this thread's place in them, computed once for every phase (as values the phases share,
/// LLVM keeps them as the inline code had them; recomputed per phase, it reorders the address
/// arithmetic of the kernels at the register limit into spills).
#[derive(Clone, Copy)]
pub(super) struct Step<'a> {
    pub(super) kb: KeyBlock<'a>,
    pub(super) mods: Mods,
    pub(super) sm: Smem,
    pub(super) st: Stage,
    pub(super) h: u32,
    pub(super) m: u32,
    /// The query tile's first row, and its rows inside the sequence.
    pub(super) row0: u32,
    pub(super) rows_valid: u32,
    pub(super) tid: u32,
    /// The stage holds the bias's one row (see [`bias_columns`]).
    columns: bool,
    /// Fragment origins of the stage's Q and dO and the key tile's K and V.
    q_frag: Fragments,
    do_frag: Fragments,
    k_frag: Fragments,
    v_frag: Fragments,
    /// The warp's share of S and dP.
    share: ScoreShare,
    /// This lane's addresses in the P and dS tiles (row 0, chunk 0 of its fragment layout), and
    /// of its first row's lse and delta.
    p_at: u32,
    ds_at: u32,
    lse_at: u32,
    delta_at: u32,
}

/// A warp's share of S and dP, and so of P and dS: `MS` m16 row tiles from row `r0`, and the
/// `NS` n8 key tiles from `nt_first`, in chunks of `NC`.
#[derive(Clone, Copy)]
struct ScoreShare {
    r0: u32,
    nt_first: u32,
}

impl ScoreShare {
    #[inline(always)]
    fn of<const SR: usize, const MS: usize, const NS: usize>(warp: u32) -> Self {
        let (wr, wc) = warp_at(warp, SR);
        ScoreShare { r0: 16 * MS as u32 * wr, nt_first: NS as u32 * wc }
    }

    /// Chunk `c`'s first n8 key tile.
    #[inline(always)]
    fn nt0<const NC: usize>(&self, c: u32) -> u32 {
        self.nt_first + NC as u32 * c
    }
}

/// How P gets from S -> P to dP -> dS.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KeptP {
    /// Read back from the P tile.
    No,
    /// In registers as computed (wgmma, one chunk of at most 64 keys: S and P are live together).
    F32,
    /// In registers as the P tile holds it, pairs of `E` (32 registers, half of F32's): d64's
    /// 128-row tile, whose S and dP take 128. Read back, P cost dS 32 `LDS` a step, each with
    /// its swizzled address; held, that tile's backward runs 6-9 % faster (H200).
    Packed,
}

/// On d64's 128-row tile (here [`KeptP::Packed`], and the transposed step's), one n8 tile in this
/// many has its exponentials computed by `exp2_poly` rather than MUFU: there P's 64
/// exponentials a thread and step queue on MUFU while dP computes. Before dS and the logit took
/// their FMAs (`ds_of`, `logits_less`), a quarter ran 2 % faster than none and a half did not
/// gain (its FMA-pipe work takes more issue slots than MUFU's queue gives back); with them, an
/// eighth ran 1-2 % faster than a quarter (H200, d64 dense and causal). In the transposed step
/// an eighth runs d64 2-2.5 % faster and d128 level to 1 % slower, so d128 keeps MUFU.
pub(super) const POLY_PERIOD: u32 = 8;

/// P from S -> P as [`KeptP`] keeps it: one of the two arrays, per the variant.
pub(super) struct PKept<const MS: usize, const NC: usize> {
    f32: [[[f32; 4]; NC]; MS],
    packed: [[[u32; 2]; NC]; MS],
}

/// [`KeptP`] for a variant: not in d128's softcap variant (`ALL`), beside the softcap's
/// derivative and the dbias sum.
#[inline(always)]
const fn keeps_p<const KT: usize, const NC: usize, const MODS: u8, const WGMMA: bool>() -> KeptP {
    if !WGMMA || MODS == modifiers::ALL && KT * 16 > 64 {
        KeptP::No
    } else if NC <= 8 {
        KeptP::F32
    } else {
        KeptP::Packed
    }
}

impl<'a> Step<'a> {
    /// The step of (query tile `m`, head `h`) in stage `st`, for thread `tid`; `SR`, `MS`, `NS`:
    /// S and dP's grid of warps.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new<const BM: usize, const SR: usize, const MS: usize, const NS: usize>(
        kb: KeyBlock<'a>,
        mods: Mods,
        sm: Smem,
        st: Stage,
        h: u32,
        m: u32,
        columns: bool,
        tid: u32,
    ) -> Self {
        let (warp, lane) = (tid / 32, tid % 32);
        let (g, t) = (lane / 4, lane % 4);
        let row0 = m * BM as u32;
        let (q_frag, do_frag) = (Fragments::new(st.q, lane), Fragments::new(st.dout, lane));
        let (k_frag, v_frag) = (Fragments::new(sm.k, lane), Fragments::new(sm.v, lane));
        let share = ScoreShare::of::<SR, MS, NS>(warp);
        let rows_valid = kb.p.fwd.seqlen_q - row0;
        let p_at = sm.p.chunk(g, 0) + 4 * t;
        let ds_at = p_at - sm.p.base + sm.ds.base;
        let (lse_at, delta_at) = (st.lse + 4 * (share.r0 + g), st.delta + 4 * (share.r0 + g));
        Step { kb, mods, sm, st, h, m, row0, rows_valid, tid, columns, q_frag, do_frag, k_frag, v_frag, share, p_at, ds_at, lse_at, delta_at }
    }

    #[inline(always)]
    fn warp(&self) -> u32 {
        self.tid / 32
    }

    #[inline(always)]
    fn lane(&self) -> u32 {
        self.tid % 32
    }

    /// Chunk `c`'s scores: bias and mask addresses of the warp's share.
    #[inline(always)]
    fn scores<const BN: usize, const NC: usize>(&self, c: u32) -> WarpScores {
        let share = &self.share;
        WarpScores::new::<NC>(self.st.bias, !self.columns, self.st.mask, (BN / 8) as u32, share.r0, share.nt0::<NC>(c), self.lane())
    }

    /// S = QKᵀ on the score offsets for the warp's share, then P = exp2(logit - lse) to the P
    /// tile (for dV, and for dS unless [`keeps_p`] keeps it in registers: the first value
    /// returned), and under a softcap d(capped)/d(raw) to the dS tile until dS replaces
    /// it: S is dead before dP's accumulators are live. `full`: the tile is a full one of the
    /// mask's block map. On Hopper, dP is issued behind S and returned in flight (the second
    /// array), for [`Self::dp_to_ds`] to wait for.
    #[inline(always)]
    pub(super) unsafe fn scores_to_p<
        E: Elem,
        const KT: usize,
        const BM: usize,
        const BN: usize,
        const MS: usize,
        const NS: usize,
        const NC: usize,
        const MODS: u8,
        const WGMMA: bool,
    >(
        &self,
        full: bool,
    ) -> (PKept<MS, NC>, [[[f32; 4]; NC]; MS]) {
        let (kb, mods, sm, st) = (&self.kb, &self.mods, &self.sm, &self.st);
        let (lane, row0, rows_valid) = (self.lane(), self.row0, self.rows_valid);
        let (g, t) = (lane / 4, lane % 4);
        let (share, r0) = (&self.share, self.share.r0);
        // Rows past seqlen_q have no LSE: hide them, unlike the forward where they are unread.
        let check = !full || kb.vis.tile_needs_check(row0, BM as u32, kb.col0, BN as u32) || rows_valid < BM as u32;
        let softcap = mods.softcap > 0.0;
        let (p_at, ds_at, lse_at) = (self.p_at, self.ds_at, self.lse_at);
        let (q_frag, k_frag) = (self.q_frag, self.k_frag);
        let keep = keeps_p::<KT, NC, MODS, WGMMA>();
        let mut dp_issued = [[[0f32; 4]; NC]; MS];
        let mut kept = PKept { f32: [[[0f32; 4]; NC]; MS], packed: [[[0u32; 2]; NC]; MS] };
        for c in 0..(NS / NC) as u32 {
            let nt0 = share.nt0::<NC>(c);
            let warp_scores = self.scores::<BN, NC>(c);
            let mut s = [[[0f32; 4]; NC]; MS];
            let bounds = kb.vis.at_tile(row0, kb.col0).with_rows(rows_valid).shifted(r0 + g, 8 * nt0 + 2 * t);
            if self.columns && mods.fold_bias() {
                self.init_columns::<MS, NC>(&mut s, &warp_scores, &bounds, check, mods.mask && !full, nt0);
            } else {
                warp_scores.init::<E, MS, NC>(&mut s, mods, &bounds, check, mods.mask && !full);
            }
            if WGMMA {
                sm90::scores_and_dp::<E, NC, KT>(st, sm, r0, nt0, &mut s[0], &mut dp_issued[0]);
            } else {
                let (q, k) = (q_frag.offset(r0, 0), k_frag.offset(8 * nt0, 0));
                mma_tiles::<E, MS, NC, KT>(&mut s, |mt, ks| unsafe { q.a(16 * mt, ks) }, |np, ks| unsafe { k.b(16 * np, ks) });
            }
            for mt in 0..MS {
                for hh in 0..2 {
                    let dr = 16 * mt as u32 + 8 * hh as u32;
                    let lse = unsafe { f32::from_bits(ld_shared_u32(lse_at + 4 * dr)) };
                    // An empty row has LSE -inf and P = 0: subtract +inf instead of -inf.
                    let lse2 = if lse == f32::NEG_INFINITY { f32::INFINITY } else { lse * LOG2E };
                    for nt in 0..NC as u32 {
                        // At d64 less the LSE fused into the logit's FMA (d64 backward 2-3 %
                        // faster, H200); at d128 level, and its f16 bias kernel spilled with it.
                        let acc = [s[mt][nt as usize][2 * hh], s[mt][nt as usize][2 * hh + 1]];
                        let (x, dcap) = if KT * 16 <= 64 {
                            warp_scores.logits_less::<E>(acc, dr, nt, mods, lse2)
                        } else {
                            let (x, dcap) = warp_scores.logits::<E>(acc, dr, nt, mods);
                            ([x[0] - lse2, x[1] - lse2], dcap)
                        };
                        let poly = keep == KeptP::Packed && nt % POLY_PERIOD == POLY_PERIOD - 1;
                        let e = |v: f32| if poly { exp2_poly(v) } else { exp2(v) };
                        let pv = [e(x[0]), e(x[1])];
                        let (p_sh, packed) = (sm.p.shift(p_at, r0 + dr, nt0 + nt), E::pack(pv[0], pv[1]));
                        match keep {
                            KeptP::F32 => kept.f32[mt][nt as usize][2 * hh..2 * hh + 2].copy_from_slice(&pv),
                            KeptP::Packed => kept.packed[mt][nt as usize][hh] = packed,
                            KeptP::No => {}
                        }
                        unsafe {
                            st_shared_u32(p_sh, packed);
                            if softcap {
                                st_shared_u32(sm.ds.shift(ds_at, r0 + dr, nt0 + nt), E::pack(dcap[0], dcap[1]));
                            }
                        }
                    }
                }
            }
        }
        (kept, dp_issued)
    }

    /// [`WarpScores::init`] for a key-side bias folded in from the CTA's f32 row
    /// (`smem::store_bias_row`, see [`bias_columns`]): each of the thread's keys (n8 tiles from
    /// `nt0`) read once for all its rows, already scaled; -inf where hidden, tested only where
    /// `check`.
    #[inline(always)]
    fn init_columns<const MS: usize, const NC: usize>(
        &self,
        s: &mut [[[f32; 4]; NC]; MS],
        warp_scores: &WarpScores,
        band: &impl RowBits,
        check: bool,
        load_mask: bool,
        nt0: u32,
    ) {
        let row = self.sm.bias_row() + 4 * (8 * nt0 + 2 * (self.lane() % 4));
        let bias: [[u32; 2]; NC] = core::array::from_fn(|nt| unsafe { ld_shared_v2(row + 32 * nt as u32) });
        let start = |nt: usize, e: usize| f32::from_bits(bias[nt][e]);
        for (mt, tile) in s.iter_mut().enumerate() {
            for h in 0..2 {
                if check {
                    let bits = warp_scores.visible_bits::<NC>(band, mt, h, check, load_mask);
                    for (nt, v) in tile.iter_mut().enumerate() {
                        for e in 0..2 {
                            v[2 * h + e] = if (bits >> (2 * nt + e)) & 1 != 0 { start(nt, e) } else { f32::NEG_INFINITY };
                        }
                    }
                } else {
                    for (nt, v) in tile.iter_mut().enumerate() {
                        for e in 0..2 {
                            v[2 * h + e] = start(nt, e);
                        }
                    }
                }
            }
        }
    }

    /// dP = dO Vᵀ for the warp's share (on Hopper, `dp_issued`: issued beside S, waited for
    /// here), then dS = P (dP - delta): to the stage's bias tile for dbias (see [`GroupSum`]),
    /// and times scale and the softcap's derivative to the dS tile for dK and dQ. P comes from
    /// `p_kept` where [`keeps_p`] keeps it, else from the P tile.
    #[inline(always)]
    pub(super) unsafe fn dp_to_ds<
        E: Elem,
        const KT: usize,
        const BN: usize,
        const MS: usize,
        const NS: usize,
        const NC: usize,
        const MODS: u8,
        const WGMMA: bool,
    >(
        &self,
        dp_issued: &mut [[[f32; 4]; NC]; MS],
        p_kept: &PKept<MS, NC>,
        group_sum: GroupSum,
        dbias_sum: &mut [[[f32; 4]; NC]; MS],
    ) {
        let (share, r0) = (&self.share, self.share.r0);
        let (do_frag, v_frag) = (self.do_frag, self.v_frag);
        for c in 0..(NS / NC) as u32 {
            let nt0 = share.nt0::<NC>(c);
            let mut dp = [[[0f32; 4]; NC]; MS];
            if WGMMA {
                sm90::dp_landed::<NC>(&mut dp_issued[0]);
                dp = *dp_issued;
            } else {
                let (d_o, v) = (do_frag.offset(r0, 0), v_frag.offset(8 * nt0, 0));
                mma_tiles::<E, MS, NC, KT>(&mut dp, |mt, ks| unsafe { d_o.a(16 * mt, ks) }, |np, ks| unsafe { v.b(16 * np, ks) });
            }
            // A key-side bias's sums in a loop of their own: no dS stores for dbias to predicate.
            if group_sum.columns {
                unsafe { self.ds_of::<E, KT, BN, MS, NC, MODS, WGMMA, true>(c, &dp, p_kept, group_sum, dbias_sum) };
            } else {
                unsafe { self.ds_of::<E, KT, BN, MS, NC, MODS, WGMMA, false>(c, &dp, p_kept, group_sum, dbias_sum) };
            }
        }
    }

    /// [`Self::dp_to_ds`]'s elementwise part for chunk `c`, from its `dp`; `COLUMNS`:
    /// `group_sum.columns` (dS only summed for dbias, never stored for it).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn ds_of<
        E: Elem,
        const KT: usize,
        const BN: usize,
        const MS: usize,
        const NC: usize,
        const MODS: u8,
        const WGMMA: bool,
        const COLUMNS: bool,
    >(
        &self,
        c: u32,
        dp: &[[[f32; 4]; NC]; MS],
        p_kept: &PKept<MS, NC>,
        group_sum: GroupSum,
        dbias_sum: &mut [[[f32; 4]; NC]; MS],
    ) {
        let (mods, sm) = (&self.mods, &self.sm);
        let (nt0, r0) = (self.share.nt0::<NC>(c), self.share.r0);
        let softcap = mods.softcap > 0.0;
        let (p_at, ds_at, delta_at) = (self.p_at, self.ds_at, self.delta_at);
        let ds_scale = mods.ds_scale();
        for mt in 0..MS {
            for hh in 0..2 {
                let dr = 16 * mt as u32 + 8 * hh as u32;
                let delta = unsafe { f32::from_bits(ld_shared_u32(delta_at + 4 * dr)) };
                let delta_scaled = delta * ds_scale;
                for nt in 0..NC as u32 {
                    let (p_sh, ds_sh) = (sm.p.shift(p_at, r0 + dr, nt0 + nt), sm.ds.shift(ds_at, r0 + dr, nt0 + nt));
                    let pv = match keeps_p::<KT, NC, MODS, WGMMA>() {
                        KeptP::F32 => {
                            let p = &p_kept.f32[mt][nt as usize];
                            (p[2 * hh], p[2 * hh + 1])
                        }
                        KeptP::Packed => E::unpack(p_kept.packed[mt][nt as usize][hh]),
                        KeptP::No => E::unpack(unsafe { ld_shared_u32(p_sh) }),
                    };
                    let dcap = if softcap { E::unpack(unsafe { ld_shared_u32(ds_sh) }) } else { (1.0, 1.0) };
                    let d = &dp[mt][nt as usize];
                    let dsb = [pv.0 * (d[2 * hh] - delta), pv.1 * (d[2 * hh + 1] - delta)];
                    unsafe {
                        if mods.bias && COLUMNS {
                            let acc = &mut dbias_sum[mt][nt as usize];
                            acc[2 * hh] += dsb[0];
                            acc[2 * hh + 1] += dsb[1];
                        } else if mods.bias {
                            // dS for dbias replaces the bias in the stage's bias tile: the
                            // same thread read these two elements in S -> P and nothing
                            // else reads them again.
                            let v = if group_sum.on {
                                let acc = &mut dbias_sum[mt][nt as usize];
                                acc[2 * hh] += dsb[0];
                                acc[2 * hh + 1] += dsb[1];
                                [acc[2 * hh], acc[2 * hh + 1]]
                            } else {
                                dsb
                            };
                            if group_sum.stores {
                                st_shared_u32(self.scores::<BN, NC>(c).bias_at_pair(dr, nt), E::pack(v[0], v[1]));
                            }
                        }
                        // Without a bias or softcap, dS's scale goes into dP - delta's FMA: two
                        // instructions an element instead of three (d64 backward 2 % faster, H200).
                        // Not in the modifier kernels (`ALL`), where both forms would be built
                        // (d128's spilled).
                        let ds = if MODS != modifiers::ALL && !mods.bias && !softcap {
                            [ds_fused(pv.0, d[2 * hh], ds_scale, delta_scaled), ds_fused(pv.1, d[2 * hh + 1], ds_scale, delta_scaled)]
                        } else {
                            [dsb[0] * dcap.0 * ds_scale, dsb[1] * dcap.1 * ds_scale]
                        };
                        st_shared_u32(ds_sh, E::pack(ds[0], ds[1]));
                    }
                }
            }
        }
    }

    /// dV += Pᵀ dO and dK += dSᵀ Q for the warp's `MKV` m16 keys x `DKV` n8 columns, k = the
    /// tile's rows: Aᵀ of the [rows][keys] P and dS tiles, B of the [rows][d] dO and Q tiles
    /// (`mma.sync`; on Hopper these products are issued by `sm90::issue_grads`).
    #[inline(always)]
    pub(super) fn dkdv<E: Elem, const MKV: usize, const DKV: usize, const MK: usize, const KR: usize>(
        &self,
        dk: &mut [[[f32; 4]; DKV]; MKV],
        dv: &mut [[[f32; 4]; DKV]; MKV],
    ) {
        let lane = self.lane();
        let (p_frag, ds_frag) = (Fragments::new(self.sm.p, lane), Fragments::new(self.sm.ds, lane));
        let (q_frag, do_frag) = (self.q_frag, self.do_frag);
        let (wk, wd) = warp_at(self.warp(), KR);
        let key_chunk = 2 * MKV as u32 * wk;
        let (col_base, col_call) = chunk_split(DKV as u32 * wd, DKV);
        let acc_atb = |acc: &mut [[[f32; 4]; DKV]; MKV], a: Fragments, b: Fragments| {
            let (a, b) = (a.offset(0, key_chunk), b.offset(0, col_base));
            mma_tiles::<E, MKV, DKV, MK>(acc, |mt, kk| unsafe { a.a_trans(16 * kk, 2 * mt) }, |np, kk| unsafe {
                b.b_trans(16 * kk, col_call + 2 * np)
            });
        };
        acc_atb(dv, p_frag, do_frag);
        acc_atb(dk, ds_frag, q_frag);
    }

    /// dQ = dS K for the warp's `MQ` m16 rows x `DQT` n8 columns, added to the f32 accumulator
    /// in passes of `DQ` n8 tiles (the accumulators are live beside dK and dV); on Hopper the
    /// product issued by `sm90::issue_grads` into `dq_issued`. `DET`: in this key tile's turn
    /// of the dQ tile (`m_tiles` query tiles a head).
    #[inline(always)]
    pub(super) unsafe fn dq<
        E: Elem,
        const MQ: usize,
        const DQT: usize,
        const DQ: usize,
        const NK: usize,
        const QR: usize,
        const DET: bool,
        const WGMMA: bool,
    >(
        &self,
        dq_issued: &mut [[[f32; 4]; DQ]; MQ],
        m_tiles: u32,
    ) {
        let (kb, sm) = (&self.kb, &self.sm);
        let p = kb.p;
        let (tid, lane) = (self.tid, self.lane());
        let (ds_frag, k_frag) = (Fragments::new(sm.ds, lane), self.k_frag);
        let (q_row0, col_first) = self.dq_origin::<MQ, DQT, QR>();
        let rows_valid = self.rows_valid;
        let turn = dq_turn(kb, self.h, self.m, m_tiles);
        if DET {
            unsafe { wait_turn(turn, kb.n_block, tid) };
        }
        for pass in 0..(DQT / DQ) as u32 {
            let c0 = col_first + pass * DQ as u32;
            let mut dqt = [[[0f32; 4]; DQ]; MQ];
            if WGMMA {
                sm90::dq_landed::<DQ>(&mut dq_issued[0]);
                dqt = *dq_issued;
            } else {
                mma_tiles::<E, MQ, DQ, NK>(&mut dqt, |mt, kk| unsafe { ds_frag.a(q_row0 + 16 * mt, kk) }, |np, kk| unsafe {
                    k_frag.b_trans(16 * kk, c0 + 2 * np)
                });
            }
            for mt in 0..MQ as u32 {
                let r = q_row0 + 16 * mt;
                let rows = kb.q_row(&p.dq_accum, self.h, self.row0 + r, 4);
                let dq = &dqt[mt as usize];
                if WGMMA {
                    // The blocked accumulator (`dmattn_abi::DqConvertParams`): `row0 + r` is a
                    // multiple of 16, a group's first row.
                    unsafe { add_dq_blocked(dq, rows + 512 * c0 as u64, r < rows_valid, lane) };
                } else {
                    let (rows, row_bytes, valid) = (rows + 32 * c0 as u64, 4 * p.dq_accum.stride[1], rows_valid.saturating_sub(r));
                    unsafe { add_dq(dq, sm.dq_stage(self.warp()), rows, row_bytes, valid, lane) };
                }
            }
        }
        if DET {
            unsafe { pass_turn(turn, kb.n_block + 1, tid) };
        }
    }

    /// The warp's place in dQ's grid of warps (`QR` along the rows): its first row (`MQ` m16
    /// tiles each) and its first n8 column tile (`DQT` each).
    #[inline(always)]
    pub(super) fn dq_origin<const MQ: usize, const DQT: usize, const QR: usize>(&self) -> (u32, u32) {
        let (wq, wqd) = warp_at(self.warp(), QR);
        (16 * MQ as u32 * wq, DQT as u32 * wqd)
    }

    /// Whether and how this step sums dbias over the kv group of `group` heads (see
    /// [`GroupSum`]); `hg` is the step's head in the group.
    #[inline(always)]
    pub(super) fn group_sum<const WGMMA: bool>(&self, group: u32, hg: u32) -> GroupSum {
        let (p, f) = (self.kb.p, &self.kb.p.fwd);
        let columns = self.columns;
        let on = columns || WGMMA && self.mods.bias && group > 1 && (f.bias_head_div == group || p.dbias_accum.stride[1] == 0);
        GroupSum { on, columns, stores: !columns && (!on || hg + 1 == group) }
    }
}

/// wgmma, with a bias every head of the kv group shares: the group's dS summed in registers over
/// its consecutive steps (`on`), stored for dbias and added to the accumulator once per tile, at
/// its last head (a quarter of the reductions at a group of 4). `stores`: this step stores dS
/// for dbias and adds it to the accumulator. `columns`: a key-side bias (see [`bias_columns`]),
/// summed over every step of the CTA and added once, at its end (`reduce::add_dbias_columns`).
#[derive(Clone, Copy)]
pub(super) struct GroupSum {
    pub(super) on: bool,
    pub(super) columns: bool,
    pub(super) stores: bool,
}

/// wgmma, with a key-side bias (`flags::BIAS_ROW`: one row, which every query reads) that every
/// head of the CTA's kv group shares: its dbias for the CTA's keys is a sum of dS over every step
/// the CTA makes, so the stages hold only the bias row (a 128th of the bias tile's copies), and
/// dS is summed in registers rather than stored to the stage and summed over its rows per tile.
#[inline(always)]
pub(super) fn bias_columns<const WGMMA: bool>(p: &BwdParams, mods: &Mods) -> bool {
    let f = &p.fwd;
    WGMMA && mods.bias && f.flags & flags::BIAS_ROW != 0 && (f.bias_head_div == f.kv_group || p.dbias_accum.stride[1] == 0)
}

/// The first n8 key tile of warp `warp`'s share of S and dP (`SR`, `MS`, `NS`: their grid of
/// warps), whose keys [`GroupSum::columns`]' sums hold.
#[inline(always)]
pub(super) fn score_key_tile<const SR: usize, const MS: usize, const NS: usize>(warp: u32) -> u32 {
    ScoreShare::of::<SR, MS, NS>(warp).nt_first
}

/// A warp's place in one product's grid of warps: `rows` warps along the rows, the rest along
/// the columns (warp `w` at row group `w % rows`).
#[inline(always)]
pub(super) fn warp_at(warp: u32, rows: usize) -> (u32, u32) {
    (warp % rows as u32, warp / rows as u32)
}

/// Splits a warp's chunk offset (a multiple of `span`, the chunks the warp covers) into the
/// part [`Fragments::offset`] can take (all of it where `span` is a power of two) and the part
/// each fragment load adds itself.
#[inline(always)]
pub(super) fn chunk_split(chunks: u32, span: usize) -> (u32, u32) {
    if span.is_power_of_two() { (chunks, 0) } else { (0, chunks) }
}

/// One score's dS = P (dP - delta) times `ds_scale` ([`Mods::ds_scale`]), with the scale in dP
/// - delta's FMA (`delta_scaled` = delta times it): two instructions instead of three.
#[inline(always)]
pub(super) fn ds_fused(p: f32, dp: f32, ds_scale: f32, delta_scaled: f32) -> f32 {
    p * fma(dp, ds_scale, -delta_scaled)
}
