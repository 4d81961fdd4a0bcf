//! Gather attention's data movement: a query-broadcast mask compacted into per-plane key lists,
//! K/V rows and bias columns gathered along those lists, the gathered problem's mask written from
//! the band on the original key positions, and the gradients scattered back. The attention itself
//! runs in the ordinary kernels over the gathered keys, so its cost is O(queries x kept keys).
use crate::arch::*;
use core::mem::offset_of;
use crate::elem::Elem;
use crate::mask::Visibility;
use dmattn_abi::{
    BLOCK_MAP_K, BLOCK_MAP_Q, COMPACT_KEYS_PER_THREAD, COMPACT_THREADS, GATHER_THREADS, GatherMaskParams, GatherParams, IndicesParams, KeyCompactParams,
    KeyLists, ListsBand, ScatterParams, block_class, mask_bit,
};

/// Whether the mask shows key `k` of the row at `base` (bool bytes `stride` apart, or bits).
#[inline(always)]
unsafe fn shown(p: &KeyCompactParams, base: u64, k: u32) -> u32 {
    if p.packed != 0 {
        (unsafe { ld_global_nc_u8(base + (k / 8) as u64) } >> (k % 8)) & 1
    } else {
        (unsafe { ld_global_nc_u8(base + k as u64 * p.mask.stride[3]) } != 0) as u32
    }
}

/// This thread's `COMPACT_KEYS_PER_THREAD` keys from `first` as bits (bit `j`: key `first + j`
/// shown; zero past `sk`).
#[inline(always)]
unsafe fn strip_bits(p: &KeyCompactParams, base: u64, first: u32, sk: u32) -> u32 {
    const N: u32 = COMPACT_KEYS_PER_THREAD;
    let strip = base + first as u64 * p.mask.stride[3];
    if p.packed == 0 && p.mask.stride[3] == 1 && strip % 16 == 0 && first + N <= sk {
        // One 16-byte load of bool bytes.
        let [w0, w1, w2, w3] = unsafe { ld_global_nc_v4(strip) };
        let nonzero = |w: u32, at: u32| (0..4).fold(0, |bits, b| bits | (((w >> (8 * b)) & 0xff != 0) as u32) << (at + b));
        nonzero(w0, 0) | nonzero(w1, 4) | nonzero(w2, 8) | nonzero(w3, 12)
    } else {
        let mut bits = 0;
        for j in 0..N {
            if first + j < sk {
                bits |= unsafe { shown(p, base, first + j) } << j;
            }
        }
        bits
    }
}

/// The mask row of `plane` and the keys of its chunk `chunk`: `(row base, first key)`.
#[inline(always)]
fn chunk_of(p: &KeyCompactParams, chunk: u32, plane: u32) -> (u64, u32) {
    let mh = p.dims[1];
    let base = p.mask.ptr + (plane / mh) as u64 * p.mask.stride[0] + (plane % mh) as u64 * p.mask.stride[1];
    (base, chunk * COMPACT_THREADS * COMPACT_KEYS_PER_THREAD)
}

/// Grid `(chunks, planes)`, `COMPACT_THREADS` threads, each a strip of `COMPACT_KEYS_PER_THREAD`
/// keys: each chunk's kept-key count (`counts` holds `[planes, chunks]` here). Dynamic shared
/// memory: 33 u32.
#[inline(always)]
pub unsafe fn key_count(p: &KeyCompactParams) {
    let tid = thread_idx();
    let (chunk, plane, _) = block_idx();
    let (base, k0) = chunk_of(p, chunk, plane);
    let first = k0 + tid * COMPACT_KEYS_PER_THREAD;
    let bits = if first < p.dims[2] { unsafe { strip_bits(p, base, first, p.dims[2]) } } else { 0 };
    let (_, total) = block_scan::<COMPACT_THREADS>(bits.count_ones(), tid, smem_base());
    if tid == 0 {
        unsafe { *(p.chunk_counts as *mut u32).add((plane * grid_dim_x() + chunk) as usize) = total };
    }
}

