//! The backward's small passes: delta = rowsum(dO * O) per query row and, where the query tiles
//! are split, their shares before the main kernel; the f32 → 16-bit conversion of the
//! accumulated gradients after it (dQ's from the Hopper kernels' blocked layout).
use crate::arch::*;
use crate::elem::Elem;
use crate::mask::Visibility;
use crate::seq::Seq;
use dmattn_abi::{Band, BwdPreParams, BwdSharesParams, ConvertParams, DQ_GROUP_ROWS, DqConvertParams, PRE_THREADS, QueryRows, dq_blocked_row};

/// Runs `f(row, lane, live)` for every row of `rows` in `[b, sq, h]` order (consecutive rows are
/// consecutive heads of one query: adjacent in q, o and dO), `rows.lanes()` lanes per row,
/// grid-stride. All lanes of a warp call `f` together, so that it may shuffle within a row's
/// lanes; on rows past the end `live` is false, and `f` must not touch their memory.
#[inline(always)]
pub fn for_each_row(rows: &QueryRows, mut f: impl FnMut(u32, u32, bool)) {
    let (tid, (bx, _, _)) = (thread_idx(), block_idx());
    let (lanes, lane) = (rows.lanes(), tid % 32);
    let per_warp = 32 / lanes;
    let warps = PRE_THREADS / 32;
    let mut first = (bx * warps + tid / 32) * per_warp;
    while first < rows.count() {
        let row = first + lane / lanes;
        f(row, lane % lanes, row < rows.count());
        first += grid_dim_x() * warps * per_warp;
    }
}

/// delta = rowsum(dO * O) for every `[b, h, sq]` row.
#[inline(always)]
pub unsafe fn delta<E: Elem>(p: &BwdPreParams) {
    let r = &p.rows;
    for_each_row(r, |row, lane, live| {
        let (h, bi) = (row % r.heads, row / r.heads);
        let (i, b) = (bi % r.seqlen_q, bi / r.seqlen_q);
        let mut acc = 0.0f32;
        if live && 8 * lane < r.head_dim {
            let at = |t: &dmattn_abi::View4| {
                t.ptr + 2 * (b as u64 * t.stride[0] + i as u64 * t.stride[1] + h as u64 * t.stride[2]) + 16 * lane as u64
            };
            let (o, d) = unsafe { (ld_global_nc_v4(at(&p.o)), ld_global_nc_v4(at(&p.dout))) };
            for j in 0..4 {
                let (o0, o1) = E::unpack(o[j]);
                let (d0, d1) = E::unpack(d[j]);
                acc += o0 * d0 + o1 * d1;
            }
        }
        // Sum over the row's lanes (an aligned group: the butterfly stays inside it).
        let mut m = r.lanes() / 2;
        while m > 0 {
            acc += shfl_xor(acc, m);
            m /= 2;
        }
        if live && lane == 0 {
            unsafe { *(p.delta as *mut f32).add(((b * r.heads + h) * r.seqlen_q + i) as usize) = acc };
        }
    });
}

/// `dst[i] = src[i]` rounded to `E`, two elements per thread per step, grid-stride.
#[inline(always)]
pub unsafe fn convert<E: Elem>(p: &ConvertParams) {
    let (tid, (bx, _, _)) = (thread_idx(), block_idx());
    let (src, dst) = (p.src as *const f32, p.dst as *mut u16);
    let mut i = 2 * (bx as u64 * PRE_THREADS as u64 + tid as u64);
    let step = 2 * grid_dim_x() as u64 * PRE_THREADS as u64;
    while i < p.len {
        let lo = unsafe { *src.add(i as usize) };
        let hi = if i + 1 < p.len { unsafe { *src.add(i as usize + 1) } } else { 0.0 };
        let packed = E::pack(lo, hi);
        unsafe {
            *dst.add(i as usize) = packed as u16;
            if i + 1 < p.len {
                *dst.add(i as usize + 1) = (packed >> 16) as u16;
            }
        }
        i += step;
    }
}

