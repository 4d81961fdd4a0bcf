//! Key selection (Flash-DMA's `create_mask`): per row of a bias, the top-k eligible keys (ties to
//! the lower key) or the eligible keys of positive bias, optionally smoothed by a majority vote
//! over key blocks, written as a bool mask, packed bits and/or an ascending index list.
//!
//! One CTA per row. The top-k threshold is found by a radix select on order-preserving keys made
//! from the bias's bits, so no row is sorted: the first 11-bit digit's histogram is taken while
//! the row is loaded, one pass over the row then keeps the keys above the threshold bin and lists
//! those in it (the load step does so already where the CTA's previous row's threshold bin is
//! this row's, as for most rows of one bias), and the remaining digits are found over that
//! short list. Ties at the threshold go to the lowest keys. Rows whose threshold bin holds too
//! many keys (heavily tied biases) take 8-bit passes over the whole row and an ordered count
//! per warp strip instead. The row's
//! eligibility and result live in shared bitmaps, and its radix keys too where they fit.
use crate::arch::*;
use dmattn_abi::{SELECT_FIRST_DIGIT, SELECT_FIXED_WORDS, SELECT_THREADS, SelectParams, View4};

const THREADS: u32 = SELECT_THREADS;
const WARPS: u32 = THREADS / 32;

/// Shared-memory map of a CTA (byte addresses): the histogram, scan sums and broadcast words
/// ([`SELECT_FIXED_WORDS`]), the candidate list (`cand_cap`), the eligibility and kept bitmaps
/// (`row_words` each), the block votes, then the radix-key cache (16-aligned). Each address is
/// computed where used, from constants and parameters, so that none holds a register through
/// the row loop.
#[derive(Clone, Copy)]
struct Smem<'a> {
    p: &'a SelectParams,
}

/// The fixed head of a selection CTA's shared memory ([`SELECT_FIXED_WORDS`]), which the wide
/// selection uses alone: the radix histogram, a block scan's sums, and broadcast words.
#[derive(Clone, Copy)]
pub(crate) struct Scratch;

impl Scratch {
    pub(crate) fn hist(&self) -> u32 {
        smem_base()
    }

    pub(crate) fn sums(&self) -> u32 {
        self.hist() + 4 * (1 << SELECT_FIRST_DIGIT)
    }

    pub(crate) fn misc(&self) -> u32 {
        self.sums() + 4 * 40
    }
}

impl<'a> Smem<'a> {
    fn new(p: &'a SelectParams) -> Self {
        Smem { p }
    }

    fn hist(&self) -> u32 {
        Scratch.hist()
    }

    fn sums(&self) -> u32 {
        Scratch.sums()
    }

    fn misc(&self) -> u32 {
        Scratch.misc()
    }

    fn cands(&self) -> u32 {
        self.sums() + 4 * 48
    }

    fn elig(&self) -> u32 {
        self.hist() + 4 * (SELECT_FIXED_WORDS + self.p.cand_cap)
    }

    fn kept(&self) -> u32 {
        self.elig() + 4 * self.p.row_words
    }

    fn votes(&self) -> u32 {
        self.kept() + 4 * self.p.row_words
    }

    fn cache(&self) -> u32 {
        let p = self.p;
        let vote_words = if p.block == 0 { 0 } else { p.dims[3].div_ceil(p.block).div_ceil(32) };
        (self.votes() + 4 * vote_words).next_multiple_of(16)
    }

    unsafe fn word(&self, map: u32, w: u32) -> u32 {
        unsafe { ld_shared_u32(map + 4 * w) }
    }
}

/// Row `r`'s bias and mask addresses (bytes; the mask's 0 where absent). The key strides are
/// read from the parameters where used rather than held in registers.
#[derive(Clone, Copy)]
pub(crate) struct Row<'a> {
    p: &'a SelectParams,
    bias: u64,
    mask: u64,
}

