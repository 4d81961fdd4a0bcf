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