/// dQ out of the Hopper backward's blocked accumulator (`DqConvertParams`): per (sequence, row
/// pair `g` and `g + 8` of a 16-row group, head), a lane per n8 column tile reads its block's
/// 16-byte words of lanes `4 g .. 4 g + 3` (64 contiguous bytes), which hold both rows' 8
/// columns, and writes each row's 16 bytes. Sequences (or batch entries) grid-stride along z,
/// the row pairs of one along x.
#[inline(always)]
pub unsafe fn convert_dq<E: Elem>(p: &DqConvertParams) {
    let (tid, (bx, _, bz)) = (thread_idx(), block_idx());
    let lanes = p.lanes();
    let (unit, col) = (tid / lanes, tid % lanes);
    let per_block = PRE_THREADS / lanes;
    let mut s = bz;
    while s < p.batch {
        let seq = Seq::in_batch::<true>(&p.seqs, s, p.seqlen_q, 0);
        let origin = if p.seqs.cu_q == 0 { 0 } else { dq_blocked_row(seq.q0, s) };
        let units = p.units(seq.len_q);
        let mut u = bx * per_block + unit;
        while u < units {
            let (h, pair) = (u % p.heads, u / p.heads);
            let (g, group) = (pair % 8, pair / 8);
            let first = DQ_GROUP_ROWS * group;
            if 8 * col < p.head_dim {
                let src = p.src.ptr
                    + 4 * (seq.batch * p.src.stride[0] + (origin + first) as u64 * p.src.stride[1] + h as u64 * p.src.stride[2])
                    + 512 * col as u64
                    + 64 * g as u64;
                let w = [0, 1, 2, 3].map(|t| unsafe { ld_global_nc_v4(src + 16 * t) }.map(f32::from_bits));
                for hh in 0..2 {
                    let i = first + g + 8 * hh as u32;
                    if i < seq.len_q {
                        let packed = w.map(|v| E::pack(v[2 * hh], v[2 * hh + 1]));
                        let dst = p.dst.ptr + 2 * (seq.q_offset(&p.dst.stride, i) + h as u64 * p.dst.stride[2]) + 16 * col as u64;
                        // A caller's buffer need only be contiguous: its rows may start anywhere.
                        if p.dst.ptr % 16 == 0 {
                            unsafe { st_global_v4(dst, packed) };
                        } else {
                            for (k, &two) in packed.iter().enumerate() {
                                unsafe {
                                    st_global_u16(dst + 4 * k as u64, two & 0xffff);
                                    st_global_u16(dst + 4 * k as u64 + 2, two >> 16);
                                }
                            }
                        }
                    }
                }
            }
            u += grid_dim_x() * per_block;
        }
        s += grid_dim_z();
    }
}

/// The query-tile shares of a split backward (`BwdSharesParams`), a thread per (key tile, split):
/// runs of as many query tiles as the problem's split evenly (not the key tile's run split
/// evenly), from the first the band lets see the key tile, so that a key tile seen by fewer query
/// tiles takes fewer CTAs, not more CTAs with less to do, each of which adds a whole dK/dV tile.
#[inline(always)]
pub unsafe fn shares(p: &BwdSharesParams) {
    let i = block_idx().0 * PRE_THREADS + thread_idx();
    let (shift, bm, bn, f) = (p.shift, p.block_m, p.block_n, &p.fwd);
    if i >= p.key_tiles << shift {
        return;
    }
    let vis = Visibility::of(f);
    let col0 = (i >> shift) * bn;
    let (begin, end) = (vis.query_tile_begin(col0, bm), vis.query_tile_end(col0, col0 + bn - 1, bm));
    let end = end.max(begin);
    let share = f.seqlen_q.div_ceil(bm).div_ceil(1 << shift).max(1);
    let first = (begin + (i & ((1 << shift) - 1)) * share).min(end);
    let last = (first + share).min(end);
    let rows = (last * bm).min(f.seqlen_q);
    // Keys past `sk - (sq - rows)` lie right of every kept row's diagonal where its right edge
    // is the diagonal (a compressed diagonal ignores the lengths; no right edge, no diagonal).
    let keys = if f.band.compress == 0 && f.band.right != Band::NONE { f.seqlen_k.saturating_sub(f.seqlen_q - rows) } else { f.seqlen_k };
    let (len_q, len_k) = if first < last && col0 < keys { (rows, keys) } else { (0, col0) };
    unsafe { st_global_v4(p.shares + 16 * i as u64, [first, len_q, len_k, 0]) };
}
