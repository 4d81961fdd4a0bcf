//! Prepares a boolean mask for the attention kernels, reading it once: each 64x64 block gets a
//! class (empty, partial, full: the tile-skip decision) and each row's 64 keys of the block are
//! packed into one u64 in the MMA accumulator order (`dmattn_abi::mask_bit`), so a kernel reads
//! one bit per score instead of one byte, one 16-bit load per row and tile per thread.
use crate::arch::*;
use crate::seq::Seq;
use dmattn_abi::{BLOCK_MAP_K, BLOCK_MAP_Q, MASK_PACK_BITS_THREADS, MASK_PACK_KEYS_WORDS, MASK_PACK_THREADS, MaskPackParams, MaskSeqsParams, View4, block_class, mask_bit, mask_bits_of_bytes, mask_word_of_bits};

/// Grid `(k_blocks, q_blocks, mask_batch * mask_heads)`, `MASK_PACK_THREADS` threads: four
/// adjacent lanes share a row, each reading a 16-key strip. Out-of-range elements count for
/// neither class and pack as 0. A packed batch's CTAs past their sequence's blocks return. Bool
/// bytes only: bits given packed go to [`mask_pack_bits`].
#[inline(always)]
pub unsafe fn mask_pack(p: &MaskPackParams) {
    const KEYS_PER_THREAD: u32 = BLOCK_MAP_Q * BLOCK_MAP_K / MASK_PACK_THREADS;
    const THREADS_PER_ROW: u32 = BLOCK_MAP_K / KEYS_PER_THREAD;
    const { assert!(THREADS_PER_ROW == 4 && KEYS_PER_THREAD == 16) };
    let tid = thread_idx();
    let (kb, qb, bh) = block_idx();
    let [_, heads, mq, sk] = p.dims;
    let (b, h) = (bh / heads, (bh % heads) as u64);
    let seq = Seq::in_batch::<true>(&p.seqs, b, mq, sk);
    let (rows, keys) = (if p.seq_rows != 0 { seq.len_q } else { mq }, seq.len_k);
    if qb * BLOCK_MAP_Q >= rows || kb * BLOCK_MAP_K >= keys {
        return;
    }
    let s = p.mask.stride;
    let row = qb * BLOCK_MAP_Q + tid / THREADS_PER_ROW;
    let k0 = (tid % THREADS_PER_ROW) * KEYS_PER_THREAD;
    let (mut any, mut all, mut word) = (false, true, 0u64);
    if row < rows {
        let base = p.mask.ptr + seq.origin(&s) + h * s[1] + row as u64 * s[2];
        let first = kb * BLOCK_MAP_K + k0;
        let strip = base + first as u64 * s[3];
        // A contiguous, aligned strip inside the keys is one 16-byte load, packed four keys per
        // word operation (byte loads and per-key tests kept this kernel compute-bound at a third
        // of the copy bandwidth); anything else goes byte by byte.
        if s[3] == 1 && strip % 16 == 0 && kb * BLOCK_MAP_K + k0 + KEYS_PER_THREAD <= keys {
            let words = unsafe { ld_global_nc_v4(strip) };
            for (i, &x) in words.iter().enumerate() {
                let bits = mask_bits_of_bytes(x, k0 + 4 * i as u32);
                any |= bits != 0;
                all &= bits.count_ones() == 4;
                word |= bits;
            }
        } else {
            for j in 0..KEYS_PER_THREAD {
                let k = k0 + j;
                if kb * BLOCK_MAP_K + k < keys {
                    let v = unsafe { ld_global_nc_u8(strip + j as u64 * s[3]) } != 0;
                    any |= v;
                    all &= v;
                    word |= (v as u64) << mask_bit(k);
                }
            }
        }
    }
    for lanes in [1, 2] {
        let lo = shfl_xor_u32(word as u32, lanes);
        let hi = shfl_xor_u32((word >> 32) as u32, lanes);
        word |= (hi as u64) << 32 | lo as u64;
    }
    if tid % THREADS_PER_ROW == 0 && row < rows {
        let o = &p.bits;
        let at = seq.origin(&o.stride) + h * o.stride[1] + row as u64 * o.stride[2] + kb as u64;
        unsafe { *(o.ptr as *mut u64).add(at as usize) = word };
    }
    let any = sync_threads_or(any);
    let all = sync_threads_and(all);
    if tid == 0 {
        let c = &p.classes;
        let at = seq.origin(&c.stride) + h * c.stride[1] + qb as u64 * c.stride[2] + kb as u64;
        unsafe { *(c.ptr as *mut u8).add(at as usize) = block_class::of(any, all) };
    }
}

