//! The kernels' parameter blocks for attention: the forward's (and its packed-batch and work-order
//! parts), the split-KV combine's, the backward's and its row passes', the unfused path's row
//! softmax's.
use crate::{Band, KeyLists, View4};

/// Forward kernel parameters. Layouts: q/o `[b, sq, h, d]`, k/v `[b, sk, hk, d]` (unit stride on
/// d), bias `[b, h, sq, sk]` broadcast through zero strides, the packed mask
/// (see [`MaskPackParams`](crate::MaskPackParams)) as u64 words `[b, h, sq, kwords]` and its block map
/// `[b, h, qblk, kblk]` (zero strides where broadcast), lse f32 `[b, h, sq]` contiguous.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FwdParams {
    pub q: View4,
    pub k: View4,
    pub v: View4,
    pub o: View4,
    /// Packed mask words; absent without a mask.
    pub mask_bits: View4,
    pub bias: View4,
    pub block_map: View4,
    pub lse: u64,
    pub batch: u32,
    pub heads: u32,
    /// Query heads per kv head (`h / hk`).
    pub kv_group: u32,
    /// Mask/bias head index = query head / this (1 when they have `h` heads, `kv_group` for `hk`).
    pub mask_head_div: u32,
    pub bias_head_div: u32,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    /// Softmax scale times log2(e): the kernel works in base 2.
    pub scale_log2: f32,
    /// Softcap `c` of `c * tanh(s / c)`; 0 disables it.
    pub softcap: f32,
    pub flags: u32,
    pub band: Band,
    /// Split-KV for grids too small to fill the GPU (short queries, long keys); 0 or 1 = off.
    /// Split `s` (grid z = `batch * splits + s`) covers key tiles `s * split_tiles..` up to
    /// `split_tiles` of them and writes its normalised partial O and LSE at `o` and `lse`
    /// shifted by `s` times `o_split_stride` / `lse_split_stride` elements; [`CombineParams`]
    /// merges them.
    pub splits: u32,
    pub split_tiles: u32,
    pub o_split_stride: u64,
    pub lse_split_stride: u64,
    /// The work order (the modifier variant without splits, and the decoding kernel): CTA `i`
    /// (linear block index, x fastest) runs the grid position in `order[i]`, a u64
    /// [`packed_position`]; 0: grid order.
    pub order: u64,
    /// Gather attention (the `_gather` variants, [`names::GATHER_SUFFIX`](crate::names::GATHER_SUFFIX)): each plane's kept
    /// keys in ascending order (`key_pos`, [`KeyCompactParams::pos`](crate::KeyCompactParams::pos)), the kept keys at or before
    /// each original key (`key_ranks`, [`KeyCompactParams::ranks`](crate::KeyCompactParams::ranks)), both read through the
    /// mask's plane of a (batch, head) with `key_ranks`' strides. K and V rows are read at the
    /// listed keys; the bias holds the plane's kept keys' columns in list order. The band and
    /// `seqlen_k` are the original problem's: a query sees the kept keys the band shows it, a
    /// contiguous run of the list whose ends are two ranks. The band has no sinks.
    pub key_ranks: KeyLists,
    pub key_pos: u64,
    /// Packed variable-length batches ([`Seqs`]); all zero for a fixed-length call.
    pub seqs: Seqs,
}

/// A tensor map for the bulk tensor copy engine (`CUtensorMap`, encoded on the host by
/// `cuTensorMapEncodeTiled`): 128 opaque bytes, 64-byte aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorMap(pub [u64; 16]);