impl<'a> Row<'a> {
    pub(crate) fn new<const W: u32>(p: &'a SelectParams, r: u64) -> Self {
        let [_, nh, nq, _] = p.dims;
        let q = r % nq as u64;
        let h = (r / nq as u64) % nh as u64;
        let b = r / (nq as u64 * nh as u64);
        let base = |v: &View4| b * v.stride[0] + h * v.stride[1] + q * v.stride[2];
        let bytes = (W / 8) as u64;
        Row { p, bias: p.bias.ptr + bytes * base(&p.bias), mask: if p.mask.ptr == 0 { 0 } else { p.mask.ptr + base(&p.mask) } }
    }

    /// Bytes between keys of the bias.
    fn bias_stride<const W: u32>(&self) -> u64 {
        (W / 8) as u64 * self.p.bias.stride[3]
    }

    /// Bytes between keys of the mask.
    fn mask_stride(&self) -> u64 {
        self.p.mask.stride[3]
    }

    /// The raw bits of key `k`'s bias.
    #[inline(always)]
    unsafe fn raw<const W: u32>(&self, k: u32) -> u32 {
        let at = self.bias + k as u64 * self.bias_stride::<W>();
        if W == 16 { unsafe { ld_global_nc_u16(at) } } else { unsafe { *(at as *const u32) } }
    }

    /// The raw bits of keys `k0..k0 + 8` (those below `sk`; 0 past it) as [`Packed8`], in
    /// 16-byte loads where the bias is contiguous and aligned.
    #[inline(always)]
    pub(crate) unsafe fn raw8<const W: u32>(&self, k0: u32, sk: u32) -> Packed8 {
        let at = self.bias + k0 as u64 * self.bias_stride::<W>();
        let bytes = W / 8;
        if self.bias_stride::<W>() == bytes as u64 && at % 16 == 0 && k0 + 8 <= sk {
            let lo = unsafe { ld_global_nc_v4(at) };
            let hi = if W == 16 { [0; 4] } else { unsafe { ld_global_nc_v4(at + 16) } };
            return core::array::from_fn(|j| if j < 4 { lo[j] } else { hi[j - 4] });
        }
        let raw = |j: u32| if k0 + j < sk { unsafe { self.raw::<W>(k0 + j) } } else { 0 };
        if W == 16 { core::array::from_fn(|j| if j < 4 { raw(2 * j as u32) | raw(2 * j as u32 + 1) << 16 } else { 0 }) } else { core::array::from_fn(|j| raw(j as u32)) }
    }

    /// Bit `j`: key `k0 + j` is below `sk` and shown by the mask (or there is none).
    #[inline(always)]
    pub(crate) unsafe fn shown8(&self, k0: u32, sk: u32) -> u32 {
        let valid = if k0 + 8 <= sk { 0xff } else { (1u32 << sk.saturating_sub(k0)) - 1 };
        if self.mask == 0 {
            return valid;
        }
        let at = self.mask + k0 as u64 * self.mask_stride();
        let mut bits = 0;
        if self.mask_stride() == 1 && at % 8 == 0 && k0 + 8 <= sk {
            let v = unsafe { ld_global_nc_u64(at) };
            for j in 0..8 {
                bits |= (((v >> (8 * j)) & 0xff != 0) as u32) << j;
            }
        } else {
            for j in 0..8 {
                if k0 + j < sk {
                    bits |= ((unsafe { ld_global_nc_u8(at + j as u64 * self.mask_stride()) } != 0) as u32) << j;
                }
            }
        }
        bits & valid
    }
}

/// Eight keys' raw bits as loaded: 16-bit keys two a word in the first four words (so that
/// groups in flight hold half the registers), 32-bit keys one a word.
pub(crate) type Packed8 = [u32; 8];

/// The eight keys of a [`Packed8`], one a word.
#[inline(always)]
fn unpack8<const W: u32>(raw: Packed8) -> [u32; 8] {
    if W == 16 { core::array::from_fn(|j| (raw[j / 2] >> (16 * (j as u32 % 2))) & 0xffff) } else { raw }
}

/// The radix keys ([`order`]) of a [`Packed8`]'s eight keys.
#[inline(always)]
pub(crate) fn radix_keys<const W: u32>(raw: Packed8, inf: u32) -> [u32; 8] {
    let raw = unpack8::<W>(raw);
    core::array::from_fn(|j| order::<W>(raw[j], inf))
}

