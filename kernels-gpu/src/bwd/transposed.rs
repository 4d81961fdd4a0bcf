//! The Hopper backward's step with its scores transposed (FlashAttention-3's and cuDNN's form),
//! for the d64 and d128 kernels without a bias, mask or band: each warpgroup computes Sᵀ = K Qᵀ
//! and dPᵀ = V dOᵀ for its 64 keys against all the stage's rows (64 at d128, 128 at d64), so
//! that Pᵀ and dSᵀ come out in the accumulator layout that is `wgmma`'s register A operand, and
//! dV += Pᵀ dO, dK += dSᵀ Q take them from registers: no P tile, and dS read by the tensor cores
//! only for dQ. Only dS goes to shared memory (keys by rows, `stmatrix`), for dQ = dS K, the one
//! product that needs both warpgroups' keys (each warpgroup computes its share of dQ: d128 half
//! the columns, d64 half the rows). The products after the barrier are issued in the row-major
//! step's order (dQ, dV, dK), so that dQ's reductions drain under dV and dK: with dV issued
//! before the barrier instead, they stalled the next step (H200: level to 2 % slower than the
//! row-major step, against 3-4 % faster). A thread's scores span 16 rows here at d128, 32 at
//! d64 (2 in the row-major step), so the stage holds each row's lse and delta side by side, a
//! row pair's in 16 bytes (`smem::load_stage`'s `pairs`), and a pair's lse or delta is one
//! 8-byte load. The phases: [`Step::transposed_to_ds`], then the kernel's fence and barrier,
//! then [`Step::transposed_grads`].
use super::sm90;
use super::step::{POLY_PERIOD, Step, ds_fused};
use crate::arch::*;
use crate::elem::{Elem, wgmma_wait};
use crate::gemm::p_frag;
use crate::scores::LOG2E;
use crate::tile::SmemTile;

