//! One sequence's bounds and where its rows start: a fixed-length call's batch entry or a packed
//! variable-length batch's sequence (`dmattn_abi::Seqs`) alike. Every kernel that walks a
//! sequence asks this for its lengths and first rows, and nothing else reads `cu_seqlens`.
use crate::arch::{ld_global_nc_u32, ld_global_nc_v4, opaque, smem_ref_reads, st_shared_u32, st_shared_u64};
use core::mem::offset_of;
use dmattn_abi::{BwdParams, FwdParams, Seqs, View4, dq_blocked_row};

const _: () = assert!(offset_of!(BwdParams, fwd.seqs) % 8 == 0 && offset_of!(BwdParams, dq_turns) % 8 == 0);

#[derive(Clone, Copy)]
pub struct Seq {
    /// The sequence's number (grid z without splits): its row of a paged K/V block table.
    pub index: u32,
    /// Batch index into the 4-D operands: the sequence's, or 0 in a packed batch (whose
    /// operands are one batch entry of `total` rows).
    pub batch: u64,
    /// The sequence's first query row and first key row in the operands.
    pub q0: u32,
    pub k0: u32,
    pub len_q: u32,
    pub len_k: u32,
}

impl Seq {
    /// Sequence `b` (grid z) of the call: in a kernel compiled with `PACKED`, four cached loads
    /// of the validated prefix sums where the call is packed (kernels call this again wherever
    /// they rebuild their addresses rather than hold it); a kernel without it serves only
    /// fixed-length calls (the host's choice).
    #[inline(always)]
    pub fn of<const PACKED: bool>(p: &FwdParams, b: u32) -> Self {
        Self::in_batch::<PACKED>(&p.seqs, b, p.seqlen_q, p.seqlen_k)
    }

    /// [`Seq::of`] for any kernel's `Seqs`: batch entry `b` of `seqlen_q x seqlen_k` where
    /// `seqs` holds no prefix sums.
    #[inline(always)]
    pub fn in_batch<const PACKED: bool>(s: &Seqs, b: u32, seqlen_q: u32, seqlen_k: u32) -> Self {
        if !PACKED || s.cu_q == 0 {
            return Seq { index: b, batch: b as u64, q0: 0, k0: 0, len_q: seqlen_q, len_k: seqlen_k };
        }
        let at = 4 * b as u64;
        let (q0, q1, k0, k1) = unsafe {
            (ld_global_nc_u32(s.cu_q + at), ld_global_nc_u32(s.cu_q + at + 4), ld_global_nc_u32(s.cu_k + at), ld_global_nc_u32(s.cu_k + at + 4))
        };
        Seq { index: b, batch: 0, q0, k0, len_q: q1 - q0, len_k: k1 - k0 }
    }

    /// Paged K/V (`Seqs::block_table`, never in a kernel without `PACKED`): the element offset,
    /// before the head's, of the row holding the sequence's key `j` in k or v
    /// `[num_pages, page_size, hk, d]` with strides `stride`: one cached load of the table.
    #[inline(always)]
    pub fn paged_offset(&self, p: &FwdParams, stride: &[u64; 4], j: u32) -> u64 {
        Self::in_page(p, stride, self.page_of(p, j), j)
    }

    /// The page holding the sequence's key `j` (its block table's entry): one cached load.
    #[inline(always)]
    pub fn page_of(&self, p: &FwdParams, j: u32) -> u32 {
        let s = &p.seqs;
        // The table's entries number below 2^32 (host-checked).
        let at = s.block_table + 4 * (self.index * s.table_stride + (j >> s.page_shift)) as u64;
        unsafe { ld_global_nc_u32(at) }
    }

    /// [`Seq::paged_offset`] of key `j` in `page` (its [`Seq::page_of`]).
    #[inline(always)]
    pub fn in_page(p: &FwdParams, stride: &[u64; 4], page: u32, j: u32) -> u64 {
        // A page's elements and a row's offset in it fit 32 bits (host-checked): wide
        // 32 x 32-bit multiplies.
        page as u64 * (stride[0] as u32 as u64) + ((j & ((1 << p.seqs.page_shift) - 1)) * stride[1] as u32) as u64
    }

    /// Element offset of the sequence's query row `i` in a `[b, s, h, d]` operand with strides
    /// `stride`, before the head's.
    #[inline(always)]
    pub fn q_offset(&self, stride: &[u64; 4], i: u32) -> u64 {
        self.batch * stride[0] + (self.q0 + i) as u64 * stride[1]
    }