/// The radix key of a `W`-bit float's bits: unsigned, ordered as the values, NaN above +inf and
/// -0 equal to +0 (their ties then go to the lower key, as `torch.topk`'s do).
#[inline(always)]
pub(crate) fn order<const W: u32>(raw: u32, inf: u32) -> u32 {
    let sign = 1u32 << (W - 1);
    let all = u32::MAX >> (32 - W);
    let mag = raw & (sign - 1);
    if mag > inf {
        all
    } else if mag == 0 {
        sign
    } else if raw & sign != 0 {
        !raw & all
    } else {
        raw | sign
    }
}

/// Whether a radix key stands for a value above zero (NaN is not).
#[inline(always)]
pub(crate) fn positive<const W: u32>(key: u32) -> bool {
    key > 1u32 << (W - 1) && key != u32::MAX >> (32 - W)
}

/// ORs each lane's byte `b` (of keys `8 * lane .. + 8`) into the word of its group of 4 lanes
/// (keys `32 * (lane / 4) ..`), which every lane of the group returns (warp-collective).
#[inline(always)]
fn word_of_bytes(b: u32, lane: u32) -> u32 {
    let v = b << (8 * (lane % 4));
    let v = v | shfl_xor_u32(v, 1);
    v | shfl_xor_u32(v, 2)
}

/// Load step: the row's eligibility bitmap (and, for a relu selection, the kept one), the first
/// digit's histogram (top-k; with a `guess` of the threshold bin, the keys above it kept and
/// those in it listed), its radix keys into the cache where it is on. Eight consecutive
/// keys a thread, two groups of them in flight.
#[inline(always)]
unsafe fn load_row<const W: u32>(p: &SelectParams, s: &Smem, row: &Row, tid: u32, guess: Option<u32>) {
    let sk = p.dims[3];
    let groups = 4 * p.row_words;
    let fetch = |g: u32| if g < groups { unsafe { (row.shown8(8 * g, sk), row.raw8::<W>(8 * g, sk)) } } else { (0, [0; 8]) };
    let mut start = 0;
    while start < groups {
        let (g0, g1) = (start + tid, start + THREADS + tid);
        let (a, b) = (fetch(g0), fetch(g1));
        unsafe {
            load_group::<W>(p, s, tid, g0, groups, a, guess);
            load_group::<W>(p, s, tid, g1, groups, b, guess);
        }
        start += 2 * THREADS;
    }
}

/// One thread's group `g` of the load step, from its fetched (shown bits, raw bits) (collective
/// over the warp).
#[inline(always)]
unsafe fn load_group<const W: u32>(p: &SelectParams, s: &Smem, tid: u32, g: u32, groups: u32, (shown, raw): (u32, Packed8), guess: Option<u32>) {
    let (mut pos, mut above, mut inside) = (0, 0, 0);
    if g < groups {
        let keys = radix_keys::<W>(raw, p.inf_bits);
        for (j, &key) in keys.iter().enumerate() {
            pos |= (positive::<W>(key) as u32) << j;
            if p.k != 0 && shown >> j & 1 != 0 {
                unsafe { atom_add_shared_u32(s.hist() + 4 * (key >> (W - SELECT_FIRST_DIGIT)), 1) };
            }
        }
        if let Some(bin) = guess {
            (above, inside) = split::<W>(&keys, shown, bin);
        }
        if p.cached != 0 {
            unsafe { store_keys::<W>(s.cache(), 8 * g, &keys) };
        }
    }
    let lane = tid % 32;
    let elig = word_of_bytes(shown, lane);
    // Top-k with a guess: the keys above the guessed bin (a relu selection: the positive ones).
    let kept = word_of_bytes(if p.k == 0 { shown & pos } else { above }, lane);
    if g < groups && lane % 4 == 0 {
        unsafe { st_shared_u32(s.elig() + 4 * (g / 4), elig) };
        if p.k == 0 || guess.is_some() {
            unsafe { st_shared_u32(s.kept() + 4 * (g / 4), kept) };
        }
    }
    if guess.is_some() {
        unsafe { list_keys(p, s, lane, g, inside) };
    }
}