/// The parameters of the Hopper lean forward over fixed-length operands
/// (`dmattn_fwd_sm90_<elem>_d<dim>`), whose producer brings Q, K and V in with the bulk tensor
/// copy engine: the forward's block, and the device address of three [`TensorMap`]s (Q
/// `[b, sq, h, d]`, then K and V `[b, sk, hk, d]`), each seen innermost first as
/// `(d, heads, rows, batch)` with boxes of 64 columns (128 bytes, the 128-byte swizzle:
/// `SmemTile`'s column blocks), one head, the tile's rows and one batch; rows past the end read
/// as zeros. The maps live in global memory, written before the launch: a kernel parameter
/// cannot hold them, as rustc's nvptx kernel ABI takes no parameter aligned above 16 bytes
/// (a 64-byte-aligned one is an internal compiler error) and a map must be 64-byte aligned.
///
/// Where `fwd_ws_persistent` says so the kernel is persistent: a grid of at most one CTA an SM
/// (x only) runs the query tiles
/// `(tile, head, batch)` in grid order, x fastest, as a full grid's CTAs would start. CTA `c`
/// takes tile `c` first, then each takes the next untaken one from a counter (a u32 at
/// `maps +` [`FWD_TMA_NEXT_TILE`], zeroed by the maps' kernel): tile `gridDim.x + n` for the
/// counter's old value `n`. Else a CTA runs the query tile of its block index.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FwdTmaParams {
    pub fwd: FwdParams,
    pub maps: u64,
}

/// Where the persistent lean forward's tile counter (a u32) lies in its maps' buffer (after the
/// three maps), and the buffer's size.
pub const FWD_TMA_NEXT_TILE: u64 = 3 * core::mem::size_of::<TensorMap>() as u64;
pub const FWD_TMA_BUFFER_BYTES: usize = FWD_TMA_NEXT_TILE as usize + core::mem::size_of::<u32>();

/// Parameters of `dmattn_store_tensor_maps` (one thread): writes the three maps of a
/// [`FwdTmaParams`] to `dst` (64-byte aligned, [`FWD_TMA_BUFFER_BYTES`]) and zeroes the tile
/// counter after them, in stream order before the forward that reads them. A kernel, not a copy
/// from host memory: a CUDA graph records a kernel's parameters, but a copy's host source only
/// by address, which the call frees. The maps are `[u64; 16]` here, not [`TensorMap`]: a kernel
/// parameter aligned above 16 bytes stops rustc.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TensorMapsParams {
    pub dst: u64,
    pub maps: [[u64; 16]; 3],
}

/// Where a sequence's rows are, for packed variable-length batches (`cu_seqlens`): q/o/dO/dQ
/// `[total_q, h, d]` and k/v/dK/dV `[total_k, hk, d]` seen as batch 1 (`View4::stride[0]` 0),
/// sequence `b` (grid z) at rows `cu_q[b]..cu_q[b + 1]` and keys `cu_k[b]..cu_k[b + 1]`
/// (int32 prefix sums, validated on the host). `FwdParams::seqlen_q`/`seqlen_k` are then the
/// longest sequence's lengths (the grid's extent), and LSE/delta are `[h, total_q]`. A bias (and
/// its gradient's accumulator) is key-side `[total_k, h]` or query-based `[total_q, h,
/// max_seqlen_k]`, seen as `[·, h, rows, keys]` whose `stride[0]` is the step per packed key (the
/// key stride of a key-side bias, 0 for a query-based one); a mask's packed bits and block classes
/// are laid out so that the same rule places a sequence's ([`MaskPackParams`](crate::MaskPackParams)). The kernels ask
/// `Seq` (kernels-gpu's `seq`) for a sequence's bounds and first rows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Seqs {
    /// Device addresses of `cu_seqlens_q` and `cu_seqlens_k`; 0: fixed-length call.
    pub cu_q: u64,
    pub cu_k: u64,
    /// LSE (and delta) index of (batch `b`, head `h`, row `i`) is `(b * heads + h) * lse_rows
    /// + i`: `seqlen_q` for fixed lengths; `total_q` packed, where `b` is 0 and `i` counts from
    /// the packed tensor's first row.
    pub lse_rows: u32,
    /// Paged K/V (forward only): log2 of the page size (a power of two; each row's page is
    /// looked up); unused with contiguous K/V.
    pub page_shift: u32,
    /// Paged K/V: the block table's device address, int32 `[batch, table_stride]` (sequence
    /// `b`'s key `j` is row `j % page_size` of page `table[b][j / page_size]` of k and v,
    /// `[num_pages, page_size, hk, d]`, entries validated on the host); 0: K/V are packed rows.
    pub block_table: u64,
    pub table_stride: u32,
    pub _pad: u32,
}

