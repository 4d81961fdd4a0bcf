//! Wide key selection: `select`'s selection (top-k or relu, no block smoothing) for rows too few
//! to fill the GPU one CTA a row, or too long for a CTA's shared memory. A row is cut into
//! chunks, a CTA each (a 32-key word a thread), over a few launches: a radix histogram a digit
//! of the top-k threshold, a tally of each chunk's kept keys and keys at the threshold, then
//! the outputs; or all of them in one cooperative launch, a grid barrier between the steps. Each
//! CTA finds what the steps before settled (the threshold's digits, the earlier chunks' tallies)
//! from the row's workspace itself, so no step waits on a last CTA and every result is the same
//! whatever order CTAs run in.
use crate::arch::*;
use crate::select::{Packed8, Row, Scratch, clear_hist, find_digit, mask_bytes, positive, radix_keys};
use dmattn_abi::{
    SELECT_FIRST_DIGIT, SELECT_THREADS, SELECT_WIDE_ALL, SELECT_WIDE_COUNT, SELECT_WIDE_ROW_WORDS, SELECT_WIDE_TALLY, SELECT_WIDE_THREADS, SELECT_WIDE_WRITE, SelectParams,
    SelectWideParams, select_digit, select_digits,
};

const THREADS: u32 = SELECT_WIDE_THREADS;
// `clear_hist` and `find_digit` stride by the one-row kernel's block.
const _: () = assert!(SELECT_WIDE_THREADS == SELECT_THREADS);
// The cooperative path spells out two or three digits.
const _: () = assert!(select_digits(16) == 2 && select_digits(32) == 3);

/// Which of a row's eligible keys are kept, as far as the histograms so far tell.
#[derive(Clone, Copy)]
enum Rule {
    /// All of them: a top-k over at most `k` eligible keys.
    All,
    /// Those of positive bias (relu).
    Positive,
    /// Top-k: those whose radix key is above `t`, and the `need` lowest keys equal to it. While
    /// digits are still being counted, `t` holds the digits found so far.
    Above { t: u32, need: u32 },
}

/// A row's workspace (byte addresses): a histogram a digit, then two tally words a chunk. Read
/// with `ld_relaxed_u32` (from L2): a cooperative launch's steps read what other SMs wrote since
/// it began.
#[derive(Clone, Copy)]
struct Work {
    base: u64,
}

impl Work {
    fn of(p: &SelectWideParams, r: u64) -> Self {
        Work { base: p.work + 4 * r * (SELECT_WIDE_ROW_WORDS + 2 * p.chunks) as u64 }
    }

    fn hist(&self, digit: u32) -> u64 {
        self.base + 4 * (digit << SELECT_FIRST_DIGIT) as u64
    }

    /// Chunk `c`'s keys kept for sure, then its keys at the threshold.
    fn tally(&self, c: u32) -> u64 {
        self.base + 4 * (SELECT_WIDE_ROW_WORDS + 2 * c) as u64
    }
}


/// A rule and how many of the row's digit histograms it has read.
#[derive(Clone, Copy)]
struct Settled {
    digits: u32,
    rule: Rule,
}

impl Settled {
    /// Before any histogram: relu, or a top-k with every digit still to find.
    fn start(sel: &SelectParams) -> Self {
        Settled { digits: 0, rule: if sel.k == 0 { Rule::Positive } else { Rule::Above { t: 0, need: sel.k } } }
    }
}

/// `from` carried on through the row's histograms up to the first `digits` (collective; ends
/// past a barrier where it reads one). A cooperative launch carries each step's result to the
/// next, so that no CTA reads a histogram twice.
#[inline(always)]
unsafe fn settled<const W: u32>(sel: &SelectParams, work: Work, tid: u32, from: Settled, digits: u32) -> Settled {
    let Rule::Above { mut t, mut need } = from.rule else { return from };
    for i in from.digits..digits {
        let bins = 1 << select_digit(W, i).1;
        let mut b = tid;
        while b < bins {
            unsafe { st_shared_u32(Scratch.hist() + 4 * b, ld_relaxed_u32(work.hist(i) + 4 * b as u64)) };
            b += THREADS;
        }
        sync_threads();
        let (d, left, total) = unsafe { find_digit(&Scratch, bins, need, tid) };
        if i == 0 && total <= sel.k {
            return Settled { digits, rule: Rule::All };
        }
        (t, need) = ((t << select_digit(W, i).1) | d, left);
    }
    Settled { digits: digits.max(from.digits), rule: Rule::Above { t, need } }
}