/// Bits of a group's shown keys whose first digit is above `bin`, and of those in it.
#[inline(always)]
fn split<const W: u32>(keys: &[u32; 8], shown: u32, bin: u32) -> (u32, u32) {
    let (mut above, mut inside) = (0, 0);
    for (j, &key) in keys.iter().enumerate() {
        let d = key >> (W - SELECT_FIRST_DIGIT);
        above |= ((d > bin) as u32) << j;
        inside |= ((d == bin) as u32) << j;
    }
    (above & shown, inside & shown)
}

/// Appends this lane's keys of group `g` flagged in `inside` (bit `j`: key `8g + j`) to the
/// candidate list, up to `p.cand_cap` entries (the count at `s.misc() + 8` goes on past it)
/// (warp-collective).
#[inline(always)]
unsafe fn list_keys(p: &SelectParams, s: &Smem, lane: u32, g: u32, inside: u32) {
    let n = inside.count_ones();
    // Warp-uniform: most groups hold no listed key.
    if ballot(n != 0) != 0 {
        let incl = warp_scan(n, lane);
        let base = if lane == 31 { unsafe { atom_add_shared_u32(s.misc() + 8, incl) } } else { 0 };
        let mut at = shfl_idx_u32(base, 31) + incl - n;
        for j in 0..8 {
            if inside >> j & 1 != 0 {
                if at < p.cand_cap {
                    unsafe { st_shared_u32(s.cands() + 4 * at, 8 * g + j) };
                }
                at += 1;
            }
        }
    }
}

#[inline(always)]
unsafe fn store_keys<const W: u32>(cache: u32, k0: u32, keys: &[u32; 8]) {
    if W == 16 {
        let v = core::array::from_fn(|j| keys[2 * j] | (keys[2 * j + 1] << 16));
        unsafe { st_shared_v4(cache + 2 * k0, v) };
    } else {
        unsafe {
            st_shared_v4(cache + 4 * k0, [keys[0], keys[1], keys[2], keys[3]]);
            st_shared_v4(cache + 4 * k0 + 16, [keys[4], keys[5], keys[6], keys[7]]);
        }
    }
}

/// Key `k`'s radix key: from the cache, or the bias again.
#[inline(always)]
unsafe fn key_at<const W: u32>(p: &SelectParams, s: &Smem, row: &Row, k: u32) -> u32 {
    if p.cached != 0 {
        if W == 16 { unsafe { ld_shared_u16(s.cache() + 2 * k) } } else { unsafe { ld_shared_u32(s.cache() + 4 * k) } }
    } else {
        order::<W>(unsafe { row.raw::<W>(k) }, p.inf_bits)
    }
}

/// Radix keys of keys `8g .. 8g + 8`: from the cache, or the bias again (0 past `sk`).
#[inline(always)]
unsafe fn keys8<const W: u32>(p: &SelectParams, s: &Smem, row: &Row, g: u32) -> [u32; 8] {
    if p.cached != 0 {
        if W == 16 {
            let v = unsafe { ld_shared_v4(s.cache() + 16 * g) };
            core::array::from_fn(|j| (v[j / 2] >> (16 * (j as u32 % 2))) & 0xffff)
        } else {
            let (lo, hi) = unsafe { (ld_shared_v4(s.cache() + 32 * g), ld_shared_v4(s.cache() + 32 * g + 16)) };
            core::array::from_fn(|j| if j < 4 { lo[j] } else { hi[j - 4] })
        }
    } else {
        // `radix_keys` spelled out: through it the f32 kernel's code came out reordered.
        let raw = unpack8::<W>(unsafe { row.raw8::<W>(8 * g, p.dims[3]) });
        core::array::from_fn(|j| order::<W>(raw[j], p.inf_bits))
    }
}

