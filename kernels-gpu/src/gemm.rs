//! The tile products on tensor cores: [`mma_tiles`] (a warp's `mma.sync` from fragments it
//! loads) and [`wgmma_tiles`] (sm_90a: a warpgroup's `wgmma` from shared-memory descriptors),
//! and the attention's two products as the forward and decoding kernels use them, S = QKᵀ
//! ([`scores_product`]) and O += PV ([`pv_product`]), waited for; on Hopper both are
//! [`wgmma_scores`] and [`wgmma_pv`] (register-A), which the warp-specialised forward issues
//! without waiting. The backward's five products call the first two directly, their operands
//! read straight or transposed out of its shared tiles.
use crate::arch::{wgmma_commit, wgmma_fence};
use crate::elem::{Elem, wgmma_wait};
use crate::tile::{Fragments, SmemTile};

/// `acc += A B` over `KT` k16 steps for a warp's `MT` m16 x `NT` n8 accumulator tiles, where
/// `a(mt, k)` loads the A fragment of row tile `mt` and `b(np, k)` the B fragments of n8 tiles
/// `2 np` and `2 np + 1` at k-step `k`. Each step loads every A fragment first, then uses each
/// B fragment for all `MT` row tiles.
#[inline(always)]
pub fn mma_tiles<E: Elem, const MT: usize, const NT: usize, const KT: usize>(
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
/// back to back and committed as one group, for [`wgmma_wait`] to wait for. `acc = A B` instead
/// where `accumulate` is false (its values are not read).
#[inline(always)]
pub fn wgmma_tiles<E: Elem, const NT: usize, const KT: usize, const TA: u32, const TB: u32>(
    acc: &mut [[f32; 4]; NT],
    a: impl Fn(u32) -> u64,
    b: impl Fn(u32) -> u64,
    accumulate: bool,
) {
    wgmma_fence();
    for k in 0..KT as u32 {
        E::wgmma::<NT, TA, TB>(acc, a(k), b(k), accumulate || k > 0);
    }
    wgmma_commit();
}

/// `s += Q Kᵀ` for this warp's rows (from `warp_row0`) over the current K tile; `s` holds the
/// scores' start values. Per warp [`mma_tiles`], or (`WGMMA`, one m16 row tile per warp) the
/// warp's warpgroup's [`wgmma_tiles`], waited for before returning.
#[inline(always)]
pub unsafe fn scores_product<E: Elem, const MT: usize, const NT: usize, const KT: usize, const WGMMA: bool>(
    s: &mut [[[f32; 4]; NT]; MT],
    q: SmemTile,
    k: SmemTile,
    q_frag: Fragments,
    k_frag: Fragments,
    warp_row0: u32,
) {
    if WGMMA {
        // The warpgroup's 64 rows; each of its warps holds its own 16 of them.
        wgmma_scores::<E, NT, KT>(&mut s[0], q, k, warp_row0 & !63, true);
        wgmma_wait::<0, NT>(&mut s[0]);
        return;
    }
    mma_tiles::<E, MT, NT, KT>(s, |mt, ks| unsafe { q_frag.a(warp_row0 + 16 * mt, ks) }, |np, ks| unsafe { k_frag.b(16 * np, ks) });
}

/// `o += P V` over the current V tile, P the softmax's probabilities in the S accumulators (their
/// layout is the A-fragment layout, so P never leaves registers): per warp [`mma_tiles`] one k16
/// step at a time, or (`WGMMA`) register-A `wgmma`s with V read from shared memory, waited for
/// before returning.
#[inline(always)]
pub unsafe fn pv_product<E: Elem, const MT: usize, const NT: usize, const DT: usize, const WGMMA: bool>(
    o: &mut [[[f32; 4]; DT]; MT],
    s: &[[[f32; 4]; NT]; MT],
    v: SmemTile,
    v_frag: Fragments,
) {
    let p_frag = |mt: usize, kk: usize| p_frag::<E, NT>(&s[mt], kk);
    if WGMMA {
        wgmma_pv::<E, DT>(&mut o[0], NT / 2, |kk| p_frag(0, kk), v);
        wgmma_wait::<0, DT>(&mut o[0]);
        return;
    }
    for kk in 0..NT / 2 {
        mma_tiles::<E, MT, DT, 1>(o, |mt, _| p_frag(mt as usize, kk), |dp, _| unsafe { v_frag.b_trans(16 * kk as u32, 2 * dp) });
    }
}

/// `s += Q Kᵀ` (`s = Q Kᵀ` where not `accumulate`; sm_90a) for the warpgroup whose 64 query rows
/// start at `rows` (of the Q tile) over the K tile: committed as one group, not waited for.
#[inline(always)]
pub fn wgmma_scores<E: Elem, const NT: usize, const KT: usize>(s: &mut [[f32; 4]; NT], q: SmemTile, k: SmemTile, rows: u32, accumulate: bool) {
    wgmma_tiles::<E, NT, KT, 0, 0>(s, |ks| q.wgmma_k_major(rows, ks), |ks| k.wgmma_k_major(0, ks), accumulate);
}

/// `o += P V` (sm_90a) over `steps` k16 steps of a V tile (a constant where called, so the loop
/// unrolls), `p(kk)` the warp's A fragment of P for keys `16 kk..16 kk + 16`: register-A
/// `wgmma`s, committed as one group and not waited for (P's registers stay live until
/// [`wgmma_wait`]).
#[inline(always)]
pub fn wgmma_pv<E: Elem, const DT: usize>(o: &mut [[f32; 4]; DT], steps: usize, p: impl Fn(usize) -> [u32; 4], v: SmemTile) {
    wgmma_fence();
    for kk in 0..steps {
        E::wgmma_ra::<DT, 1>(o, &p(kk), v.wgmma_mn_major(kk as u32, 0));
    }
    wgmma_commit();
}

/// The A fragment, for keys `16 kk..16 kk + 16`, of a warp's probabilities `s` (m16 x `8 NT`,
/// accumulator layout, which is the A-fragment layout), rounded to `E`.
#[inline(always)]
pub(crate) fn p_frag<E: Elem, const NT: usize>(s: &[[f32; 4]; NT], kk: usize) -> [u32; 4] {
    let (lo, hi) = (&s[2 * kk], &s[2 * kk + 1]);
    [E::pack(lo[0], lo[1]), E::pack(lo[2], lo[3]), E::pack(hi[0], hi[1]), E::pack(hi[2], hi[3])]
}

/// All of a warp's P fragments at once ([`p_frag`] for `kk < KP = NT / 2`), for a P that must
/// outlive the accumulators it came from.
#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub fn pack_p<E: Elem, const NT: usize, const KP: usize>(s: &[[f32; 4]; NT]) -> [[u32; 4]; KP] {
    const { assert!(2 * KP == NT) };
    core::array::from_fn(|kk| p_frag::<E, NT>(s, kk))
}
