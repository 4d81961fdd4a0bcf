//! The split-KV combine: merges the normalised partial outputs and LSEs that the forward's
//! key splits wrote into the final O and LSE. [`combine`] gives each row a few lanes;
//! [`combine_rows`], for calls of few rows, a CTA.
use crate::arch::*;
use crate::elem::Elem;
use crate::bwd_pre::for_each_row;
use dmattn_abi::{CombineParams, PRE_THREADS, QueryRows};

const LOG2E: f32 = core::f32::consts::LOG2_E;

/// A running `max` of split LSEs and the sum of `2^((lse - max) log2 e)` over them.
#[derive(Clone, Copy)]
struct LseSum {
    max: f32,
    sum: f32,
}

impl LseSum {
    const EMPTY: Self = LseSum { max: f32::NEG_INFINITY, sum: 0.0 };

    /// Adds a split's LSE (-inf: a split that saw no key, nothing).
    #[inline(always)]
    fn add(&mut self, l: f32) {
        if l > self.max {
            self.sum = self.sum * exp2((self.max - l) * LOG2E) + 1.0;
            self.max = l;
        } else if l != f32::NEG_INFINITY {
            self.sum += exp2((l - self.max) * LOG2E);
        }
    }

    #[inline(always)]
    fn merge(self, o: LseSum) -> Self {
        let m = self.max.max(o.max);
        let scaled = |x: LseSum| if x.max == f32::NEG_INFINITY { 0.0 } else { x.sum * exp2((x.max - m) * LOG2E) };
        LseSum { max: m, sum: scaled(self) + scaled(o) }
    }

    /// Merged over the lanes `lane ^ 1, lane ^ 2, .. < lanes` (a shuffle group).
    #[inline(always)]
    fn over_lanes(mut self, lanes: u32) -> Self {
        let mut step = 1;
        while step < lanes {
            self = self.merge(LseSum { max: shfl_xor(self.max, step), sum: shfl_xor(self.sum, step) });
            step *= 2;
        }
        self
    }

    /// The splits' weights in the merged O ([`Weights::of`]).
    #[inline(always)]
    fn weights(&self) -> Weights {
        Weights { max: self.max, inv: if self.sum > 0.0 { 1.0 / self.sum } else { 0.0 } }
    }

    /// The merged LSE (-inf where no split saw a key).
    #[inline(always)]
    fn lse(&self) -> f32 {
        if self.sum > 0.0 { self.max + log2(self.sum) * core::f32::consts::LN_2 } else { f32::NEG_INFINITY }
    }
}

/// A merged [`LseSum`] as split weights: its max and the sum's inverse.
#[derive(Clone, Copy)]
struct Weights {
    max: f32,
    inv: f32,
}

impl Weights {
    /// The weight of a split of LSE `l` (0 for -inf: a split that saw no key).
    #[inline(always)]
    fn of(&self, l: f32) -> f32 {
        if l != f32::NEG_INFINITY { exp2((l - self.max) * LOG2E) * self.inv } else { 0.0 }
    }
}

/// `acc += w * v` for one split's 16 bytes of a row (eight elements, packed in pairs).
#[inline(always)]
fn add_weighted<E: Elem>(acc: &mut [f32; 8], w: f32, v: &[u32; 4]) {
    for (j, &pair) in v.iter().enumerate() {
        let (lo, hi) = E::unpack(pair);
        acc[2 * j] += w * lo;
        acc[2 * j + 1] += w * hi;
    }
}

/// Where row `row` (`[b, sq, h]` order) of `r` lies: its index in the LSEs `[b, h, sq]`, and the
/// byte offset of its O row in `o`.
#[inline(always)]
fn row_at(r: &QueryRows, o: &dmattn_abi::View4, row: u32) -> (usize, u64) {
    let (h, bi) = (row % r.heads, row / r.heads);
    let (i, b) = (bi % r.seqlen_q, bi / r.seqlen_q);
    (((b * r.heads + h) * r.seqlen_q + i) as usize, 2 * (b as u64 * o.stride[0] + i as u64 * o.stride[1] + h as u64 * o.stride[2]))
}

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
        let (lse_at, o_at) = row_at(r, &p.o, row);
        let lse_of = |s: u32| unsafe { *lse_part.add(s as usize * split_lse + lse_at) };
        // This lane's share: running max and sum of 2^(lse - max), merged over the row's lanes.
        let (mut acc_lse, mut seen) = (LseSum::EMPTY, 0u32);
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
                acc_lse.add(l);
            }
            s0 += 8 * lanes;
        }
        // A row no split saw anything of keeps O = 0 and LSE = -inf. Rows past the end (no
        // split seen) still take part in the shuffles.
        let total = acc_lse.over_lanes(lanes);
        let weights = total.weights();
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
                    let w = if at[k] != u32::MAX { weights.of(l[k]) } else { 0.0 };
                    add_weighted::<E>(&mut acc, w, &v[k]);
                }
            }
        }
        if live && 8 * lane < r.head_dim {
            let packed = [E::pack(acc[0], acc[1]), E::pack(acc[2], acc[3]), E::pack(acc[4], acc[5]), E::pack(acc[6], acc[7])];
            unsafe { st_global_v4(p.o.ptr + o_at + 16 * lane as u64, packed) };
        }
        if live && lane == 0 {
            unsafe { *(p.lse as *mut f32).add(lse_at) = total.lse() };
        }
    });
}