/// Radix-select step over the whole row, for more than `p.k` eligible keys: the radix key `t`
/// of the `k`-th largest eligible key and how many keys equal to `t` are taken (the rest of `k`).
#[inline(always)]
unsafe fn threshold<const W: u32>(p: &SelectParams, s: &Smem, row: &Row, tid: u32) -> (u32, u32) {
    let sk = p.dims[3];
    let (mut prefix, mut need) = (0u32, p.k);
    let mut pass = 0;
    while pass < W / 8 {
        let shift = W - 8 * (pass + 1);
        unsafe { clear_hist(&Scratch, 256, tid) };
        sync_threads();
        let mut k = tid;
        while k < sk {
            if unsafe { s.word(s.elig(), k / 32) } >> (k % 32) & 1 != 0 {
                let key = unsafe { key_at::<W>(p, s, row, k) };
                // The keys that share the digits found so far (all of them in the first pass).
                if pass == 0 || key >> (shift + 8) == prefix {
                    unsafe { atom_add_shared_u32(s.hist() + 4 * ((key >> shift) & 0xff), 1) };
                }
            }
            k += THREADS;
        }
        sync_threads();
        let (digit, left, _) = unsafe { find_digit(&Scratch, 256, need, tid) };
        (prefix, need) = ((prefix << 8) | digit, left);
        pass += 1;
    }
    (prefix, need)
}

/// This warp's strip of bitmap words: `[first, end)`.
#[inline(always)]
fn strip(p: &SelectParams, warp: u32) -> (u32, u32) {
    let per = p.row_words.div_ceil(WARPS);
    ((warp * per).min(p.row_words), ((warp + 1) * per).min(p.row_words))
}

/// Block-wide exclusive prefix over warps of a per-warp count every lane holds (collective).
#[inline(always)]
fn warp_offsets(count: u32, tid: u32, sums: u32) -> (u32, u32) {
    // Only lane 31 contributes, so every lane's exclusive prefix is the earlier warps' sum.
    block_scan::<THREADS>(if tid % 32 == 31 { count } else { 0 }, tid, sums)
}

/// Top-k step: the kept bitmap from the threshold, the ties at it taken lowest key first.
#[inline(always)]
unsafe fn take_top<const W: u32>(p: &SelectParams, s: &Smem, row: &Row, tid: u32, t: u32, need: u32) {
    let (lane, (first, end)) = (tid % 32, strip(p, tid / 32));
    // (eligible, radix key) of this lane's key of word `w`; keys past `sk` are never eligible
    // and not read.
    let key = |w: u32| {
        let e = unsafe { s.word(s.elig(), w) } >> lane & 1 != 0;
        (e, if e { unsafe { key_at::<W>(p, s, row, 32 * w + lane) } } else { 0 })
    };
    let mut ties = 0;
    for w in first..end {
        let (e, k) = key(w);
        ties += ballot(e && k == t).count_ones();
    }
    let (mut before, _) = warp_offsets(ties, tid, s.sums());
    for w in first..end {
        let (e, k) = key(w);
        let tie = ballot(e && k == t);
        let rank = before + (tie & ((1u32 << lane) - 1)).count_ones();
        let kept = ballot(e && (k > t || (k == t && rank < need)));
        if lane == 0 {
            unsafe { st_shared_u32(s.kept() + 4 * w, kept) };
        }
        before += tie.count_ones();
    }
}

/// Smoothing step: each block of `p.block` keys takes its majority (more than half of its keys
/// kept), ANDed with the eligibility.
#[inline(always)]
unsafe fn smooth(p: &SelectParams, s: &Smem, tid: u32) {
    let (sk, bs) = (p.dims[3], p.block);
    let blocks = sk.div_ceil(bs);
    let mut start = 0;
    while start < blocks {
        let b = start + tid;
        let mut vote = false;
        if b < blocks {
            let (lo, hi) = (b * bs, ((b + 1) * bs).min(sk));
            let mut n = 0;
            let mut k = lo;
            while k < hi {
                let (w, at) = (k / 32, k % 32);
                let span = (32 - at).min(hi - k);
                let bits = unsafe { s.word(s.kept(), w) } >> at;
                n += if span == 32 { bits } else { bits & ((1 << span) - 1) }.count_ones();
                k += span;
            }
            vote = 2 * n > hi - lo;
        }
        let votes = ballot(vote);
        if b < blocks && tid % 32 == 0 {
            unsafe { st_shared_u32(s.votes() + 4 * (b / 32), votes) };
        }
        start += THREADS;
    }
    sync_threads();
    let mut w = tid;
    while w < p.row_words {
        let mut word = 0;
        for j in 0..32 {
            let b = (32 * w + j) / bs;
            if b < blocks {
                word |= (unsafe { s.word(s.votes(), b / 32) } >> (b % 32) & 1) << j;
            }
        }
        unsafe { st_shared_u32(s.kept() + 4 * w, word & s.word(s.elig(), w)) };
        w += THREADS;
    }
}