/// Grid `(chunks, planes)` as [`key_count`], after it: each chunk places its kept keys after the
/// earlier chunks' (a block-wide scan of the strips' counts), and `-1` in the list slots of its
/// range past the plane's count. Dynamic shared memory: 33 u32.
#[inline(always)]
pub unsafe fn key_compact(p: &KeyCompactParams) {
    const N: u32 = COMPACT_KEYS_PER_THREAD;
    let tid = thread_idx();
    let (chunk, plane, _) = block_idx();
    let chunks = grid_dim_x();
    let sk = p.dims[2];
    let (base, k0) = chunk_of(p, chunk, plane);
    // This plane's earlier chunks' counts and its total, each thread summing a strided share
    // (hundreds of chunks at half a million keys).
    let counts = p.chunk_counts as *const u32;
    let (mut before, mut total) = (0u32, 0u32);
    let mut c = tid;
    while c < chunks {
        let n = unsafe { *counts.add((plane * chunks + c) as usize) };
        total += n;
        if c < chunk {
            before += n;
        }
        c += COMPACT_THREADS;
    }
    let (_, before) = block_scan::<COMPACT_THREADS>(before, tid, smem_base());
    let (_, total) = block_scan::<COMPACT_THREADS>(total, tid, smem_base());
    let out = plane as u64 * p.plane_stride as u64;
    let (pos, ranks) = (p.pos as *mut i32, p.ranks as *mut i32);
    let first = k0 + tid * N;
    let bits = if first < sk { unsafe { strip_bits(p, base, first, sk) } } else { 0 };
    let (mine, _) = block_scan::<COMPACT_THREADS>(bits.count_ones(), tid, smem_base());
    let mut at = before + mine;
    // Ranks in 16-byte stores (a strip is 64-byte aligned: planes are whole 64-key blocks
    // apart): scalar ones, 64 bytes apart across a warp, make half a million keys a long stream
    // of L2 transactions.
    for quad in 0..N / 4 {
        let mut rank = [0u32; 4];
        for e in 0..4 {
            let j = 4 * quad + e;
            // No bit is set past `sk`.
            let kept = (bits >> j) & 1 != 0;
            if kept {
                unsafe { *pos.add((out + at as u64) as usize) = (first + j) as i32 };
                at += 1;
            }
            rank[e as usize] = at;
        }
        let k = first + 4 * quad;
        let at_k = (out + k as u64) as usize;
        if k + 4 <= sk {
            unsafe { st_global_v4(ranks.add(at_k) as u64, rank) };
        } else {
            for e in 0..4 {
                if k + e < sk {
                    unsafe { *ranks.add(at_k + e as usize) = rank[e as usize] as i32 };
                }
            }
        }
    }
    // The last chunk also fills the plane's padding.
    let end = if chunk + 1 == chunks { p.plane_stride } else { k0 + COMPACT_THREADS * N };
    let mut c = k0.max(total) + tid;
    while c < end {
        unsafe { *pos.add((out + c as u64) as usize) = -1 };
        c += COMPACT_THREADS;
    }
    if tid == 0 && chunk == 0 {
        unsafe { *(p.counts as *mut u32).add(plane as usize) = total };
    }
}

/// The entry of `lists` for operand plane `(x, y)` and list slot `c` (`c` itself where the lists
/// are absent: a copy that only broadcasts or sums heads).
#[inline(always)]
unsafe fn list_entry(l: &KeyLists, x: u32, y: u32, c: u32) -> i32 {
    if l.ptr == 0 {
        return c as i32;
    }
    let at = x as u64 * l.batch + div(y, l.head_div) as u64 * l.head + c as u64;
    unsafe { *(l.ptr as *const i32).add(at as usize) }
}

/// Key `j`'s slot in the list of operand plane `(x, y)`, from the plane's `ranks` (see
/// `ScatterParams::ranks`): -1 for a key the list does not hold; `j` itself where the ranks are
/// absent.
#[inline(always)]
unsafe fn slot_of(ranks: &KeyLists, x: u32, y: u32, j: u32) -> i32 {
    if ranks.ptr == 0 {
        return j as i32;
    }
    let rank = unsafe { list_entry(ranks, x, y, j) };
    let before = if j > 0 { unsafe { list_entry(ranks, x, y, j - 1) } } else { 0 };
    if rank > before { rank - 1 } else { -1 }
}

/// `i` as `(x, y, q, c, unit)` of `dims` with `units` pieces per row: in 32-bit arithmetic where
/// `i` fits (64-bit divisions are long instruction sequences, and a gather over a long key
/// sequence runs millions of these).
#[inline(always)]
fn split(i: u64, dims: [u32; 4], units: u32) -> (u32, u32, u32, u32, u32) {
    if i <= u32::MAX as u64 {
        let i = i as u32;
        let (u, r) = (i % units, i / units);
        let (c, r) = (r % dims[3], r / dims[3]);
        let (q, r) = (r % dims[2], r / dims[2]);
        return (r / dims[1], r % dims[1], q, c, u);
    }
    let u = (i % units as u64) as u32;
    let r = i / units as u64;
    let c = (r % dims[3] as u64) as u32;
    let r = r / dims[3] as u64;
    let q = (r % dims[2] as u64) as u32;
    let r = r / dims[2] as u64;
    ((r / dims[1] as u64) as u32, (r % dims[1] as u64) as u32, q, c, u)
}