/// Splits whose O loads [`combine_rows`] keeps in flight at once.
const ROWS_IN_FLIGHT: usize = 4;

/// The combine for calls of few rows (grid-stride, a CTA of `PRE_THREADS` threads a row): the
/// row's splits shared by the whole CTA, where [`combine`]'s few lanes a row would walk them in
/// turn (H200, one query of 2 heads over 128 splits, every split non-empty: 31 us, a warp's
/// chain of dependent loads). Each thread takes a strided share of the LSEs, merged over the CTA;
/// then each group of `lanes` threads (16 bytes of the row each) a strided share of the
/// non-empty splits' O rows, summed over the groups in shared memory. Dynamic shared memory:
/// [`dmattn_abi::COMBINE_ROWS_SMEM_BYTES`].
#[inline(always)]
pub unsafe fn combine_rows<E: Elem>(p: &CombineParams) {
    const T: u32 = PRE_THREADS;
    let r = &p.rows;
    let tid = thread_idx();
    let lanes = r.lanes();
    let (groups, group, lane) = (T / lanes, tid / lanes, tid % lanes);
    // Each thread's 8 partial sums, `[T][8]` f32 (thread `group * lanes + lane`: elements
    // `8 lane..` of the row, group `group`'s), then each warp's (max, sum).
    let (sums, warps) = (smem_base(), smem_base() + 4 * 8 * T);
    let lse_part = p.lse_part as *const f32;
    let split_lse = r.count() as usize;
    let split_o = 2 * r.count() as u64 * r.head_dim as u64;
    let mut row = block_idx().0;
    while row < r.count() {
        let (lse_at, o_at) = row_at(r, &p.o, row);
        let lse_of = |s: u32| unsafe { *lse_part.add(s as usize * split_lse + lse_at) };
        let mut mine = LseSum::EMPTY;
        let mut s = tid;
        while s < p.splits {
            mine.add(lse_of(s));
            s += T;
        }
        let warp = mine.over_lanes(32);
        if tid % 32 == 0 {
            unsafe {
                st_shared_u32(warps + 8 * (tid / 32), warp.max.to_bits());
                st_shared_u32(warps + 8 * (tid / 32) + 4, warp.sum.to_bits());
            }
        }
        sync_threads();
        let mut total = LseSum::EMPTY;
        for w in 0..T / 32 {
            let at = warps + 8 * w;
            total = total.merge(unsafe { LseSum { max: f32::from_bits(ld_shared_u32(at)), sum: f32::from_bits(ld_shared_u32(at + 4)) } });
        }
        let weights = total.weights();
        // This group's splits, `ROWS_IN_FLIGHT` O loads at a time; a split that saw no key
        // wrote no O (its LSE is -inf), so its O is not read.
        let mut acc = [0f32; 8];
        let part = p.o_part + 2 * row as u64 * r.head_dim as u64 + 16 * lane as u64;
        let mut s0 = group;
        while s0 < p.splits && 8 * lane < r.head_dim {
            let mut l = [f32::NEG_INFINITY; ROWS_IN_FLIGHT];
            for (k, l) in l.iter_mut().enumerate() {
                let s = s0 + k as u32 * groups;
                if s < p.splits {
                    *l = lse_of(s);
                }
            }
            let mut v = [[0u32; 4]; ROWS_IN_FLIGHT];
            for k in 0..ROWS_IN_FLIGHT {
                if l[k] != f32::NEG_INFINITY {
                    v[k] = unsafe { ld_global_nc_v4(part + (s0 + k as u32 * groups) as u64 * split_o) };
                }
            }
            for k in 0..ROWS_IN_FLIGHT {
                add_weighted::<E>(&mut acc, weights.of(l[k]), &v[k]);
            }
            s0 += ROWS_IN_FLIGHT as u32 * groups;
        }
        for (j, a) in acc.iter().enumerate() {
            unsafe { st_shared_u32(sums + 4 * (8 * tid + j as u32), a.to_bits()) };
        }
        sync_threads();
        // Thread `t` sums elements `2t` and `2t + 1` of the row over the groups.
        if 2 * tid < r.head_dim {
            let (mut lo, mut hi) = (0f32, 0f32);
            for g in 0..groups {
                let at = sums + 4 * (8 * g * lanes + 2 * tid);
                lo += unsafe { f32::from_bits(ld_shared_u32(at)) };
                hi += unsafe { f32::from_bits(ld_shared_u32(at + 4)) };
            }
            unsafe { *((p.o.ptr + o_at) as *mut u32).add(tid as usize) = E::pack(lo, hi) };
        }
        if tid == 0 {
            unsafe { *(p.lse as *mut f32).add(lse_at) = total.lse() };
        }
        // The shared sums are read before the next row writes them.
        sync_threads();
        row += grid_dim_x();
    }
}