    /// The same for key row `j` of a `[b, s, hk, d]` operand.
    #[inline(always)]
    pub fn k_offset(&self, stride: &[u64; 4], j: u32) -> u64 {
        self.batch * stride[0] + (self.k0 + j) as u64 * stride[1]
    }

    /// Element offset of the sequence's (query 0, key 0), before the head's, in an operand laid
    /// out by query row and key (a bias, its gradient's accumulator, a mask's bits or block
    /// classes) with strides `stride`: its batch entry; in a packed batch (no batch dimension)
    /// its first query's row (`stride[2]`, 0 for a key-side operand) and first key (`stride[0]`:
    /// the step per packed key of a key-side operand `[total_k, heads]`, 0 for a query-based one
    /// `[total_q, heads, max_seqlen_k]`, whose keys count from the sequence's first). A mask's
    /// bits and classes are laid out so that the same rule places them (host `pack_sequences`).
    /// (`k0` and `q0` are 0 in a fixed-length call.)
    #[inline(always)]
    pub fn origin(&self, stride: &[u64; 4]) -> u64 {
        (self.batch + self.k0 as u64) * stride[0] + self.q0 as u64 * stride[2]
    }

    /// Index of (head `h`, query row `i`) in LSE and delta: `(batch * heads + h) * lse_rows`
    /// plus the row in the operands (see `dmattn_abi::Seqs::lse_rows`).
    #[inline(always)]
    pub fn lse_index(&self, p: &FwdParams, h: u32, i: u32) -> u64 {
        (self.batch * p.heads as u64 + h as u64) * p.seqs.lse_rows as u64 + (self.q0 + i) as u64
    }
}

/// Makes a backward's shared-memory copy of its parameters (at `dst`) the fixed-length
/// problem of its packed sequence, for the CTA at grid position `(n_block, kv_head, b)` (packed
/// calls have no work order, so the grid is never reordered), so that the kernel's
/// walks need no per-step loads or registers for it: its lengths as the problem's (a key tile
/// past a shorter sequence's end gets no queries and no keys: it loads and writes nothing), and
/// the bases of operands (batch stride 0, from the host; a key-side bias and its gradient at the
/// sequence's first key, a query-based one at its first query), LSE, delta and the dQ and dbias
/// turn counters moved so that the fixed-length indexing with batch `b` lands on its rows (dQ's
/// accumulator on its blocked rows where `dq_blocked`, `dmattn_abi::dq_blocked_row`). The fields are
/// rewritten with shared-memory stores: writes LLVM could see through a reference reorder the
/// kernels' code into spills. The copy is read as the kernel reads it (`generic`, see
/// `arch::smem_ref_reads`).
#[inline(always)]
pub unsafe fn localize(dst: u32, generic: bool, (n_block, _, b): (u32, u32, u32), block_m: u32, block_n: u32, dq_blocked: bool) {
    // Read from the copy, not the parameters (the kernels' code stays as it is: reading the
    // parameters here reordered it into spills). The stores below write fields behind this
    // reference, and LLVM may take a field from a read before them (it does): each field is
    // read before it is rewritten, never after.
    let p: &BwdParams = unsafe { smem_ref_reads(opaque(dst), generic) };
    let f = &p.fwd;
    if f.seqs.cu_q == 0 {
        return;
    }
    let seq = Seq::of::<true>(f, b);
    let (q0, k0) = (seq.q0 as u64, seq.k0 as u64);
    let store = |offset: usize, v: u64| unsafe { st_shared_u64(dst + offset as u32, v) };
    let to_row = |offset: usize, v: &View4, row: u64, elem: u64| store(offset, v.ptr + elem * row * v.stride[1]);
    to_row(offset_of!(BwdParams, fwd.q), &f.q, q0, 2);
    to_row(offset_of!(BwdParams, fwd.o), &f.o, q0, 2);
    to_row(offset_of!(BwdParams, dout), &p.dout, q0, 2);
    let dq_row = if dq_blocked { dq_blocked_row(seq.q0, b) as u64 } else { q0 };
    to_row(offset_of!(BwdParams, dq_accum), &p.dq_accum, dq_row, 4);
    to_row(offset_of!(BwdParams, fwd.k), &f.k, k0, 2);
    to_row(offset_of!(BwdParams, fwd.v), &f.v, k0, 2);
    to_row(offset_of!(BwdParams, dk), &p.dk, k0, 2);
    to_row(offset_of!(BwdParams, dv), &p.dv, k0, 2);
    // A packed bias, its gradient's accumulator, the mask's bits and classes: the sequence's
    // (query 0, key 0), then no batch step (`Seq::origin`).
    let to_seq = |offset: usize, v: &View4, elem: u64| {
        store(offset, v.ptr + elem * seq.origin(&v.stride));
        store(offset + offset_of!(View4, stride), 0);
    };
    to_seq(offset_of!(BwdParams, fwd.bias), &f.bias, 2);
    to_seq(offset_of!(BwdParams, dbias_accum), &p.dbias_accum, 4);
    to_seq(offset_of!(BwdParams, fwd.mask_bits), &f.mask_bits, 8);
    to_seq(offset_of!(BwdParams, fwd.block_map), &f.block_map, 1);
    // LSE/delta `(b * h + head) * lse_rows + row` must land on `head * lse_rows + q0 + row`:
    // the base moves by `q0 - b * h * lse_rows` rows (wrapping; the sum is in bounds).
    let rows_back = (b as u64 * f.heads as u64 * f.seqs.lse_rows as u64).wrapping_sub(q0);
    store(offset_of!(BwdParams, fwd.lse), f.lse.wrapping_sub(4 * rows_back));
    store(offset_of!(BwdParams, delta), p.delta.wrapping_sub(4 * rows_back));
    // dQ turns, `[b, h, q_tiles]` over the longest sequence's tiles, are indexed
    // `(b * h + head) * q_tiles + tile` with the sequence's own tile count afterwards: the base
    // moves so that sequence `b`'s still start at `b * h * q_tiles_max`.
    let tiles = |rows: u32| rows.div_ceil(block_m) as u64;
    store(offset_of!(BwdParams, dq_turns), p.dq_turns + 4 * b as u64 * f.heads as u64 * (tiles(f.seqlen_q) - tiles(seq.len_q)));
    let col0 = n_block * block_n;
    let (len_q, len_k) = if col0 < seq.len_k { (seq.len_q, seq.len_k) } else { (0, col0) };
    // dbias turns (deterministic mode, a bias every kv head adds to; no two sequences share an
    // element, the host's `bias_dims`): slot `b * key_tiles + n` with the key-tile count of the
    // lengths stored below, so the base moves for sequence `b`'s to start at `b * key_tiles_max`.
    let key_tiles = |keys: u32| keys.div_ceil(block_n) as u64;
    store(offset_of!(BwdParams, dbias_turns), p.dbias_turns + 4 * b as u64 * (key_tiles(f.seqlen_k) - key_tiles(len_k)));
    unsafe {
        st_shared_u32(dst + offset_of!(BwdParams, fwd.seqlen_q) as u32, len_q);
        st_shared_u32(dst + offset_of!(BwdParams, fwd.seqlen_k) as u32, len_k);
    }
    store(offset_of!(BwdParams, fwd.seqs.cu_q), 0);
}

