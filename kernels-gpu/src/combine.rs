//! The split-KV combine: merges the normalised partial outputs and LSEs that the forward's
//! key splits wrote into the final O and LSE.
use crate::arch::*;
use crate::elem::Elem;
use crate::bwd_pre::for_each_row;
use dmattn_abi::CombineParams;

const LOG2E: f32 = core::f32::consts::LOG2_E;

/// Each query row on a group of lanes (see [`for_each_row`]), rows in the partial O's `[b, sq, h]`
/// order. The row's lanes share the LSE pass (each a strided share of the splits, then shuffles),
/// so that many splits (a decode over gathered keys may leave most of them empty) are not one
/// chain of dependent loads; each lane notes which of its splits saw a key (at most 128 splits
/// over at least 4 lanes: a 32-bit mask each), and the O pass visits only those, eight at a time
/// (H100, decode over 1024 kept keys of 512K, 8 of 128 splits non-empty: 10.4 us with a pass
/// per lane's share).
#[inline(always)]
pub unsafe fn combine<E: Elem>(p: &CombineParams) {
    let r = &p.rows;
    let lanes = r.lanes();
    let lse_part = p.lse_part as *const f32;
    let split_lse = r.count() as usize;
    let split_o = 2 * r.count() as u64 * r.head_dim as u64;
    for_each_row(r, |row, lane, live| {
        let (h, bi) = (row % r.heads, row / r.heads);
        let (i, b) = (bi % r.seqlen_q, bi / r.seqlen_q);
        let lse_at = ((b * r.heads + h) * r.seqlen_q + i) as usize;
        let lse_of = |s: u32| unsafe { *lse_part.add(s as usize * split_lse + lse_at) };
        // This lane's share: running max and sum of 2^(lse - max), merged over the row's lanes.
        let (mut max, mut sum, mut seen) = (f32::NEG_INFINITY, 0f32, 0u32);
        let mut s0 = lane;
        while live && s0 < p.splits {
            // Eight loads in flight before the first is used.
            let mut l = [f32::NEG_INFINITY; 8];
            for k in 0..8 {
                let s = s0 + k as u32 * lanes;
                if s < p.splits {
                    l[k] = lse_of(s);
                }
            }
            for k in 0..8 {
                let (s, l) = (s0 + k as u32 * lanes, l[k]);
                seen |= ((l != f32::NEG_INFINITY) as u32) << (s / lanes);
                if l > max {
                    sum = sum * exp2((max - l) * LOG2E) + 1.0;
                    max = l;
                } else if l != f32::NEG_INFINITY {
                    sum += exp2((l - max) * LOG2E);
                }
            }
            s0 += 8 * lanes;
        }
        let mut step = 1;
        while step < lanes {
            let (m2, s2) = (shfl_xor(max, step), shfl_xor(sum, step));
            let m = max.max(m2);
            let scaled = |m0: f32, s0: f32| if m0 == f32::NEG_INFINITY { 0.0 } else { s0 * exp2((m0 - m) * LOG2E) };
            (max, sum) = (m, scaled(max, sum) + scaled(m2, s2));
            step *= 2;
        }
        // A row no split saw anything of keeps O = 0 and LSE = -inf. Rows past the end (no
        // split seen) still take part in the shuffles.
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        // The row's non-empty splits as one set every lane of the row holds (OR over the lanes'
        // strided shares; rows past the end take part in the shuffles with nothing seen), so
        // that the O pass issues its loads eight at a time however the splits fall among lanes.
        let mut words = [0u32; 4];
        let mut rest = seen;
        while rest != 0 {
            let split = lane + lanes * rest.trailing_zeros();
            rest &= rest - 1;
            let bit = 1 << (split % 32);
            match split / 32 {
                0 => words[0] |= bit,
                1 => words[1] |= bit,
                2 => words[2] |= bit,
                _ => words[3] |= bit,
            }
        }
        let mut step = 1;
        while step < lanes {
            for w in &mut words {
                *w |= shfl_xor_u32(*w, step);
            }
            step *= 2;
        }
        let mut acc = [0f32; 8];
        let part = p.o_part + 2 * row as u64 * r.head_dim as u64 + 16 * lane as u64;
        for (w, &word) in words.iter().enumerate() {
            let mut set = word;
            while set != 0 && 8 * lane < r.head_dim {
                // Eight splits' loads in flight before the first is used.
                let mut at = [u32::MAX; 8];
                for a in &mut at {
                    if set != 0 {
                        *a = 32 * w as u32 + set.trailing_zeros();
                        set &= set - 1;
                    }
                }
                let (mut l, mut v) = ([f32::NEG_INFINITY; 8], [[0u32; 4]; 8]);
                for k in 0..8 {
                    if at[k] != u32::MAX {
                        l[k] = lse_of(at[k]);
                        v[k] = unsafe { ld_global_nc_v4(part + at[k] as u64 * split_o) };
                    }
                }
                for k in 0..8 {
                    let w = if at[k] != u32::MAX { exp2((l[k] - max) * LOG2E) * inv } else { 0.0 };
                    for j in 0..4 {
                        let (lo, hi) = E::unpack(v[k][j]);
                        acc[2 * j] += w * lo;
                        acc[2 * j + 1] += w * hi;
                    }
                }
            }
        }
        if live && 8 * lane < r.head_dim {
            let o = &p.o;
            let at = o.ptr + 2 * (b as u64 * o.stride[0] + i as u64 * o.stride[1] + h as u64 * o.stride[2]) + 16 * lane as u64;
            let packed = [E::pack(acc[0], acc[1]), E::pack(acc[2], acc[3]), E::pack(acc[4], acc[5]), E::pack(acc[6], acc[7])];
            unsafe { st_global_v4(at, packed) };
        }
        if live && lane == 0 {
            let lse = if sum > 0.0 { max + log2(sum) * core::f32::consts::LN_2 } else { f32::NEG_INFINITY };
            unsafe { *(p.lse as *mut f32).add(lse_at) = lse };
        }
    });
}