/// Orders a masked grid heaviest first (`FwdParams::order`, which the backward's copy of the
/// forward's parameters holds too): each warp counts the tiles one CTA will visit into `work`
/// (u32 per linear block index, x fastest), the forward's key tiles or the backward's query
/// tiles; the CTA that takes the last ticket (`ticket`, a u32 that is 0 between launches and
/// that this CTA resets) sorts them into `order`, a [`packed_position`] per CTA, by a counting
/// sort over [`ORDER_BUCKETS`] work values (larger ones share the last bucket).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OrderParams {
    pub fwd: FwdParams,
    pub work: u64,
    pub order: u64,
    pub ticket: u64,
    /// The backward's [`BwdParams::kv_heads_first`].
    pub kv_heads_first: u32,
}

/// Warps per CTA of the ordering pass (one counted CTA each).
pub const ORDER_WARPS: u32 = 8;

pub const ORDER_BUCKETS: u32 = 1024;

/// The ordering pass's shared memory: a counter per bucket and a total per warp.
pub const ORDER_SMEM_BYTES: u32 = 4 * (ORDER_BUCKETS + ORDER_WARPS);

/// Shared memory a CTA keeps its grid position in (a [`packed_position`]).
pub const POSITION_BYTES: u32 = 8;

/// A grid position as a work order holds it: block x in the low 32 bits, y (< 2^16)
/// and z (< 2^16) above, so a CTA unpacks it with shifts.
pub const fn packed_position(x: u32, y: u32, z: u32) -> u64 {
    x as u64 | (y as u64) << 32 | (z as u64) << 48
}

/// The `(x, y, z)` of a [`packed_position`].
pub const fn unpacked_position(at: u64) -> (u32, u32, u32) {
    (at as u32, (at >> 32) as u32 & 0xffff, (at >> 48) as u32)
}

/// Merges split-KV partial results: per query row, LSE = log Σ exp(LSE_s) and
/// O = Σ exp(LSE_s - LSE) O_s. Partials are contiguous: O `[splits, b, sq, h, d]` (q's element
/// type), LSE f32 `[splits, b, h, sq]`; the outputs are `o` (strided) and `lse` `[b, h, sq]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CombineParams {
    pub o_part: u64,
    pub lse_part: u64,
    pub o: View4,
    pub lse: u64,
    pub splits: u32,
    pub rows: QueryRows,
}

/// The query rows a row pass walks (`batch * heads * seqlen_q` of `head_dim`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QueryRows {
    pub batch: u32,
    pub heads: u32,
    pub seqlen_q: u32,
    pub head_dim: u32,
}

impl QueryRows {
    pub const fn count(&self) -> u32 {
        self.batch * self.heads * self.seqlen_q
    }

    /// Lanes per row: a lane holds 8 elements (16 bytes) of a row, and a warp takes
    /// `32 / lanes()` consecutive rows (a power of two: a row's lanes form a shuffle group).
    pub const fn lanes(&self) -> u32 {
        row_lanes(self.head_dim)
    }
}

/// Lanes per row of `head_dim` 16-bit elements, a lane holding 8 (16 bytes): a power of two, at
/// most a warp, so that a row's lanes form a shuffle group.
pub const fn row_lanes(head_dim: u32) -> u32 {
    let lanes = head_dim.div_ceil(8).next_power_of_two();
    if lanes < 32 { lanes } else { 32 }
}