impl Step<'_> {
    /// The keys-by-rows dS tile (`BN` keys of `BM` rows) in the P and dS tiles' bytes.
    #[inline(always)]
    fn ds_keys_by_rows<const BM: usize, const BN: usize>(&self) -> SmemTile {
        SmemTile::new(self.sm.ds.base, BN, BM * 2)
    }

    /// The warpgroup's first key and this warp's (its accumulators' rows `g` and `g + 8`).
    #[inline(always)]
    fn transposed_keys(&self) -> (u32, u32) {
        let warp = self.tid / 32;
        let group_key0 = 64 * (warp / 4);
        (group_key0, group_key0 + 16 * (warp % 4))
    }

    /// Sᵀ and dPᵀ issued; Pᵀ = exp2(logit - lse) (0 where hidden: rows past the sequence and
    /// empty rows have no LSE to subtract, and none of their scores is visible); dSᵀ =
    /// Pᵀ (dPᵀ - delta) times the scale, stored keys by rows for dQ. Returns Pᵀ's and dSᵀ's A
    /// fragments, for dV and dK. `full` as for [`Step::scores_to_p`]; `NC = BM / 8` n8 tiles of
    /// rows (Sᵀ's N), `KP = NC / 2` k16 steps (`backward` calls this only where they hold; being
    /// generic, it is instantiated for every kernel, so they are not compile-time assertions).
    #[inline(always)]
    pub(super) unsafe fn transposed_to_ds<
        E: Elem,
        const KT: usize,
        const BM: usize,
        const BN: usize,
        const NC: usize,
        const KP: usize,
    >(
        &self,
        full: bool,
    ) -> ([[u32; 4]; KP], [[u32; 4]; KP]) {
        let (kb, st) = (&self.kb, &self.st);
        let lane = self.tid % 32;
        let (g, t) = (lane / 4, lane % 4);
        let (group_key0, key0) = self.transposed_keys();
        let mut s = [[0f32; 4]; NC];
        let mut dp = [[0f32; 4]; NC];
        sm90::scores_and_dp_transposed::<E, NC, KT>(st, &self.sm, group_key0, &mut s, &mut dp);

        // Accumulator j holds rows 8 j + 2 t (+ 1) of keys g and g + 8; the row pair's lse and
        // delta are 16 bytes at `pair_at(j)`.
        let pair_at = |j: usize| st.lse + 64 * j as u32 + 16 * t;
        let check = !full || kb.vis.tile_needs_check(self.row0, BM as u32, kb.col0, BN as u32) || self.rows_valid < BM as u32;
        let bounds = kb.vis.at_tile(self.row0, kb.col0).with_rows(self.rows_valid);
        let scale = self.mods.scale_log2;
        for (j, acc) in s.iter_mut().enumerate() {
            let lse = unsafe { ld_shared_v2(pair_at(j)) };
            // At d64 (the 128-row tile) one accumulator in `POLY_PERIOD` on the FMA pipe.
            let poly = BM == 128 && j as u32 % POLY_PERIOD == POLY_PERIOD - 1;
            for e in 0..2 {
                let less = f32::from_bits(lse[e]) * LOG2E;
                for h in 0..2 {
                    let x = fma(acc[2 * h + e], scale, -less);
                    acc[2 * h + e] = if poly { exp2_poly(x) } else { exp2(x) };
                }
            }
        }
        // Hidden scores in a loop of their own behind the tile's test: folded into the loop
        // above, the per-score test ran on every tile as selects (15 % more instructions, H200).
        if check {
            for (j, acc) in s.iter_mut().enumerate() {
                for (i, p) in acc.iter_mut().enumerate() {
                    let (h, e) = (i as u32 / 2, i as u32 % 2);
                    if !bounds.visible(8 * j as u32 + 2 * t + e, key0 + g + 8 * h) {
                        *p = 0.0;
                    }
                }
            }
        }
        let p = frags::<E, NC, KP>(&s);

        // dSᵀ from P unrounded, as the row-major step's.
        wgmma_wait::<0, NC>(&mut dp);
        let ds_scale = self.mods.ds_scale();
        for (j, acc) in dp.iter_mut().enumerate() {
            let delta = unsafe { ld_shared_v2(pair_at(j) + 8) };
            for e in 0..2 {
                let delta_scaled = f32::from_bits(delta[e]) * ds_scale;
                for h in 0..2 {
                    acc[2 * h + e] = ds_fused(s[j][2 * h + e], acc[2 * h + e], ds_scale, delta_scaled);
                }
            }
        }
        let ds = frags::<E, NC, KP>(&dp);

        // dS keys by rows: k16 step kk's fragment is four 8 x 8 matrices, (keys g, g + 8) x
        // (rows 16 kk.., 16 kk + 8..), whose rows (keys) lane 8 i + r addresses.
        let tile = self.ds_keys_by_rows::<BM, BN>();
        let at = tile.chunk(key0 + 8 * (lane / 8 % 2) + lane % 8, lane / 16);
        for (kk, frag) in ds.iter().enumerate() {
            unsafe { stmatrix_x4(tile.shift(at, 0, 2 * kk as u32), *frag) };
        }
        (p, ds)
    }

    /// After the barrier that makes both warpgroups' dS whole: dQ = dS K for the warpgroup's
    /// rows x its columns, dV += Pᵀ dO and dK += dSᵀ Q from the fragments `p`, `ds`
    /// ([`Step::transposed_to_ds`]'s); dQ added to its accumulator while dV and dK compute
    /// ([`Step::dq`]), and the step ends with dK and dV landed (they read registers and the
    /// stage the next step overwrites). Const parameters as `backward`'s (`MQ = 1`, `DQ = DQT`:
    /// one pass over the warpgroup's columns).
    #[inline(always)]
    pub(super) unsafe fn transposed_grads<
        E: Elem,
        const BM: usize,
        const BN: usize,
        const KP: usize,
        const DKV: usize,
        const NK: usize,
        const MQ: usize,
        const DQT: usize,
        const DQ: usize,
        const QR: usize,
    >(
        &self,
        (p, ds): &([[u32; 4]; KP], [[u32; 4]; KP]),
        dk: &mut [[f32; 4]; DKV],
        dv: &mut [[f32; 4]; DKV],
        m_tiles: u32,
    ) {
        // The warpgroup's rows of dQ: column block `q_row0 / 64` of the keys-by-rows tile (the
        // 128-row tile's second warpgroup reads its second one).
        let (q_row0, dq_col0) = self.dq_origin::<MQ, DQT, QR>();
        let rows_chunk = (q_row0 & !63) / 8;
        let mut dq_issued: [[[f32; 4]; DQ]; MQ] = [wgmma_scratch(); MQ];
        let tile = self.ds_keys_by_rows::<BM, BN>();
        sm90::issue_grads_transposed::<E, DQ, DKV, NK, KP>(&self.st, &self.sm, tile, (rows_chunk, dq_col0), p, ds, &mut dq_issued[0], dv, dk);
        unsafe { self.dq::<E, MQ, DQT, DQ, NK, QR, false, true>(&mut dq_issued, m_tiles) };
        sm90::grads_landed::<DKV>(dv);
    }
}

/// The A fragments of an accumulator's `KP` k16 steps (`gemm::pack_p`, without its shape
/// assertion, which every kernel's instantiation would meet: see [`Step::transposed_to_ds`]).
#[inline(always)]
fn frags<E: Elem, const NC: usize, const KP: usize>(acc: &[[f32; 4]; NC]) -> [[u32; 4]; KP] {
    core::array::from_fn(|kk| if 2 * kk + 1 < NC { p_frag::<E, NC>(acc, kk) } else { [0; 4] })
}