/// A word's 32 keys as loaded: (shown bits, raw bits) of its four groups of eight, each held
/// in its own variables (an array of them, indexed in a loop, would live in local memory).
type Loaded = [(u32, Packed8); 4];

/// Word `w`'s loads, issued together (zeros for no word). Issued before a step reads the
/// workspace, so that both round trips overlap.
#[inline(always)]
unsafe fn load_word<const W: u32>(sel: &SelectParams, row: &Row, word: Option<u32>) -> Loaded {
    let sk = sel.dims[3];
    let fetch = |g: u32| match word {
        Some(w) => unsafe { (row.shown8(32 * w + 8 * g, sk), row.raw8::<W>(32 * w + 8 * g, sk)) },
        None => (0, [0; 8]),
    };
    [fetch(0), fetch(1), fetch(2), fetch(3)]
}

/// A loaded word's keys to `visit`, eight at a time: (first key's bit in the word, shown bits,
/// radix keys).
#[inline(always)]
fn visit_word<const W: u32>(sel: &SelectParams, [a, b, c, d]: Loaded, mut visit: impl FnMut(u32, u32, [u32; 8])) {
    let mut take = |g: u32, (shown, raw): (u32, Packed8)| visit(8 * g, shown, radix_keys::<W>(raw, sel.inf_bits));
    take(0, a);
    take(1, b);
    take(2, c);
    take(3, d);
}

/// A loaded word's keys under `rule`, as bits: (kept for sure, at the threshold); none where
/// there is no word (its shown bits are zero).
#[inline(always)]
fn classify<const W: u32>(sel: &SelectParams, loaded: Loaded, rule: Rule) -> (u32, u32) {
    let (mut kept, mut ties) = (0, 0);
    visit_word::<W>(sel, loaded, |first, shown, keys| {
        for j in 0..8 {
            let key = keys[j as usize];
            let (k, t) = match rule {
                Rule::All => (true, false),
                Rule::Positive => (positive::<W>(key), false),
                Rule::Above { t, .. } => (key > t, key == t),
            };
            let bit = (shown >> j & 1) << (first + j);
            kept |= if k { bit } else { 0 };
            ties |= if t { bit } else { 0 };
        }
    });
    (kept, ties)
}

/// Count step: the histogram of digit `digit` over the chunk's eligible keys that share the
/// digits found so far, added into the row's.
#[inline(always)]
unsafe fn count<const W: u32>(sel: &SelectParams, row: &Row, work: Work, word: Option<u32>, tid: u32, digit: u32, from: Settled) -> Settled {
    let loaded = unsafe { load_word::<W>(sel, row, word) };
    let found = unsafe { settled::<W>(sel, work, tid, from, digit) };
    // CTA-uniform: a row of at most k eligible keys has nothing more to count.
    let Rule::Above { t: prefix, .. } = found.rule else { return found };
    let (shift, width) = select_digit(W, digit);
    let bins = 1 << width;
    unsafe { clear_hist(&Scratch, bins, tid) };
    sync_threads();
    visit_word::<W>(sel, loaded, |_, shown, keys| {
        for j in 0..8 {
            let key = keys[j as usize];
            // The first digit's histogram takes every eligible key.
            if shown >> j & 1 != 0 && (digit == 0 || key >> (shift + width) == prefix) {
                unsafe { atom_add_shared_u32(Scratch.hist() + 4 * ((key >> shift) & (bins - 1)), 1) };
            }
        }
    });
    sync_threads();
    let mut b = tid;
    while b < bins {
        let n = unsafe { ld_shared_u32(Scratch.hist() + 4 * b) };
        if n != 0 {
            unsafe { red_add_u32(work.hist(digit) + 4 * b as u64, n) };
        }
        b += THREADS;
    }
    found
}