/// Backward kernel parameters: the forward's operands and outputs, the output gradient, and
/// where the gradients go. dq and dbias are accumulated in f32 (`dq_accum` `[b, sq, h, d]`, or
/// in the Hopper kernels the blocked layout of [`DqConvertParams`]; `dbias_accum` in the bias's
/// own shape, zero strides on broadcast dims) and converted after;
/// dk and dv are written directly, or where the query tiles are split (`q_split_shift`)
/// accumulated in f32 too. `delta` is rowsum(dO * O), f32 `[b, h, sq]` like `lse`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BwdParams {
    pub fwd: FwdParams,
    pub dout: View4,
    pub dq_accum: View4,
    pub dk: View4,
    pub dv: View4,
    pub dbias_accum: View4,
    pub delta: u64,
    /// Deterministic mode: u32 per dQ tile `[b, h, q_tiles]`, counting the key tiles added.
    pub dq_turns: u64,
    /// Deterministic mode with a bias shared across CTAs: u32 per dbias column slot.
    pub dbias_turns: u64,
    /// The bias's shape `[mb, mh, mq, mk]` as the dbias turns read it (size 1: CTAs of several
    /// batch entries, kv heads or key tiles add to one element); a packed batch's never shares
    /// along its sequences or keys.
    pub bias_dims: [u32; 4],
    pub kv_heads: u32,
    /// Nonzero: the grid is `(kv_heads, key tiles, batch)`, not `(key tiles, kv_heads, batch)`
    /// (where a work order is given, the positions it holds are in this grid).
    pub kv_heads_first: u32,
    /// log2 of the CTAs each key tile's query tiles are split among (0: one CTA walks them all).
    /// A split call runs one batch entry per launch (the operands' batch strides 0, their bases
    /// and `fwd.lse`/`delta` at the entry's rows), its grid's z the split; `dk` and `dv` are f32
    /// accumulators `[b, sk, hk, d]` (element strides) the CTAs add their shares to. Never with
    /// a work order, a packed batch or in deterministic mode.
    pub q_split_shift: u32,
    /// Where split: the shares, `[u32; 4]` per (key tile, split) at `key_tile << q_split_shift |
    /// split`, [`BwdSharesParams`] writes.
    pub split_shares: u64,
    /// The first query tile a CTA walks (from the host 0; a split CTA's copy holds its share's,
    /// see `kernels-gpu`'s `seq::localize_split`).
    pub first_tile: u32,
    pub _pad: u32,
}

/// The backward's query-tile shares (`BwdParams::q_split_shift`): for each key tile and split,
/// `[first query tile, seqlen_q, seqlen_k, 0]`, the problem the split's CTA walks as if whole:
/// the split's run of the query tiles the band lets see the key tile (as even as the split
/// allows), its lengths ending at the run's last row with `sk - sq` kept so that the diagonal
/// stays (`Band::splits_queries`), or `(0, col0)` where the run is empty.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BwdSharesParams {
    pub fwd: FwdParams,
    pub shares: u64,
    pub block_m: u32,
    pub block_n: u32,
    pub key_tiles: u32,
    pub shift: u32,
}

/// rowsum(dO * O) per query row: the backward's preprocessing pass.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BwdPreParams {
    pub o: View4,
    pub dout: View4,
    pub delta: u64,
    pub rows: QueryRows,
}

/// dQ out of the Hopper backward's (`BwdTile::wgmma`) f32 accumulator into `dst` (`[b, sq, h, d]`
/// element strides; a packed batch's `[1, total_q, h, d]`), rounded to its 16-bit type.
///
/// The accumulator is laid out as the products leave dQ, so that a warp adds a 16 x 8 tile of
/// it with one 16-byte reduction a lane, 512 contiguous bytes (row-major, a warp's reductions
/// covered 8 rows x 32 bytes; the reductions were 12-19 % of the backward): rows in groups of
/// [`DQ_GROUP_ROWS`], each (group, head) `16 d` f32 in `d / 8` blocks of 128, one per n8 column
/// tile, and in a block lane `4 g + t`'s four at `4 (4 g + t)`: rows `g` and `g + 8`, columns
/// `2 t` and `2 t + 1` of the tile (`(row g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)`). So
/// (batch `b`, row `i`, head `h`) of a group starts at `b src.stride[0] + i src.stride[1] + h
/// src.stride[2]` with strides `[rows H d, H d, 16 d, ·]`: the kernels' row arithmetic, from a
/// row that is a multiple of 16. A fixed-length call's entries have their rows rounded up to
/// 16; a packed sequence starts at [`dq_blocked_row`]. Rows past a sequence's end in its last
/// group are padding: added to, never read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DqConvertParams {
    pub src: View4,
    pub dst: View4,
    /// A packed batch's prefix sums (`Seqs::cu_q`; 0 for fixed lengths).
    pub seqs: Seqs,
    /// Batch entries or packed sequences.
    pub batch: u32,
    /// A fixed-length call's query rows.
    pub seqlen_q: u32,
    pub heads: u32,
    pub head_dim: u32,
}