#[inline(always)]
fn at(base: u64, s: &[u64; 4], x: u32, y: u32, q: u32, c: u32) -> u64 {
    base + x as u64 * s[0] + y as u64 * s[1] + q as u64 * s[2] + c as u64 * s[3]
}

/// Calls `f(x, y, q, c, piece)` for this thread's pieces of the rows of `dims` (`units` pieces a
/// row), grid-stride over `GATHER_THREADS`-thread blocks.
#[inline(always)]
fn for_each_piece(dims: [u32; 4], units: u32, mut f: impl FnMut(u32, u32, u32, u32, u32)) {
    let total = dims.iter().fold(units as u64, |n, &d| n * d as u64);
    let mut i = block_idx().0 as u64 * GATHER_THREADS as u64 + thread_idx() as u64;
    let step = grid_dim_x() as u64 * GATHER_THREADS as u64;
    while i < total {
        let (x, y, q, c, u) = split(i, dims, units);
        f(x, y, q, c, u);
        i += step;
    }
}

/// Grid-stride, `GATHER_THREADS` threads, one `unit`-byte piece of a row each.
#[inline(always)]
pub unsafe fn gather_rows(p: &GatherParams) {
    for_each_piece(p.dims, p.row_bytes / p.unit, |x, y, q, c, u| {
        let key = unsafe { list_entry(&p.lists, x, y, c) };
        if key < 0 && p.skip_missing != 0 {
            return;
        }
        let dst = at(p.dst, &p.dst_stride, x, y, q, c) + (u * p.unit) as u64;
        let src = at(p.src, &p.src_stride, x, div(y, p.src_head_div), q, key.max(0) as u32) + (u * p.unit) as u64;
        unsafe {
            if p.unit == 16 {
                st_global_v4(dst, if key >= 0 { ld_global_nc_v4(src) } else { [0; 4] });
            } else {
                st_global_u16(dst, if key >= 0 { ld_global_nc_u16(src) } else { 0 });
            }
        }
    });
}

/// Grid-stride, `GATHER_THREADS` threads, one piece (8 elements, or 1) of an output row each.
#[inline(always)]
pub unsafe fn scatter_rows<E: Elem>(p: &ScatterParams) {
    for_each_piece(p.dims, p.row_elems / p.unit, |x, y, q, j, u| {
        let mut acc = [0f32; 8];
        for b in 0..p.ratio[1] {
            // Ranks shared by the summed batch entries (query chunks) are read once: most keys
            // have no slot, and then no source.
            let shared = p.ranks.ptr == 0 || p.ranks.batch == 0;
            let mut slot = unsafe { slot_of(&p.ranks, x * p.ratio[0], y * p.ratio[1] + b, j) };
            if shared && slot < 0 {
                continue;
            }
            for a in 0..p.ratio[0] {
                let (xs, ys) = (x * p.ratio[0] + a, y * p.ratio[1] + b);
                if !shared && a > 0 {
                    slot = unsafe { slot_of(&p.ranks, xs, ys, j) };
                }
                if slot >= 0 {
                    let src = at(p.src, &p.src_stride, xs, ys, q, slot as u32) + (2 * u * p.unit) as u64;
                    if p.unit == 8 {
                        let v = unsafe { ld_global_v4(src) };
                        for (k, w) in v.iter().enumerate() {
                            let (lo, hi) = E::unpack(*w);
                            acc[2 * k] += lo;
                            acc[2 * k + 1] += hi;
                        }
                    } else {
                        acc[0] += E::unpack(unsafe { ld_global_u16(src) }).0;
                    }
                }
            }
        }
        let dst = at(p.dst, &p.dst_stride, x, y, q, j) + (2 * u * p.unit) as u64;
        unsafe {
            if p.unit == 8 {
                let w = core::array::from_fn(|k| E::pack(acc[2 * k], acc[2 * k + 1]));
                st_global_v4(dst, w);
            } else {
                st_global_u16(dst, E::pack(acc[0], 0.0) & 0xffff);
            }
        }
    });
}