/// Rewrites a backward CTA's shared-memory copy of its parameters (`dst`, as [`localize`]) where
/// its key tile's query tiles are split among several CTAs (`BwdParams::q_split_shift`; a launch
/// per batch entry, grid position `(n_block, kv_head, split)`), so that the kernel walks its
/// share as if it were the whole problem and its main loop stays as it is unsplit: the lengths
/// the share pass wrote (`dmattn_abi::BwdSharesParams`), LSE and delta moved so that the
/// fixed-length indexing with batch `split` lands on the launch's rows (the operands' batch
/// strides are 0), and the share's first tile (`BwdParams::first_tile`), where the kernel starts
/// its walk. (Computing the shares here spilled the kernels at their register limit.) Split
/// calls are never packed or deterministic, so the turn counters stay.
#[inline(always)]
pub unsafe fn localize_split(dst: u32, generic: bool, (n_block, _, split): (u32, u32, u32)) {
    let p: &BwdParams = unsafe { smem_ref_reads(opaque(dst), generic) };
    let f = &p.fwd;
    let shift = p.q_split_shift;
    if shift == 0 {
        return;
    }
    let [first, len_q, len_k, _] = unsafe { ld_global_nc_v4(p.split_shares + 16 * ((n_block << shift) | split) as u64) };
    let rows_back = split as u64 * f.heads as u64 * f.seqs.lse_rows as u64;
    let store = |offset: usize, v: u64| unsafe { st_shared_u64(dst + offset as u32, v) };
    store(offset_of!(BwdParams, fwd.lse), f.lse.wrapping_sub(4 * rows_back));
    store(offset_of!(BwdParams, delta), p.delta.wrapping_sub(4 * rows_back));
    unsafe {
        st_shared_u32(dst + offset_of!(BwdParams, first_tile) as u32, first);
        st_shared_u32(dst + offset_of!(BwdParams, fwd.seqlen_q) as u32, len_q);
        st_shared_u32(dst + offset_of!(BwdParams, fwd.seqlen_k) as u32, len_k);
    }
}
