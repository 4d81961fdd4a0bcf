//! The attention tile products on tensor cores, shared by the forward and decoding kernels:
//! S = QKᵀ and O += PV for a warp's rows, per warp `mma.sync` from `ldmatrix` fragments or
//! (sm_90a) warpgroup `wgmma`s from shared-memory descriptors.
use crate::arch::{wgmma_commit, wgmma_fence};
use crate::elem::{Elem, wgmma_wait};
use crate::tile::{Fragments, SmemTile};

/// `s += Q Kᵀ` for this warp's rows (from `warp_row0`) over the current K tile; `s` holds the
/// scores' start values. On tensor cores: per warp `mma.sync` from `ldmatrix` fragments, or
/// (`WGMMA`, one m16 row tile per warp) one `wgmma` per k16 step of the warp's warpgroup, Q and K
/// read from shared memory through descriptors, waited for before returning.
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
        let rows = warp_row0 & !63;
        wgmma_fence();
        for ks in 0..KT as u32 {
            E::wgmma::<NT, 0, 0>(&mut s[0], q.wgmma_k_major(rows, ks), k.wgmma_k_major(0, ks));
        }
        wgmma_commit();
        wgmma_wait::<0, NT>(&mut s[0]);
        return;
    }
    for ks in 0..KT as u32 {
        let mut a = [[0u32; 4]; MT];
        for mt in 0..MT {
            a[mt] = unsafe { q_frag.a(warp_row0 + 16 * mt as u32, ks) };
        }
        for np in 0..NT / 2 {
            let bk = unsafe { k_frag.b(16 * np as u32, ks) };
            for mt in 0..MT {
                E::mma(&mut s[mt][2 * np], &a[mt], bk[0], bk[1]);
                E::mma(&mut s[mt][2 * np + 1], &a[mt], bk[2], bk[3]);
            }
        }
    }
}

/// `o += P V` over the current V tile, P the softmax's probabilities in the S accumulators (their
/// layout is the A-fragment layout, so P never leaves registers): per warp `mma.sync`, or
/// (`WGMMA`) register-A `wgmma`s with V read from shared memory, waited for before returning.
#[inline(always)]
pub unsafe fn pv_product<E: Elem, const MT: usize, const NT: usize, const DT: usize, const WGMMA: bool>(
    o: &mut [[[f32; 4]; DT]; MT],
    s: &[[[f32; 4]; NT]; MT],
    v: SmemTile,
    v_frag: Fragments,
) {
    let p_frag = |mt: usize, kk: usize| {
        let (lo, hi) = (&s[mt][2 * kk], &s[mt][2 * kk + 1]);
        [E::pack(lo[0], lo[1]), E::pack(lo[2], lo[3]), E::pack(hi[0], hi[1]), E::pack(hi[2], hi[3])]
    };
    if WGMMA {
        wgmma_fence();
        for kk in 0..NT / 2 {
            E::wgmma_ra::<DT, 1>(&mut o[0], &p_frag(0, kk), v.wgmma_mn_major(kk as u32, 0));
        }
        wgmma_commit();
        wgmma_wait::<0, DT>(&mut o[0]);
        return;
    }
    for kk in 0..NT / 2 {
        let mut a = [[0u32; 4]; MT];
        for mt in 0..MT {
            a[mt] = p_frag(mt, kk);
        }
        for dp in 0..DT / 2 {
            let bv = unsafe { v_frag.b_trans(16 * kk as u32, 2 * dp as u32) };
            for mt in 0..MT {
                E::mma(&mut o[mt][2 * dp], &a[mt], bv[0], bv[1]);
                E::mma(&mut o[mt][2 * dp + 1], &a[mt], bv[2], bv[3]);
            }
        }
    }
}