/// Tally step: the chunk's keys kept for sure and its keys at the threshold.
#[inline(always)]
unsafe fn tally<const W: u32>(sel: &SelectParams, row: &Row, work: Work, word: Option<u32>, tid: u32, chunk: u32, from: Settled) -> Settled {
    let loaded = unsafe { load_word::<W>(sel, row, word) };
    let found = unsafe { settled::<W>(sel, work, tid, from, select_digits(W)) };
    let (kept, ties) = classify::<W>(sel, loaded, found.rule);
    let (_, kept) = block_scan::<THREADS>(kept.count_ones(), tid, Scratch.sums());
    let (_, ties) = block_scan::<THREADS>(ties.count_ones(), tid, Scratch.sums());
    if tid == 0 {
        unsafe {
            *(work.tally(chunk) as *mut u32) = kept;
            *((work.tally(chunk) + 4) as *mut u32) = ties;
        }
    }
    found
}

/// The keys at the threshold before chunk `chunk` and the keys kept before it, and the row's
/// kept total, from the tallies (`need` of the keys at the threshold taken, lowest first;
/// collective).
#[inline(always)]
unsafe fn chunk_offsets(p: &SelectWideParams, work: Work, chunk: u32, need: u32, tid: u32) -> (u32, u32, u32) {
    let (mut ties, mut kept) = (0u32, 0u32);
    let mut start = 0;
    while start < p.chunks {
        let c = start + tid;
        let (a, t) = if c < p.chunks { unsafe { (ld_relaxed_u32(work.tally(c)), ld_relaxed_u32(work.tally(c) + 4)) } } else { (0, 0) };
        let (t_before, t_sum) = block_scan::<THREADS>(t, tid, Scratch.sums());
        let taken = need.saturating_sub(ties + t_before).min(t);
        let (k_before, k_sum) = block_scan::<THREADS>(a + taken, tid, Scratch.sums());
        if c == chunk {
            unsafe {
                st_shared_u32(Scratch.misc(), ties + t_before);
                st_shared_u32(Scratch.misc() + 4, kept + k_before);
            }
        }
        (ties, kept) = (ties + t_sum, kept + k_sum);
        start += THREADS;
    }
    sync_threads();
    unsafe { (ld_shared_u32(Scratch.misc()), ld_shared_u32(Scratch.misc() + 4), kept) }
}

/// The lowest `n` set bits of `x`.
#[inline(always)]
fn lowest_bits(mut x: u32, mut n: u32) -> u32 {
    let mut out = 0;
    while n > 0 && x != 0 {
        out |= x & x.wrapping_neg();
        x &= x - 1;
        n -= 1;
    }
    out
}

/// Word `w` of row `r` kept as `kept` in the outputs asked for, its first kept key the row's
/// `at`-th.
#[inline(always)]
unsafe fn write_word(sel: &SelectParams, r: u64, w: u32, kept: u32, mut at: u32) {
    let sk = sel.dims[3];
    let n = (sk - 32 * w).min(32);
    if sel.out_mask != 0 {
        let out = sel.out_mask + r * sk as u64 + 32 * w as u64;
        if sk % 4 == 0 {
            for q in 0..8 {
                if 4 * q < n {
                    unsafe { *((out + 4 * q as u64) as *mut u32) = mask_bytes(kept >> (4 * q) & 0xf) };
                }
            }
        } else {
            for j in 0..32 {
                if j < n {
                    unsafe { *((out + j as u64) as *mut u8) = (kept >> j & 1) as u8 };
                }
            }
        }
    }
    if sel.out_bits != 0 {
        unsafe { *((sel.out_bits + 4 * (r * sel.row_words as u64 + w as u64)) as *mut u32) = kept };
    }
    if sel.out_indices != 0 {
        let out = sel.out_indices + 4 * r * sel.width as u64;
        let mut bits = kept;
        while bits != 0 {
            if at < sel.width {
                unsafe { *((out + 4 * at as u64) as *mut i32) = (32 * w + bits.trailing_zeros()) as i32 };
            }
            at += 1;
            bits &= bits - 1;
        }
    }
}