/// [`mask_pack`] for a mask given as bits (fixed lengths): a thread a 64-key word down
/// the block's rows, so that a warp reads 32 consecutive words of a row (256 contiguous bytes)
/// and keeps its block's class in registers; each word's bits move to [`mask_bit`] order in a few
/// word operations. Grid `(ceil(k_blocks / MASK_PACK_BITS_THREADS), q_blocks, mb * mh)`. (As a
/// byte pair per thread in [`mask_pack`]'s 256-thread block per 64x64 block it took a millisecond
/// for the 128 MiB of a 32K x 32K mask.)
#[inline(always)]
pub unsafe fn mask_pack_bits(p: &MaskPackParams) {
    const ROUND: u32 = 8;
    let (x, qb, bh) = block_idx();
    let kb = x * MASK_PACK_BITS_THREADS + thread_idx();
    let [_, heads, mq, sk] = p.dims;
    if kb * BLOCK_MAP_K >= sk {
        return;
    }
    let (b, h) = (bh / heads, (bh % heads) as u64);
    let (s, o) = (p.mask.stride, &p.bits);
    let row0 = qb * BLOCK_MAP_Q;
    let rows = (mq - row0).min(BLOCK_MAP_Q);
    let valid = (sk - kb * BLOCK_MAP_K).min(64);
    let full = if valid == 64 { u64::MAX } else { (1 << valid) - 1 };
    // Whole words as two 4-byte loads where every row starts 4-byte aligned; the last, partial
    // word (and unaligned rows) byte by byte, reading no byte past the row's keys.
    let words = valid == 64 && (p.mask.ptr | s[0] | s[1] | s[2]) % 4 == 0;
    let src = p.mask.ptr + b as u64 * s[0] + h * s[1] + row0 as u64 * s[2] + 8 * kb as u64;
    let dst = (o.ptr as *mut u64).wrapping_add((b as u64 * o.stride[0] + h * o.stride[1] + row0 as u64 * o.stride[2] + kb as u64) as usize);
    let (mut any, mut all) = (false, true);
    let mut r0 = 0;
    while r0 < rows {
        // A round's loads issued together, before any store (which might alias them).
        let mut got = [0u64; ROUND as usize];
        for (i, g) in got.iter_mut().enumerate() {
            let r = r0 + i as u32;
            if r < rows {
                let at = src + r as u64 * s[2];
                *g = if words {
                    unsafe { ld_global_nc_u32(at) as u64 | (ld_global_nc_u32(at + 4) as u64) << 32 }
                } else {
                    (0..valid.div_ceil(8)).fold(0, |w, i| w | (unsafe { ld_global_nc_u8(at + i as u64) } as u64) << (8 * i)) & full
                };
            }
        }
        for (i, &bits) in got.iter().enumerate() {
            let r = r0 + i as u32;
            if r < rows {
                any |= bits != 0;
                all &= bits == full;
                unsafe { *dst.add((r as u64 * o.stride[2]) as usize) = mask_word_of_bits(bits) };
            }
        }
        r0 += ROUND;
    }
    let c = &p.classes;
    let at = b as u64 * c.stride[0] + h * c.stride[1] + qb as u64 * c.stride[2] + kb as u64;
    unsafe { *(c.ptr as *mut u8).add(at as usize) = block_class::of(any, all) };
}

