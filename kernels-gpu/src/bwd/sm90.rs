//! The Hopper backward's products (sm_90a): each a warpgroup `wgmma` reading its operands from
//! the portable kernel's shared tiles through descriptors (their layout is wgmma's 128-byte
//! swizzle), issued asynchronously so that a phase's elementwise work overlaps the products
//! still in flight. In a step: S and dP issued together, S waited for, P formed while dP
//! computes; dP waited for in dP -> dS; after the barrier dQ, dV and dK issued at once, dbias
//! added while they compute, dQ waited for first (its reductions go out while dV and dK still
//! compute), dV and dK before the step ends (they read tiles the next step overwrites). Each
//! product's warp grid is the warpgroups' (see `dmattn_abi::BwdTile`).
use super::smem::{Smem, Stage};
use crate::elem::{Elem, wgmma_wait};
use crate::gemm::{wgmma_pv, wgmma_tiles};
use crate::tile::SmemTile;

/// S = QKᵀ into `s` and dP = dO Vᵀ into `dp` for the warpgroup's 64 rows (from its first
/// warp's; this warp holds rows `r0`) x the keys from n8 tile `nt0`, issued as two groups;
/// returns once S has landed, with dP in flight.
#[inline(always)]
pub(super) fn scores_and_dp<E: Elem, const NC: usize, const KT: usize>(
    st: &Stage,
    sm: &Smem,
    r0: u32,
    nt0: u32,
    s: &mut [[f32; 4]; NC],
    dp: &mut [[f32; 4]; NC],
) {
    let rows = r0 & !63;
    wgmma_tiles::<E, NC, KT, 0, 0>(s, |ks| st.q.wgmma_k_major(rows, ks), |ks| sm.k.wgmma_k_major(8 * nt0, ks), true);
    wgmma_tiles::<E, NC, KT, 0, 0>(dp, |ks| st.dout.wgmma_k_major(rows, ks), |ks| sm.v.wgmma_k_major(8 * nt0, ks), true);
    wgmma_wait::<1, NC>(s);
}

/// dP, the last group in flight, has landed.
#[inline(always)]
pub(super) fn dp_landed<const NC: usize>(dp: &mut [[f32; 4]; NC]) {
    wgmma_wait::<0, NC>(dp);
}

/// Issues, as three groups in this order: dQ = dS K into `dq` (its values not read: see
/// `arch::wgmma_scratch`) for the warpgroup's 64 rows
/// (from `q_row0`, this warp's first) x the columns from n8 tile `dq_col0`, K read N-major; and
/// dV += Pᵀ dO, dK += dSᵀ Q for the warpgroup's 64 keys x every column: Aᵀ (M-major) from the P
/// and dS tiles, B (N-major) the whole dO and Q tiles.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn issue_grads<E: Elem, const DQ: usize, const DKV: usize, const NK: usize, const MK: usize>(
    st: &Stage,
    sm: &Smem,
    warp: u32,
    (q_row0, dq_col0): (u32, u32),
    dq: &mut [[f32; 4]; DQ],
    dv: &mut [[f32; 4]; DKV],
    dk: &mut [[f32; 4]; DKV],
) {
    let keys = 8 * (warp / 4);
    wgmma_tiles::<E, DQ, NK, 0, 1>(dq, |kk| sm.ds.wgmma_k_major(q_row0 & !63, kk), |kk| sm.k.wgmma_mn_major(kk, dq_col0), false);
    wgmma_tiles::<E, DKV, MK, 1, 1>(dv, |kk| sm.p.wgmma_mn_major(kk, keys), |kk| st.dout.wgmma_mn_major(kk, 0), true);
    wgmma_tiles::<E, DKV, MK, 1, 1>(dk, |kk| sm.ds.wgmma_mn_major(kk, keys), |kk| st.q.wgmma_mn_major(kk, 0), true);
}

/// dQ, the first of [`issue_grads`]'s (or [`issue_grads_transposed`]'s) groups, has landed.
#[inline(always)]
pub(super) fn dq_landed<const DQ: usize>(dq: &mut [[f32; 4]; DQ]) {
    wgmma_wait::<2, DQ>(dq);
}

/// dV and dK, the last of [`issue_grads`]'s (or [`issue_grads_transposed`]'s) groups, have
/// landed.
#[inline(always)]
pub(super) fn grads_landed<const DKV: usize>(dv: &mut [[f32; 4]; DKV]) {
    wgmma_wait::<0, DKV>(dv);
}

/// The transposed step's first products (`transposed`): Sᵀ = K Qᵀ into `s` and dPᵀ = V dOᵀ
/// into `dp` for the warpgroup's 64 keys from `key0` x all the stage's rows, issued as two
/// groups; returns once Sᵀ has landed, with dPᵀ in flight.
#[inline(always)]
pub(super) fn scores_and_dp_transposed<E: Elem, const NC: usize, const KT: usize>(
    st: &Stage,
    sm: &Smem,
    key0: u32,
    s: &mut [[f32; 4]; NC],
    dp: &mut [[f32; 4]; NC],
) {
    wgmma_tiles::<E, NC, KT, 0, 0>(s, |ks| sm.k.wgmma_k_major(key0, ks), |ks| st.q.wgmma_k_major(0, ks), false);
    wgmma_tiles::<E, NC, KT, 0, 0>(dp, |ks| sm.v.wgmma_k_major(key0, ks), |ks| st.dout.wgmma_k_major(0, ks), false);
    wgmma_wait::<1, NC>(s);
}

/// Issues, as three groups in this order (those of [`issue_grads`]): dQ = dS K into `dq` (its
/// values not read) for the warpgroup's 64 rows x the columns from n8 tile `dq_col0`, A M-major
/// from the keys-by-rows dS tile `ds_tile`'s columns from chunk `rows_chunk`, K N-major; dV +=
/// Pᵀ dO and dK += dSᵀ Q for the warpgroup's 64 keys x every column, with Pᵀ's and dSᵀ's A
/// fragments `p`, `ds` in registers.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn issue_grads_transposed<E: Elem, const DQ: usize, const DKV: usize, const NK: usize, const KP: usize>(
    st: &Stage,
    sm: &Smem,
    ds_tile: SmemTile,
    (rows_chunk, dq_col0): (u32, u32),
    p: &[[u32; 4]; KP],
    ds: &[[u32; 4]; KP],
    dq: &mut [[f32; 4]; DQ],
    dv: &mut [[f32; 4]; DKV],
    dk: &mut [[f32; 4]; DKV],
) {
    wgmma_tiles::<E, DQ, NK, 1, 1>(dq, |kk| ds_tile.wgmma_mn_major(kk, rows_chunk), |kk| sm.k.wgmma_mn_major(kk, dq_col0), false);
    wgmma_pv::<E, DKV>(dv, KP, |kk| p[kk], st.dout);
    wgmma_pv::<E, DKV>(dk, KP, |kk| ds[kk], st.q);
}