/// The kept (non-negative) keys among the 64 ascending ones at shared `keys`: a binary search
/// for the first -1.
#[inline(always)]
unsafe fn count_kept(keys: u32) -> u32 {
    let (mut lo, mut hi) = (0u32, 64u32);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if (unsafe { ld_shared_u32(keys + 4 * mid) } as i32) < 0 {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Grid `(k_blocks, q_blocks, planes)`, 64 threads: the block's 64 key positions in shared
/// memory, one query row per thread.
#[inline(always)]
pub unsafe fn gather_mask(p: &GatherMaskParams) {
    const { assert!(BLOCK_MAP_Q == 64 && BLOCK_MAP_K == 64) };
    let (kb, qb, plane) = block_idx();
    let t = thread_idx();
    let keys = smem_base();
    let key = unsafe { *(p.pos as *const i32).add((plane as u64 * p.pos_plane + (kb * 64 + t) as u64) as usize) };
    unsafe { st_shared_u32(keys + 4 * t, key as u32) };
    sync_threads();
    let row = qb * 64 + t;
    let vis = Visibility::new(p.seqlen_q, p.seqlen_k, p.band);
    // The keys ascend, -1 past the list's end: the first and last kept ones against the band's
    // edges at the block's first and last rows (both edges never decrease down the rows) settle
    // most blocks without a per-score test.
    let kept = unsafe { count_kept(keys) };
    let (first, last) = unsafe { (ld_shared_u32(keys), ld_shared_u32(keys + 4 * kept.max(1) - 4)) };
    let (lo0, hi0) = vis.row_keys(qb * 64);
    let (lo1, hi1) = vis.row_keys((qb * 64 + 63).min(p.seqlen_q - 1));
    let sinks = vis.row_sinks();
    let empty = kept == 0 || first >= hi1 || (last < lo0 && first >= sinks);
    let full = kept == 64 && last < hi0 && (first >= lo1 || last < sinks.min(hi0));
    let mut word = if full { u64::MAX } else { 0 };
    if row < p.seqlen_q && !empty && !full {
        let (lo, hi) = vis.row_keys(row);
        let sinks = sinks.min(hi);
        for c in 0..64 {
            // -1 (past the list's end) is above every bound as u32.
            let j = unsafe { ld_shared_u32(keys + 4 * c) };
            let shown = j < hi && (j >= lo || j < sinks);
            word |= (shown as u64) << mask_bit(c);
        }
    }
    if row < p.seqlen_q {
        let at = (plane as u64 * p.seqlen_q as u64 + row as u64) * p.k_blocks as u64 + kb as u64;
        unsafe { *(p.bits as *mut u64).add(at as usize) = word };
    }
    let any = sync_threads_or(word != 0);
    let all = sync_threads_and(row >= p.seqlen_q || word == u64::MAX);
    if t == 0 {
        let at = ((plane * p.q_blocks + qb) * p.k_blocks + kb) as usize;
        unsafe { *(p.classes as *mut u8).add(at) = block_class::of(any, all) };
    }
}

/// Grid-stride, `GATHER_THREADS` threads, one index entry each, into bits zeroed before: rows
/// too long for [`indices_row_bits`]' shared memory.
#[inline(always)]
pub unsafe fn indices_bits(p: &IndicesParams) {
    let [_, ph, rows, w] = p.dims;
    let total = p.dims.iter().fold(1u64, |n, &d| n * d as u64);
    let mut i = block_idx().0 as u64 * GATHER_THREADS as u64 + thread_idx() as u64;
    let step = grid_dim_x() as u64 * GATHER_THREADS as u64;
    while i < total {
        let e = (i % w as u64) as u32;
        let row = i / w as u64;
        let (r, plane) = ((row % rows as u64) as u32, row / rows as u64);
        let (b, h) = (plane / ph as u64, plane % ph as u64);
        if let Some(key) = unsafe { index_entry(p, b, h, r, e) } {
            let word = p.bits + 4 * (row * p.row_words as u64 + (key / 32) as u64);
            unsafe { red_or_u32(word, 1 << (key % 32)) };
        }
        i += step;
    }
}

/// Grid `(rows, ph, pb)`, `GATHER_THREADS` threads: one row's bits built in shared memory
/// (`4 * row_words` bytes) and written out whole, so that the bits need no zeroing before and
/// the entries' ORs stay on the SM (global ORs at random words made [`indices_bits`] the
/// slowest step of preparing per-query lists). Where `p.band` is set, the row's keys are summed
/// up into it as well ([`record_band_row`]).
#[inline(always)]
pub unsafe fn indices_row_bits(p: &IndicesParams) {
    let w = p.dims[3];
    let (r, h, b) = block_idx();
    let tid = thread_idx();
    let words = smem_base();
    let mut i = tid;
    while i < p.row_words {
        unsafe { st_shared_u32(words + 4 * i, 0) };
        i += GATHER_THREADS;
    }
    sync_threads();
    let mut e = tid;
    while e < w {
        if let Some(key) = unsafe { index_entry(p, b as u64, h as u64, r, e) } {
            unsafe { atom_or_shared_u32(words + 4 * (key / 32), 1 << (key % 32)) };
        }
        e += GATHER_THREADS;
    }
    sync_threads();
    let row = (b as u64 * p.dims[1] as u64 + h as u64) * p.dims[2] as u64 + r as u64;
    let out = (p.bits + 4 * row * p.row_words as u64) as *mut u32;
    let (mut count, mut first, mut last) = (0u32, u32::MAX, 0u32);
    let mut i = tid;
    while i < p.row_words {
        let word = unsafe { ld_shared_u32(words + 4 * i) };
        unsafe { *out.add(i as usize) = word };
        if word != 0 {
            count += word.count_ones();
            first = first.min(32 * i + word.trailing_zeros());
            last = 32 * i + 31 - word.leading_zeros();
        }
        i += GATHER_THREADS;
    }
    // Uniform: the whole CTA takes the branch or none of it.
    if p.band != 0 {
        // The row's key count, its least key complemented and its greatest key plus one, each
        // the maximum of the threads' (0: no key), in the first words once they are written out.
        let summary = words;
        sync_threads();
        if tid < 3 {
            unsafe { st_shared_u32(summary + 4 * tid, 0) };
        }
        sync_threads();
        if count != 0 {
            unsafe {
                atom_add_shared_u32(summary, count);
                atom_max_shared_u32(summary + 4, !first);
                atom_max_shared_u32(summary + 8, last + 1);
            }
        }
        sync_threads();
        if tid == 0 {
            let (count, first, end) = unsafe { (ld_shared_u32(summary), !ld_shared_u32(summary + 4), ld_shared_u32(summary + 8)) };
            unsafe { record_band_row(p, r, count, first, end) };
        }
    }
}

/// Row `r`'s keys (`count` of them, `first..end`; none where `count` is 0) into the
/// [`ListsBand`] at `p.band`. A field is raised only where the row would raise it: once the
/// rows of a window have set them, rows read and leave them; once a row has found the lists
/// broken, the rest read that and leave (random lists' rows would otherwise raise the same
/// fields a row after another: 0.24 ms more to prepare 32K rows, H200).
#[inline(always)]
unsafe fn record_band_row(p: &IndicesParams, r: u32, count: u32, first: u32, end: u32) {
    let at = |field: usize| p.band + field as u64;
    if unsafe { ld_relaxed_u32(at(offset_of!(ListsBand, broken))) } != 0 {
        return;
    }
    // The host asks only where rows and keys are below 2^30: every value here fits an i32.
    let raise = |field: usize, v: i32| {
        if v > unsafe { ld_relaxed_u32(at(field)) } as i32 {
            unsafe { red_max_s32(at(field), v) };
        }
    };
    if count == 0 {
        unsafe { red_add_u32(at(offset_of!(ListsBand, empty_rows)), 1) };
        return;
    }
    let (sk, rows) = (p.seqlen_k as i32, p.dims[2] as i32);
    let (diag, first, last, r) = (r as i32 + sk - rows, first as i32, end as i32 - 1, r as i32);
    if count as i32 != last - first + 1 {
        unsafe { *(at(offset_of!(ListsBand, broken)) as *mut u32) = 1 };
    }
    raise(offset_of!(ListsBand, last_row), r);
    raise(offset_of!(ListsBand, first_row_neg), -r);
    if first > 0 {
        raise(offset_of!(ListsBand, left_max), diag - first);
        raise(offset_of!(ListsBand, left_min_neg), first - diag);
    } else {
        raise(offset_of!(ListsBand, clipped_left_diag), diag);
    }
    if last < sk - 1 {
        raise(offset_of!(ListsBand, right_max), last - diag);
        raise(offset_of!(ListsBand, right_min_neg), diag - last);
    } else {
        raise(offset_of!(ListsBand, clipped_right_diag_neg), -diag);
    }
}

/// Entry `e` of row `r` of plane `(b, h)`: its key, or `None` for padding (-1) and entries out of
/// range, which also set the error flag.
#[inline(always)]
unsafe fn index_entry(p: &IndicesParams, b: u64, h: u64, r: u32, e: u32) -> Option<u32> {
    let s = p.indices.stride;
    let at = p.indices.ptr + 4 * (b * s[0] + h * s[1] + r as u64 * s[2] + e as u64 * s[3]);
    let key = unsafe { *(at as *const i32) };
    if key < -1 || key >= p.seqlen_k as i32 {
        unsafe { *(p.error as *mut u32) = 1 };
    }
    (key >= 0 && key < p.seqlen_k as i32).then_some(key as u32)
}