/// Four keys' kept bits (`nibble`, the first key lowest) as their four bool bytes.
#[inline(always)]
pub(crate) fn mask_bytes(nibble: u32) -> u32 {
    (nibble & 1) | (nibble >> 1 & 1) << 8 | (nibble >> 2 & 1) << 16 | (nibble >> 3) << 24
}

/// Output step: the kept bitmap as the outputs asked for.
#[inline(always)]
unsafe fn write_row(p: &SelectParams, s: &Smem, r: u64, tid: u32) {
    let sk = p.dims[3];
    if p.out_mask != 0 {
        let out = p.out_mask + r * sk as u64;
        if sk % 4 == 0 {
            let mut n = tid;
            while n < sk / 4 {
                let nibble = unsafe { s.word(s.kept(), n / 8) } >> (4 * (n % 8)) & 0xf;
                unsafe { *((out + 4 * n as u64) as *mut u32) = mask_bytes(nibble) };
                n += THREADS;
            }
        } else {
            let mut k = tid;
            while k < sk {
                unsafe { *((out + k as u64) as *mut u8) = (s.word(s.kept(), k / 32) >> (k % 32) & 1) as u8 };
                k += THREADS;
            }
        }
    }
    if p.out_bits != 0 {
        let mut w = tid;
        while w < p.row_words {
            unsafe { *((p.out_bits + 4 * (r * p.row_words as u64 + w as u64)) as *mut u32) = s.word(s.kept(), w) };
            w += THREADS;
        }
    }
    if p.out_indices != 0 {
        // A run of words a thread: their kept counts scanned, then each thread writes its keys.
        let per = p.row_words.div_ceil(THREADS);
        let first = (tid * per).min(p.row_words);
        let end = (first + per).min(p.row_words);
        let mut count = 0;
        for w in first..end {
            count += unsafe { s.word(s.kept(), w) }.count_ones();
        }
        let (mut at, total) = block_scan::<THREADS>(count, tid, s.sums());
        let out = p.out_indices + 4 * r * p.width as u64;
        for w in first..end {
            let mut bits = unsafe { s.word(s.kept(), w) };
            while bits != 0 {
                if at < p.width {
                    unsafe { *((out + 4 * at as u64) as *mut i32) = (32 * w + bits.trailing_zeros()) as i32 };
                }
                at += 1;
                bits &= bits - 1;
            }
        }
        let mut e = total + tid;
        while e < p.width {
            unsafe { *((out + 4 * e as u64) as *mut i32) = -1 };
            e += THREADS;
        }
    }
}

/// Zeroes the first `bins` words of the histogram (collective, no barrier).
#[inline(always)]
pub(crate) unsafe fn clear_hist(s: &Scratch, bins: u32, tid: u32) {
    let mut b = tid;
    while b < bins {
        unsafe { st_shared_u32(s.hist() + 4 * b, 0) };
        b += THREADS;
    }
}

/// The digit (of `bins`, counts in `s.hist()`) holding the `need`-th largest key, and how many of
/// its keys are taken; with the total counted (collective; the digit is meaningful only when
/// `need` <= total).
#[inline(always)]
pub(crate) unsafe fn find_digit(s: &Scratch, bins: u32, need: u32, tid: u32) -> (u32, u32, u32) {
    // Thread t holds `per` bins from the top, t-th in descending order.
    let per = bins.div_ceil(THREADS);
    let count = |i: u32| {
        let at = tid * per + i;
        if at < bins { unsafe { ld_shared_u32(s.hist() + 4 * (bins - 1 - at)) } } else { 0 }
    };
    let mut mine = 0;
    for i in 0..per {
        mine += count(i);
    }
    let (mut above, total) = block_scan::<THREADS>(mine, tid, s.sums());
    if above < need && need <= above + mine {
        for i in 0..per {
            let x = count(i);
            if need <= above + x {
                unsafe {
                    st_shared_u32(s.misc(), bins - 1 - (tid * per + i));
                    st_shared_u32(s.misc() + 4, need - above);
                }
                break;
            }
            above += x;
        }
    }
    sync_threads();
    let r = unsafe { (ld_shared_u32(s.misc()), ld_shared_u32(s.misc() + 4), total) };
    sync_threads();
    r
}

