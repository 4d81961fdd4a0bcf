//! Masks made from a bias on the GPU (`select_keys`): the selection kernel's parameters and sizes.
use crate::View4;

/// Parameters of the key-selection kernels (Flash-DMA's `create_mask`), one CTA per output row
/// (grid-stride). Row `r` of the output `[dims[0], dims[1], dims[2]]` reads the bias (raw bits of
/// its elements through element strides, 0 where broadcast) and the optional bool mask
/// (`mask.ptr` 0: every key eligible) and keeps the `k` eligible keys of largest bias, ties to
/// the lower key (`k` 0: the eligible keys of bias > 0); then, with `block` > 0, every key of a
/// block of `block` keys takes the block's majority, ANDed with the eligibility again. Outputs
/// with a zero pointer are not written: `out_mask` bool `[rows, sk]`, `out_bits` u32
/// `[rows, row_words]` (key `j` is bit `j % 32` of word `j / 32`), `out_indices` i32
/// `[rows, width]` (the kept keys ascending, then -1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SelectParams {
    pub bias: View4,
    pub mask: View4,
    pub out_mask: u64,
    pub out_bits: u64,
    pub out_indices: u64,
    /// Output `[b, h, q, sk]`.
    pub dims: [u32; 4],
    pub k: u32,
    pub block: u32,
    pub width: u32,
    /// `ceil(sk / 32)`.
    pub row_words: u32,
    /// Exponent-all-ones magnitude of the bias type (`+inf`'s bits): magnitudes above it are NaN.
    pub inf_bits: u32,
    /// Whether the row's radix keys are kept in shared memory (else re-read from the bias).
    pub cached: u32,
    /// Entries of the candidate list (at least `SELECT_CANDIDATES`).
    pub cand_cap: u32,
    pub _pad: u32,
}

/// Threads per block of the key-selection kernels.
pub const SELECT_THREADS: u32 = 256;

/// CTAs of the key-selection kernels an SM holds at once (registers bounded to fit them, and
/// a row's radix keys cached only where the shared memory fits them too): a row's passes are
/// chains of dependent integer steps and block barriers, which only more resident rows hide
/// (H100, 64K rows of 32K bf16 keys: 2 CTAs 8.3 ms, 3 7.0, 4 6.5, 5 6.1). The kernel over
/// `elem_bytes`-wide bias elements: 32-bit keys take more registers (five CTAs would spill).
pub const fn select_ctas_per_sm(elem_bytes: u32) -> u32 {
    if elem_bytes == 2 { 5 } else { 4 }
}

/// Bits of the key-selection kernels' first radix digit, taken while the row is loaded.
pub const SELECT_FIRST_DIGIT: u32 = 11;

/// Keys of the first digit's threshold bin a key-selection CTA refines in a list at least
/// (`SelectParams::cand_cap`; more: the slower passes over the whole row).
pub const SELECT_CANDIDATES: u32 = 2048;

/// Shared memory of a key-selection CTA before its candidate list and row-sized parts (u32
/// words): the radix histogram (`2^SELECT_FIRST_DIGIT`), a block scan's sums (33, padded to 40)
/// and 8 words of broadcast values.
pub const SELECT_FIXED_WORDS: u32 = (1 << SELECT_FIRST_DIGIT) + 40 + 8;

/// Parameters of the wide key selection (`dmattn_select_wide_{16,32}`), for rows too few to
/// fill the GPU one CTA a row, or too long for one CTA's shared memory: grid `(chunks, rows)`,
/// each CTA the row's keys `32 * chunk_words * x ..` (a 32-key word a thread), the same
/// selection as `sel` describes (`block` 0 only; `cached` and `cand_cap` unused). Its steps, in
/// order: `SELECT_WIDE_COUNT + i` for each radix digit `i` of a top-k ([`select_digit`]; each
/// CTA finds the digits so far from the histograms of the steps before), `SELECT_WIDE_TALLY`
/// (each chunk's keys kept for sure and its keys at the threshold), `SELECT_WIDE_WRITE` (the
/// outputs; each CTA sums the earlier chunks' tallies). One launch a `step`, or with
/// `SELECT_WIDE_ALL` one cooperative launch of every step, a grid barrier between them.
/// `work`, zeroed before the first step: per row, [`SELECT_WIDE_ROW_WORDS`] histogram words
/// then two tally words a chunk, at `row * (SELECT_WIDE_ROW_WORDS + 2 * chunks)` u32s, then the
/// grid barrier's counter.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SelectWideParams {
    pub sel: SelectParams,
    pub work: u64,
    pub chunk_words: u32,
    pub chunks: u32,
    pub step: u32,
    pub _pad: u32,
}

/// Threads per block of the wide key selection: one 32-key word each, so at most this many
/// words a chunk.
pub const SELECT_WIDE_THREADS: u32 = 256;

/// Wide-selection steps ([`SelectWideParams::step`]): the histogram of radix digit `i` is step
/// `SELECT_WIDE_COUNT + i`.
pub const SELECT_WIDE_COUNT: u32 = 0;
pub const SELECT_WIDE_TALLY: u32 = 8;
pub const SELECT_WIDE_WRITE: u32 = 9;
/// Every step in one cooperative launch (all CTAs resident), grid barriers between them.
pub const SELECT_WIDE_ALL: u32 = 10;

/// Histogram words of a row's wide selection: one histogram of `2^SELECT_FIRST_DIGIT` bins a
/// digit, three digits at most (32-bit keys).
pub const SELECT_WIDE_ROW_WORDS: u32 = 3 << SELECT_FIRST_DIGIT;

/// Radix digits of `bits`-wide keys (16 or 32), first digit `SELECT_FIRST_DIGIT` bits.
pub const fn select_digits(bits: u32) -> u32 {
    bits.div_ceil(SELECT_FIRST_DIGIT)
}

/// Digit `i` of a `bits`-wide radix key: (shift, width), from the top, `SELECT_FIRST_DIGIT`
/// bits each, the last one the rest.
pub const fn select_digit(bits: u32, i: u32) -> (u32, u32) {
    let above = SELECT_FIRST_DIGIT * i;
    let width = if bits - above < SELECT_FIRST_DIGIT { bits - above } else { SELECT_FIRST_DIGIT };
    (bits - above - width, width)
}