/// [`mask_pack`] for a key-side mask (one row per batch entry or sequence and head, `dims[2]`
/// 1, bool bytes; a fixed-length call's where `seqs` holds no prefix sums): a warp per 64-key
/// word of every head, [`MASK_PACK_KEYS_WORDS`] words in turn. Lane `l` reads the two keys whose
/// bits are `l` and `32 + l` of a word in [`mask_bit`] order, for eight heads at once (a load a
/// key where its eight heads' bytes lie side by side, else a load a byte), and one
/// ballot per head and half gives the word with no shuffles; lanes 0-7 write the eight heads'
/// words and block classes. Grid `(ceil(k_blocks / (warps * words)), 1, mask_batch)`,
/// [`MASK_PACK_THREADS`] threads.
///
/// Why: a warp per word of one head did two byte loads a lane and left the loads of a
/// `[total_k, heads]` mask 8 bytes apart for each head's warp; the 64 packed sequences of the
/// decode batch (2.1M keys, 8 heads: 17 MB) took 96 us at 3.7 % of the DRAM bandwidth (H200,
/// ncu), more than a sixth of the call.
#[inline(always)]
pub unsafe fn mask_pack_keys(p: &MaskPackParams) {
    const HEADS: u32 = 8;
    let tid = thread_idx();
    let (bx, _, b) = block_idx();
    let [_, heads, mq, sk] = p.dims;
    let seq = Seq::in_batch::<true>(&p.seqs, b, mq, sk);
    let (lane, warp, warps) = (tid % 32, tid / 32, MASK_PACK_THREADS / 32);
    // Key `lane`'s place in the word: bit `lane` is key `8 nt + 2 t + e` with `(t, nt, e) =
    // (lane / 16, (lane % 16) / 2, lane % 2)`; bit `32 + lane` is that key plus 4.
    let key = 8 * ((lane % 16) / 2) + 2 * (lane / 16) + lane % 2;
    let s = p.mask.stride;
    let (o, c) = (&p.bits, &p.classes);
    let base = p.mask.ptr + seq.origin(&s);
    // A key's heads side by side in whole rounds of eight, 8-byte aligned (the `[total_k, 8 n]`
    // mask of a call's every kv head): a round's eight bytes of a key in one load (H100, decode
    // batch, 8 heads, 17 MB: 23 us with a byte a load, 18 us so; with every word's loads issued
    // together, 88 registers, 26 us).
    let wide = heads % HEADS == 0 && s[1] == 1 && s[3] % 8 == 0 && base % 8 == 0;
    for w in 0..MASK_PACK_KEYS_WORDS {
        let kb = (bx * MASK_PACK_KEYS_WORDS + w) * warps + warp;
        let first = kb * BLOCK_MAP_K;
        // Warp-uniform: every lane of a warp has the same word.
        if first >= seq.len_k {
            return;
        }
        let valid = (seq.len_k - first).min(BLOCK_MAP_K);
        let (k0, k1) = (first + key, first + key + 4);
        let mut h0 = 0;
        while h0 < heads {
            // The round's loads issued together, then the ballots: unconditional, from addresses
            // clamped into the mask (a key or head past its end reads the last one's and counts
            // as hidden), so that nothing branches between them.
            let mut bytes = [[0u32; 2]; HEADS as usize];
            if wide {
                for e in 0..2 {
                    let k = if e == 0 { k0 } else { k1 };
                    let eight = unsafe { ld_global_nc_u64(base + h0 as u64 + k.min(seq.len_k - 1) as u64 * s[3]) };
                    let eight = if k < seq.len_k { eight } else { 0 };
                    for (i, pair) in bytes.iter_mut().enumerate() {
                        pair[e] = (eight >> (8 * i)) as u32 & 0xff;
                    }
                }
            } else {
                for (i, pair) in bytes.iter_mut().enumerate() {
                    let h = h0 + i as u32;
                    let at = base + h.min(heads - 1) as u64 * s[1];
                    for e in 0..2 {
                        let k = if e == 0 { k0 } else { k1 };
                        let byte = unsafe { ld_global_nc_u8(at + k.min(seq.len_k - 1) as u64 * s[3]) };
                        pair[e] = if h < heads && k < seq.len_k { byte } else { 0 };
                    }
                }
            }
            let mut mine = 0u64;
            for (i, pair) in bytes.iter().enumerate() {
                let word = ballot(pair[0] != 0) as u64 | (ballot(pair[1] != 0) as u64) << 32;
                if lane == i as u32 {
                    mine = word;
                }
            }
            let h = h0 + lane;
            if lane < HEADS && h < heads {
                let h = h as u64;
                unsafe {
                    *(o.ptr as *mut u64).add((seq.origin(&o.stride) + h * o.stride[1] + kb as u64) as usize) = mine;
                    let full = mine.count_ones() == valid;
                    *(c.ptr as *mut u8).add((seq.origin(&c.stride) + h * c.stride[1] + kb as u64) as usize) = block_class::of(mine != 0, full);
                }
            }
            h0 += HEADS;
        }
    }
}

/// A mask prepared per sequence, laid out for a packed batch (`MaskSeqsParams`): grid `(x, ph,
/// sequences)`, `MASK_PACK_THREADS` threads striding over the sequence's rows' words, then over
/// its block rows' classes. A preparation step: plain loads and stores.
#[inline(always)]
pub unsafe fn mask_to_seqs(p: &MaskSeqsParams) {
    let (bx, h, b) = block_idx();
    let seq = Seq::in_batch::<true>(&p.seqs, b, 0, 0);
    let (first, step) = ((bx * MASK_PACK_THREADS + thread_idx()) as u64, (grid_dim_x() * MASK_PACK_THREADS) as u64);
    let words = p.words as u64;
    // Element `e` of the sequence's `rows x words`: (source, destination) element offsets.
    let at = |src: &View4, dst: &View4, e: u64| {
        let (r, w) = (e / words, e % words);
        let s = &src.stride;
        let from = b as u64 * s[0] + h as u64 * s[1] + r * s[2] + w * s[3];
        (from, seq.origin(&dst.stride) + h as u64 * dst.stride[1] + r * dst.stride[2] + w)
    };
    if p.bits.ptr != 0 {
        let mut e = first;
        while e < seq.len_q as u64 * words {
            let (from, to) = at(&p.src_bits, &p.bits, e);
            unsafe { *(p.bits.ptr as *mut u64).add(to as usize) = ld_global_nc_u64(p.src_bits.ptr + 8 * from) };
            e += step;
        }
    }
    let mut e = first;
    while e < seq.len_q.div_ceil(BLOCK_MAP_Q) as u64 * words {
        let (from, to) = at(&p.src_classes, &p.classes, e);
        unsafe { *(p.classes.ptr as *mut u8).add(to as usize) = ld_global_nc_u8(p.src_classes.ptr + from) as u8 };
        e += step;
    }
}