/// Classify step: the keys above the first digit's threshold bin `bin` kept, those in it listed
/// (up to `p.cand_cap`); returns how many are in it (collective). Eight consecutive keys
/// a thread.
#[inline(always)]
unsafe fn classify<const W: u32>(p: &SelectParams, s: &Smem, row: &Row, tid: u32, bin: u32) -> u32 {
    if tid == 0 {
        unsafe { st_shared_u32(s.misc() + 8, 0) };
    }
    sync_threads();
    let lane = tid % 32;
    let groups = 4 * p.row_words;
    let mut start = 0;
    while start < groups {
        let g = start + tid;
        let (mut above, mut inside) = (0u32, 0u32);
        if g < groups {
            let elig = (unsafe { s.word(s.elig(), g / 4) } >> (8 * (g % 4))) & 0xff;
            if elig != 0 {
                let keys = unsafe { keys8::<W>(p, s, row, g) };
                (above, inside) = split::<W>(&keys, elig, bin);
            }
        }
        let word = word_of_bytes(above, lane);
        if g < groups && lane % 4 == 0 {
            unsafe { st_shared_u32(s.kept() + 4 * (g / 4), word) };
        }
        unsafe { list_keys(p, s, lane, g, inside) };
        start += THREADS;
    }
    sync_threads();
    unsafe { ld_shared_u32(s.misc() + 8) }
}

/// Refine step over the `n` listed keys of the first digit's bin `bin` (`need` of them taken):
/// the remaining digits, then the listed keys taken set in the kept bitmap. Returns `false`
/// (nothing set) where more than 64 keys tie at the threshold and only some are taken: their
/// order then needs the whole-row pass (collective).
#[inline(always)]
unsafe fn refine<const W: u32>(p: &SelectParams, s: &Smem, row: &Row, tid: u32, bin: u32, need: u32, n: u32) -> bool {
    let key = |c: u32| unsafe { key_at::<W>(p, s, row, ld_shared_u32(s.cands() + 4 * c)) };
    let (mut t, mut need) = (bin, need);
    let mut shift = W - SELECT_FIRST_DIGIT;
    while shift > 0 {
        let width = if shift < SELECT_FIRST_DIGIT { shift } else { SELECT_FIRST_DIGIT };
        shift -= width;
        let bins = 1u32 << width;
        unsafe { clear_hist(&Scratch, bins, tid) };
        sync_threads();
        let mut c = tid;
        while c < n {
            let k = key(c);
            if k >> (shift + width) == t {
                unsafe { atom_add_shared_u32(s.hist() + 4 * ((k >> shift) & (bins - 1)), 1) };
            }
            c += THREADS;
        }
        sync_threads();
        let (d, left, _) = unsafe { find_digit(&Scratch, bins, need, tid) };
        (t, need) = ((t << width) | d, left);
    }
    // The listed keys equal to `t`: all taken, or the `need` lowest.
    let mut c = tid;
    let mut mine = 0;
    while c < n {
        mine += (key(c) == t) as u32;
        c += THREADS;
    }
    let (_, ties) = block_scan::<THREADS>(mine, tid, s.sums());
    if need < ties && ties > 64 {
        return false;
    }
    if need < ties {
        // The tied keys' indices, in any order, into the histogram's words (done with): each
        // tied key's rank is then the count of lower ones among at most 64.
        if tid == 0 {
            unsafe { st_shared_u32(s.misc() + 12, 0) };
        }
        sync_threads();
        let mut c = tid;
        while c < n {
            if key(c) == t {
                let at = unsafe { atom_add_shared_u32(s.misc() + 12, 1) };
                unsafe { st_shared_u32(s.hist() + 4 * at, ld_shared_u32(s.cands() + 4 * c)) };
            }
            c += THREADS;
        }
        sync_threads();
    }
    let mut c = tid;
    while c < n {
        let (k, j) = (key(c), unsafe { ld_shared_u32(s.cands() + 4 * c) });
        let mut take = k > t;
        if k == t {
            let mut rank = 0;
            if need < ties {
                for o in 0..ties {
                    rank += (unsafe { ld_shared_u32(s.hist() + 4 * o) } < j) as u32;
                }
            }
            take = rank < need;
        }
        if take {
            unsafe { atom_or_shared_u32(s.kept() + 4 * (j / 32), 1 << (j % 32)) };
        }
        c += THREADS;
    }
    true
}