impl DqConvertParams {
    /// Lanes a unit of the conversion takes: one per n8 column tile ([`row_lanes`]).
    pub const fn lanes(&self) -> u32 {
        row_lanes(self.head_dim)
    }

    /// The conversion's units for a sequence of `len_q` rows: one per (row pair `g` and `g + 8`
    /// of a 16-row group, head).
    pub const fn units(&self, len_q: u32) -> u32 {
        len_q.div_ceil(DQ_GROUP_ROWS) * 8 * self.heads
    }
}

/// Rows of a group of dQ's blocked accumulator ([`DqConvertParams`]).
pub const DQ_GROUP_ROWS: u32 = 16;

/// The accumulator row where packed sequence `s` (first query at packed row `q0`) starts in
/// dQ's blocked accumulator ([`DqConvertParams`]): a multiple of 16, and at least the previous
/// sequence's start plus its rows rounded up to 16, since `floor((q0 + 16 s) / 16)` grows by at
/// least `ceil(len / 16)` from one sequence to the next.
pub const fn dq_blocked_row(q0: u32, s: u32) -> u32 {
    (q0 + DQ_GROUP_ROWS * s) & !(DQ_GROUP_ROWS - 1)
}

/// The rows of dQ's blocked accumulator for a packed batch of `sequences` and `total_q` rows:
/// every sequence's [`dq_blocked_row`] plus its rows rounded up to 16 lies within.
pub const fn dq_blocked_rows(total_q: u64, sequences: u64) -> u64 {
    total_q + DQ_GROUP_ROWS as u64 * sequences
}

/// f32 → 16-bit conversion of an accumulated gradient, `len` contiguous elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ConvertParams {
    pub src: u64,
    pub dst: u64,
    pub len: u64,
}

/// The row softmax of the materialising (unfused) path, between its two cuBLAS products. `s`
/// holds the unscaled scores `QKᵀ` in q's element type, `[b, h, sq, sk]` contiguous; per row the
/// kernel forms `softcap(scale · s) + bias`, hides what the prepared mask (block classes and
/// packed bits, as [`FwdParams`] has them) and the [`Band`] hide, and overwrites the row with its probabilities P
/// (0 where hidden, all 0 on a row with nothing visible), writing the row's natural-log LSE
/// (f32 `[b, h, sq]`, -inf on such a row) as the fused forward does. Mask and bias are
/// broadcast through zero strides, as in [`FwdParams`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SoftmaxRowsParams {
    pub s: u64,
    pub lse: u64,
    /// The prepared mask's block classes (absent without a mask) and bits (absent without a
    /// score mask).
    pub block_map: View4,
    pub mask_bits: View4,
    /// Absent without a bias.
    pub bias: View4,
    pub heads: u32,
    /// Mask/bias head index = query head / this (as in [`FwdParams`]).
    pub mask_head_div: u32,
    pub bias_head_div: u32,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    /// The softmax scale (natural, not folded with log2(e)).
    pub scale: f32,
    /// Softcap `c` of `c * tanh(s / c)`; 0 disables it.
    pub softcap: f32,
    pub band: Band,
}

/// Threads per block of the row softmax: one CTA per row of scores.
pub const SOFTMAX_ROWS_THREADS: u32 = 256;

/// Its dynamic shared memory: one (max, sum) pair of f32 per warp for the block reduction.
pub const SOFTMAX_ROWS_SMEM_BYTES: u32 = 8 * (SOFTMAX_ROWS_THREADS / 32);

/// Threads per block of the preprocessing and conversion kernels.
pub const PRE_THREADS: u32 = 256;

/// Dynamic shared memory of `dmattn_combine_rows_<elem>` (a CTA a row, [`PRE_THREADS`]
/// threads): each thread's 8 f32 partial sums, then each warp's LSE max and sum.
pub const COMBINE_ROWS_SMEM_BYTES: u32 = 4 * 8 * PRE_THREADS + 8 * (PRE_THREADS / 32);