/// Write step: the chunk's keys kept (those at the threshold ranked over the row, lowest key
/// first) in the outputs; chunk 0 pads the index list.
#[inline(always)]
unsafe fn write<const W: u32>(p: &SelectWideParams, row: &Row, work: Work, word: Option<u32>, tid: u32, chunk: u32, r: u64, from: Settled) {
    let sel = &p.sel;
    let loaded = unsafe { load_word::<W>(sel, row, word) };
    let rule = unsafe { settled::<W>(sel, work, tid, from, select_digits(W)) }.rule;
    let need = if let Rule::Above { need, .. } = rule { need } else { 0 };
    let (ties_before, kept_before, total) = unsafe { chunk_offsets(p, work, chunk, need, tid) };
    let (kept, ties) = classify::<W>(sel, loaded, rule);
    let (rank, _) = block_scan::<THREADS>(ties.count_ones(), tid, Scratch.sums());
    let kept = kept | lowest_bits(ties, need.saturating_sub(ties_before + rank));
    let (at, _) = block_scan::<THREADS>(kept.count_ones(), tid, Scratch.sums());
    if let Some(w) = word {
        unsafe { write_word(sel, r, w, kept, kept_before + at) };
    }
    if chunk == 0 && sel.out_indices != 0 {
        let mut e = total + tid;
        while e < sel.width {
            unsafe { *((sel.out_indices + 4 * (r * sel.width as u64 + e as u64)) as *mut i32) = -1 };
            e += THREADS;
        }
    }
}

/// Grid `(chunks, rows)`, [`SELECT_WIDE_THREADS`] threads, [`dmattn_abi::SELECT_FIXED_WORDS`]
/// words of dynamic shared memory: step `p.step` of row `blockIdx.y`'s selection, or every step
/// (`SELECT_WIDE_ALL`, a cooperative launch).
#[inline(always)]
pub unsafe fn select_wide<const W: u32>(p: &SelectWideParams) {
    let tid = thread_idx();
    let start = Settled::start(&p.sel);
    if p.step != SELECT_WIDE_ALL {
        unsafe { step::<W>(p, p.step, tid, start) };
        return;
    }
    // The barrier counter follows the rows' workspace.
    let rows = grid_dim_y();
    let counter = p.work + 4 * rows as u64 * (SELECT_WIDE_ROW_WORDS + 2 * p.chunks) as u64;
    let ctas = p.chunks * rows;
    // Each step starts from an opaque thread index, so that nothing one step computed (its
    // keys above all) is held through the barrier into the next but what it settled. Spelled
    // out, each step its own code (a loop over the digits, or a closure, kept the parameters in
    // local memory).
    let (mut passed, mut found) = (0, start);
    if p.sel.k != 0 {
        unsafe {
            found = step::<W>(p, SELECT_WIDE_COUNT, opaque(tid), found);
            passed += ctas;
            grid_barrier(counter, passed, tid);
            found = step::<W>(p, SELECT_WIDE_COUNT + 1, opaque(tid), found);
            passed += ctas;
            grid_barrier(counter, passed, tid);
            if select_digits(W) == 3 {
                found = step::<W>(p, SELECT_WIDE_COUNT + 2, opaque(tid), found);
                passed += ctas;
                grid_barrier(counter, passed, tid);
            }
        }
    }
    unsafe {
        found = step::<W>(p, SELECT_WIDE_TALLY, opaque(tid), found);
        grid_barrier(counter, passed + ctas, tid);
        step::<W>(p, SELECT_WIDE_WRITE, opaque(tid), found);
    }
}

/// Step `s` of this CTA's chunk of its row, carrying on from `from`; what it settled.
#[inline(always)]
unsafe fn step<const W: u32>(p: &SelectWideParams, s: u32, tid: u32, from: Settled) -> Settled {
    let (chunk, r, _) = block_idx();
    let sel = &p.sel;
    let row = Row::new::<W>(sel, r as u64);
    let work = Work::of(p, r as u64);
    let w = chunk * p.chunk_words + tid;
    let word = if tid < p.chunk_words && w < sel.row_words { Some(w) } else { None };
    match s {
        SELECT_WIDE_TALLY => unsafe { tally::<W>(sel, &row, work, word, tid, chunk, from) },
        SELECT_WIDE_WRITE => {
            unsafe { write::<W>(p, &row, work, word, tid, chunk, r as u64, from) };
            from
        }
        _ => unsafe { count::<W>(sel, &row, work, word, tid, s - SELECT_WIDE_COUNT, from) },
    }
}