/// Top-k step: the kept bitmap of the `p.k` largest eligible keys (histogram of the first digit
/// taken by the load step, and where it had a guess, the keys above the guessed bin kept and
/// those in it listed).
/// Returns the threshold bin (`None` where every eligible key is kept).
#[inline(always)]
unsafe fn top_k<const W: u32>(p: &SelectParams, s: &Smem, row: &Row, tid: u32, guess: Option<u32>) -> Option<u32> {
    let (bin, need, total) = unsafe { find_digit(&Scratch, 1 << SELECT_FIRST_DIGIT, p.k, tid) };
    if total <= p.k {
        let mut w = tid;
        while w < p.row_words {
            unsafe { st_shared_u32(s.kept() + 4 * w, s.word(s.elig(), w)) };
            w += THREADS;
        }
        return None;
    }
    let listed = unsafe { ld_shared_u32(s.misc() + 8) };
    // The load's list serves where it guessed the threshold bin (and did not overflow). Nothing
    // writes the count before the classify pass resets it, so every thread takes the same
    // branch; the barrier lets every thread read the count before that reset.
    let n = if guess == Some(bin) && listed <= p.cand_cap {
        listed
    } else {
        sync_threads();
        unsafe { classify::<W>(p, s, row, tid, bin) }
    };
    if n <= p.cand_cap && unsafe { refine::<W>(p, s, row, tid, bin, need, n) } {
        return Some(bin);
    }
    // Heavily tied rows: 8-bit passes over the whole row, and the ordered tie count.
    let (t, need) = unsafe { threshold::<W>(p, s, row, tid) };
    unsafe { take_top::<W>(p, s, row, tid, t, need) };
    Some(bin)
}

/// Grid-stride over rows, [`SELECT_THREADS`] threads; dynamic shared memory as [`Smem`] lays it
/// out.
#[inline(always)]
pub unsafe fn select_keys<const W: u32>(p: &SelectParams) {
    let s = Smem::new(p);
    let rows = p.dims[0] as u64 * p.dims[1] as u64 * p.dims[2] as u64;
    let mut r = block_idx().0 as u64;
    // The previous row's threshold bin, the next row's guess (CTA-uniform): where the guess
    // holds (most rows of one bias), the load step has kept the keys above it and listed
    // those in it, and no classify pass reads the row again.
    let mut guess = None;
    while r < rows {
        // Per-thread values (bitmap strips, output runs) computed each row, not held through
        // the loop.
        let tid = thread_idx_here();
        let row = Row::new::<W>(p, r);
        if p.k != 0 {
            unsafe { clear_hist(&Scratch, 1 << SELECT_FIRST_DIGIT, tid) };
            if tid == 0 {
                unsafe { st_shared_u32(s.misc() + 8, 0) };
            }
            sync_threads();
        }
        unsafe { load_row::<W>(p, &s, &row, tid, guess) };
        sync_threads();
        if p.k != 0 {
            if let Some(bin) = unsafe { top_k::<W>(p, &s, &row, tid, guess) } {
                guess = Some(bin);
            }
            sync_threads();
        }
        if p.block != 0 {
            unsafe { smooth(p, &s, tid) };
            sync_threads();
        }
        unsafe { write_row(p, &s, r, tid) };
        // The next row rewrites the bitmaps.
        sync_threads();
        r += grid_dim_x() as u64;
    }
}
