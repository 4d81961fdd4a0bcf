//! The contract between `kernels-gpu` (device) and `dmattn` (host): kernel parameter structs,
//! tile shapes and kernel names. Both sides compile this one file, so they cannot disagree.
#![no_std]

mod decode;
pub use decode::*;

/// A strided 4-D view of device memory. Strides are in elements; a broadcast dimension has
/// stride 0. `ptr == 0` means "absent" for optional operands.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct View4 {
    pub ptr: u64,
    pub stride: [u64; 4],
}

impl View4 {
    pub const ABSENT: View4 = View4 { ptr: 0, stride: [0; 4] };
    pub const fn is_present(&self) -> bool {
        self.ptr != 0
    }
}

/// Flags of [`FwdParams::flags`].
pub mod flags {
    /// The bias rows can be copied with 16-byte `cp.async` (unit key stride, 16-byte aligned rows).
    pub const BIAS_VEC: u32 = 2;
    /// (Modifier variants, no work order, grid y = heads.) CTAs take their (query tile, head)
    /// heads fastest: every head's last query tile first, the heaviest under a causal band, with
    /// no ordering pass (gather attention, whose tile counts no block map holds).
    pub const HEADS_FIRST: u32 = 4;
    /// (Forward.) The bias does not vary along the queries (query stride 0): one row of it per
    /// key tile is copied, and every query row reads that row.
    pub const BIAS_ROW: u32 = 8;
}

/// The parametric part of a mask (zero storage): a band of keys around each query's diagonal key
/// `D(i)`, plus sink keys. `D(i) = i + sk - sq` (aligned to the bottom-right corner, as
/// FlashAttention's causal and `window_size`), or `floor(i / compress)` where `compress > 0` (the
/// compressed-causal rule of FlashAttention PR 2418, which has no `sk - sq` offset). Key `j` is
/// visible to query `i` iff `j < sk`, `j <= D(i) + right`, and `j >= D(i) - left` or `j < sinks`.
/// [`Band::NONE`] leaves a side unbounded; causal is `right == 0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Band {
    pub left: u32,
    pub right: u32,
    /// Keys `0..sinks` are exempt from the left edge (not from the right one).
    pub sinks: u32,
    /// 0: the bottom-right diagonal; `c > 0`: `D(i) = floor(i / c)`.
    pub compress: u32,
}

impl Band {
    /// Whether the band needs a backward kernel compiled for any band (`names::BAND_SUFFIX`):
    /// it has a left edge (and so maybe sinks) or a compressed diagonal.
    pub const fn needs_band_kernel(&self) -> bool {
        self.left != Band::NONE || self.compress != 0
    }

    /// An unbounded side.
    pub const NONE: u32 = u32::MAX;
    /// Every key visible.
    pub const ALL: Band = Band { left: Band::NONE, right: Band::NONE, sinks: 0, compress: 0 };
    /// Bottom-right causal.
    pub const CAUSAL: Band = Band { right: 0, ..Band::ALL };
}

impl Default for Band {
    fn default() -> Self {
        Band::ALL
    }
}

/// Forward kernel parameters. Layouts: q/o `[b, sq, h, d]`, k/v `[b, sk, hk, d]` (unit stride on
/// d), bias `[b, h, sq, sk]` broadcast through zero strides, the packed mask
/// (see [`MaskPackParams`]) as u64 words `[b, h, sq, kwords]` and its block map
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
    /// The work order (modifier variant, no splits): CTA `i` (linear block index, x fastest)
    /// runs the grid position in `order[i]`, a u64 [`packed_position`]; 0: grid order.
    pub order: u64,
    /// Gather attention (the `_gather` variants, [`names::GATHER_SUFFIX`]): each plane's kept
    /// keys in ascending order (`key_pos`, [`KeyCompactParams::pos`]), the kept keys at or before
    /// each original key (`key_ranks`, [`KeyCompactParams::ranks`]), both read through the
    /// mask's plane of a (batch, head) with `key_ranks`' strides. K and V rows are read at the
    /// listed keys; the bias holds the plane's kept keys' columns in list order. The band and
    /// `seqlen_k` are the original problem's: a query sees the kept keys the band shows it, a
    /// contiguous run of the list whose ends are two ranks. The band has no sinks.
    pub key_ranks: KeyLists,
    pub key_pos: u64,
    /// Packed variable-length batches ([`Seqs`]); all zero for a fixed-length call.
    pub seqs: Seqs,
}

/// Where a sequence's rows are, for packed variable-length batches (`cu_seqlens`): q/o/dO/dQ
/// `[total_q, h, d]` and k/v/dK/dV `[total_k, hk, d]` seen as batch 1 (`View4::stride[0]` 0),
/// sequence `b` (grid z) at rows `cu_q[b]..cu_q[b + 1]` and keys `cu_k[b]..cu_k[b + 1]`
/// (int32 prefix sums, validated on the host). `FwdParams::seqlen_q`/`seqlen_k` are then the
/// longest sequence's lengths (the grid's extent), and LSE/delta are `[h, total_q]`. A bias (and
/// its gradient's accumulator) is key-side `[total_k, h]` or query-based `[total_q, h,
/// max_seqlen_k]`, seen as `[·, h, rows, keys]` whose `stride[0]` is the step per packed key (the
/// key stride of a key-side bias, 0 for a query-based one); a mask's packed bits and block classes
/// are laid out so that the same rule places a sequence's ([`MaskPackParams`]). The kernels ask
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
        let lanes = self.head_dim.div_ceil(8).next_power_of_two();
        if lanes < 32 { lanes } else { 32 }
    }
}

/// Backward kernel parameters: the forward's operands and outputs, the output gradient, and
/// where the gradients go. dq and dbias are accumulated in f32 (`dq_accum` `[b, sq, h, d]`,
/// `dbias_accum` in the bias's own shape, zero strides on broadcast dims) and converted after;
/// dk and dv are written directly. `delta` is rowsum(dO * O), f32 `[b, h, sq]` like `lse`.
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

/// Tile shape of the backward kernel: a CTA of `warps` warps owns `block_n` keys of one kv head
/// and walks the query tiles (`block_m` rows) and the query heads of its group. Each of its three
/// products spreads the warps over a grid of its own, so that every warp's share is at least 32
/// rows by 32 columns where registers allow (a 16-row share reloads its operands from shared
/// memory for half the tensor-core work):
/// - S = QKᵀ and dP = dO Vᵀ (`block_m` x `block_n`): `sdp_rows` warps along the query rows, the
///   rest along the keys;
/// - dV += Pᵀ dO and dK += dSᵀ Q (`block_n` x `head_dim`, held in registers for the whole CTA):
///   `kv_keys` warps along the keys, the rest along the head dim;
/// - dQ = dS K (`block_m` x `head_dim`): `dq_rows` warps along the rows, the rest along the head dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BwdTile {
    pub head_dim: u32,
    pub block_m: u32,
    pub block_n: u32,
    /// 2: the next query tile loads while this one computes; 1 where shared memory is short.
    pub stages: u32,
    pub warps: u32,
    pub sdp_rows: u32,
    /// Chunks a warp computes its share of S and dP in (each reloading its Q and dO fragments):
    /// 2 where 32 accumulators beside dK and dV do not fit in registers.
    pub sdp_chunks: u32,
    pub kv_keys: u32,
    pub dq_rows: u32,
    /// Hopper variant (sm_90a module): each product is a warpgroup `wgmma` reading its operands
    /// from shared memory, so the warp grids are the warpgroups' (4 warps of 16 rows each).
    pub wgmma: bool,
    /// The stages hold a bias tile: every tile but those that serve only calls without a bias
    /// (`modifiers::NONE`, `MASK`), whose shared memory goes to a taller query tile instead.
    pub bias: bool,
}

impl BwdTile {
    pub const fn threads(&self) -> u32 {
        32 * self.warps
    }
    /// m16 row tiles and n8 key tiles of a warp's share of S and dP.
    pub const fn sdp_m_tiles(&self) -> u32 {
        self.block_m / (16 * self.sdp_rows)
    }
    pub const fn sdp_n_tiles(&self) -> u32 {
        self.block_n / (8 * (self.warps / self.sdp_rows))
    }
    /// The n8 key tiles of S (and of dP) a warp holds at once: its share in `sdp_chunks` chunks.
    pub const fn sdp_chunk_tiles(&self) -> u32 {
        self.sdp_n_tiles() / self.sdp_chunks
    }
    /// m16 key tiles and n8 column tiles of a warp's share of dK and dV.
    pub const fn kv_m_tiles(&self) -> u32 {
        self.block_n / (16 * self.kv_keys)
    }
    pub const fn kv_d_tiles(&self) -> u32 {
        self.head_dim / (8 * (self.warps / self.kv_keys))
    }
    /// m16 row tiles and n8 column tiles of a warp's share of dQ, and the n8 tiles it computes
    /// per pass (4 up to d96, else 2: the dQ accumulators are live beside dK and dV).
    pub const fn dq_m_tiles(&self) -> u32 {
        self.block_m / (16 * self.dq_rows)
    }
    pub const fn dq_d_tiles(&self) -> u32 {
        self.head_dim / (8 * (self.warps / self.dq_rows))
    }
    pub const fn dq_pass_tiles(&self) -> u32 {
        if self.wgmma {
            self.dq_d_tiles()
        } else if self.dq_d_tiles() % 4 == 0 && self.head_dim <= 96 {
            4
        } else {
            2
        }
    }
    pub const fn stage_bytes(&self) -> u32 {
        bwd_stage_bytes(self.block_m, self.block_n, self.head_dim, self.bias)
    }
    /// Whether the tile serves a call with the score modifiers `modifiers`.
    pub const fn serves(&self, modifiers: u8) -> bool {
        self.bias || modifiers == modifiers::NONE || modifiers == modifiers::MASK
    }
    /// K, V, then P and dS, then the stages, then each warp's dQ staging slice (not in the wgmma
    /// variant), then the kernel's copy of its parameters and its grid position.
    pub const fn smem_bytes(&self) -> u32 {
        self.params_offset() + BWD_PARAMS_BYTES + POSITION_BYTES
    }
    pub const fn params_offset(&self) -> u32 {
        let (m, n, d) = (self.block_m, self.block_n, self.head_dim);
        // The wgmma variant adds dQ to its accumulator straight from registers: no staging.
        let dq_stage = if self.wgmma { 0 } else { self.warps * BWD_DQ_STAGE_BYTES };
        2 * n * d * 2 + 2 * m * n * 2 + self.stages * self.stage_bytes() + dq_stage
    }
}

/// Bytes of the backward kernel's shared-memory copy of [`BwdParams`] (see `kernels-gpu`'s
/// `arch::params_in_smem`).
pub const BWD_PARAMS_BYTES: u32 = core::mem::size_of::<BwdParams>().next_multiple_of(16) as u32;

/// n8 tiles of dQ a backward warp stages in shared memory at once on their way to the f32
/// accumulator, and the bytes of its slice (16 rows x 8 f32 columns per tile).
pub const BWD_DQ_STAGE_TILES: u32 = 2;
pub const BWD_DQ_STAGE_BYTES: u32 = BWD_DQ_STAGE_TILES * 16 * 8 * 4;

/// Bytes of one backward pipeline stage: Q, dO, bias (where `bias`), packed mask, lse and delta
/// of one query tile (the kernel lays the stage out in this order), rounded up so that every
/// stage's tiles start on the 1024-byte boundaries wgmma's swizzle atoms need.
pub const fn bwd_stage_bytes(block_m: u32, block_n: u32, head_dim: u32, bias: bool) -> u32 {
    let (m, n, d) = (block_m, block_n, head_dim);
    (2 * m * d * 2 + bias as u32 * m * n * 2 + mask_tile_bytes(m, n) + 2 * m * 4).next_multiple_of(1024)
}

/// Bytes of a packed mask tile in shared memory: one bit per score (forward and backward).
pub const fn mask_tile_bytes(block_m: u32, block_n: u32) -> u32 {
    block_m * block_n / 8
}

/// The shipped backward tiles (none spills under ptxas for sm_80 or sm_90). Up to d128 a CTA
/// owns 128 keys: half the dQ reductions per score of 64-key tiles, and warp shares of 32 x 32
/// (S, dP) and 32 keys x d/2 (dK, dV; 128 accumulator registers at d128, where S and dP are
/// computed in two chunks and dQ two n8 tiles at a time to fit beside them). Wider heads take
/// 64 keys, their dK/dV split over 4 column groups of warps; d256 has room for one stage only.
pub const BWD_TILES: [BwdTile; 6] = [
    bwd(32, 128, 2, (2, 1), 4, 4),
    bwd(64, 128, 2, (2, 1), 4, 2),
    bwd(96, 128, 2, (2, 1), 4, 4),
    bwd(128, 128, 2, (2, 2), 4, 2),
    bwd(192, 64, 2, (2, 1), 2, 2),
    bwd(256, 64, 1, (2, 1), 2, 2),
];

/// The deterministic variants' tiles: their turn bookkeeping holds registers the default
/// kernels spend on tiles, so they take 64 keys (half the dK/dV accumulators up to d128).
pub const BWD_DET_TILES: [BwdTile; 6] = [
    bwd(32, 64, 2, (2, 1), 4, 4),
    bwd(64, 64, 2, (2, 1), 2, 2),
    bwd(96, 64, 2, (2, 1), 4, 4),
    bwd(128, 64, 2, (2, 1), 2, 2),
    bwd(192, 64, 2, (2, 1), 2, 2),
    bwd(256, 64, 1, (2, 1), 2, 2),
];

/// The Hopper (sm_90a, `wgmma`) tiles, for the default (atomic) mode: two warpgroups. S and dP
/// are 64 rows x 64 keys per warpgroup, dK and dV 64 keys x d, dQ 64 rows x d/2; a warp's share
/// is the 16 rows of the warpgroup's product it holds. At d64 calls without a bias take a
/// 128-row tile (each warpgroup S and dP for 64 rows x 128 keys, dQ for 64 rows x d): twice the
/// products per step for the step's fixed work; its stages have no room for a bias tile.
pub const BWD_WGMMA_TILES: [BwdTile; 3] =
    [BwdTile { block_m: 128, sdp_rows: 8, dq_rows: 8, bias: false, ..bwd_wgmma(64) }, bwd_wgmma(64), bwd_wgmma(128)];

/// A tile: `sdp` is (warps along the rows of S and dP, chunks each warp computes its share in).
const fn bwd(head_dim: u32, block_n: u32, stages: u32, sdp: (u32, u32), kv_keys: u32, dq_rows: u32) -> BwdTile {
    BwdTile { head_dim, block_m: 64, block_n, stages, warps: 8, sdp_rows: sdp.0, sdp_chunks: sdp.1, kv_keys, dq_rows, wgmma: false, bias: true }
}

const fn bwd_wgmma(head_dim: u32) -> BwdTile {
    BwdTile { wgmma: true, ..bwd(head_dim, 128, 2, (4, 1), 8, 4) }
}

/// The backward tile for a head dim and a call's score modifiers (`modifiers`): the Hopper one
/// where `wgmma` (the device runs the sm_90a module) and the table has one for the mode, else
/// the `mma.sync` one of the deterministic variant or the default one.
pub const fn bwd_tile(head_dim: u32, deterministic: bool, wgmma: bool, modifiers: u8) -> Option<BwdTile> {
    if wgmma
        && !deterministic
        && let Some(t) = bwd_tile_in(&BWD_WGMMA_TILES, head_dim, modifiers)
    {
        return Some(t);
    }
    bwd_tile_in(if deterministic { &BWD_DET_TILES } else { &BWD_TILES }, head_dim, modifiers)
}

/// The first tile of `tiles` for `head_dim` that serves `modifiers`.
const fn bwd_tile_in(tiles: &[BwdTile], head_dim: u32, modifiers: u8) -> Option<BwdTile> {
    let mut i = 0;
    while i < tiles.len() {
        if tiles[i].head_dim == head_dim && tiles[i].serves(modifiers) {
            return Some(tiles[i]);
        }
        i += 1;
    }
    None
}

/// Threads per block of the preprocessing and conversion kernels.
pub const PRE_THREADS: u32 = 256;

/// Granularity of the mask block map: one class per `BLOCK_MAP_Q x BLOCK_MAP_K` tile. Every
/// kernel tile is a whole number of these, so forward and backward read the same map.
pub const BLOCK_MAP_Q: u32 = 64;
pub const BLOCK_MAP_K: u32 = 64;

/// Class of one mask block.
pub mod block_class {
    /// No visible key: the tile is skipped entirely.
    pub const EMPTY: u8 = 0;
    /// Some keys visible: the mask is applied element by element.
    pub const PARTIAL: u8 = 1;
    /// Every in-bounds element visible: no mask load and no mask math.
    pub const FULL: u8 = 2;

    /// The class of a block in which `any` score is visible and `all` in-bounds ones are.
    pub const fn of(any: bool, all: bool) -> u8 {
        match (any, all) {
            (false, _) => EMPTY,
            (true, true) => FULL,
            (true, false) => PARTIAL,
        }
    }
}

/// Keys per packed mask word.
pub const MASK_WORD_KEYS: u32 = 64;

/// Bit of key `k` (0..64) within its packed mask word. Ordered for the MMA accumulator layout:
/// with `k = 8 nt + 2 t + e` (n8 tile `nt`, quad lane `t`, element `e`), bit `16 t + 2 nt + e`,
/// so each lane finds all of its keys of a row in one 16-bit half-word (`t`).
pub const fn mask_bit(k: u32) -> u32 {
    let (nt, t, e) = (k / 8, (k % 8) / 2, k % 2);
    16 * t + 2 * nt + e
}

/// The packed bits ([`mask_bit`] order) of keys `k..k + 4` from their four mask bytes `x`
/// (little-endian; a nonzero byte is visible), `k` a multiple of 4: a few word operations
/// instead of four byte tests.
pub const fn mask_bits_of_bytes(x: u32, k: u32) -> u64 {
    // 0x80 in each nonzero byte (0x7f + 0x7f carries into no other byte).
    let nonzero = (((x & 0x7f7f_7f7f) + 0x7f7f_7f7f) | x) & 0x8080_8080;
    // Keys k + 1, k + 2, k + 3 sit 1, 16 and 17 bits above key k.
    let spread = ((nonzero >> 7) & 0x0001_0001) | ((nonzero >> 14) & 0x0002_0002);
    (spread as u64) << mask_bit(k)
}

/// Keys `8 nt..8 nt + 8` of a packed mask word ([`mask_bit`] order) as a byte, bit `k` for key
/// `8 nt + k`: the inverse of the packing for one n8 tile's keys.
pub const fn mask_word_byte(word: u64, nt: u32) -> u32 {
    // Key 8 nt + 2 t + e is bit 16 t + 2 nt + e: shifted down by 2 nt, bits 16 t + e; each
    // quad-lane pair moves down to bits 2 t + e.
    let x = (word >> (2 * nt)) & 0x0003_0003_0003_0003;
    ((x | x >> 14 | x >> 28 | x >> 42) & 0xff) as u32
}

/// Parameters of the kernel that prepares a score mask `[mb, mh, mq, sk]` (zero strides where
/// broadcast, a key-broadcast mask given as stride 0 over `sk` keys) for the attention kernels:
/// - `classes`: u8 `[mb, mh, q_blocks, k_blocks]`, one [`block_class`] per 64x64 block;
/// - `bits`: u64 words `[mb, mh, mq, k_blocks]`, the mask packed in [`mask_bit`] order, zero past
///   `sk`;
///
/// each written through its view's strides (in bytes and in words; unit along `k_blocks`).
///
/// A packed batch (`seqs.cu_q` set) gives a mask of each sequence `b` of `mb`: its rows and key 0
/// placed in the mask and in both outputs by the kernels' `Seq::origin` (`stride[0]` per packed
/// key, `stride[2]` per packed query row), its lengths from `seqs`; its rows are its queries
/// where `seq_rows` is set (a query-based mask), else `mq` = 1 row (key-side). Blocks past a
/// sequence's lengths are not written.
///
/// The mask is bool bytes (nonzero = visible), or where `packed` is set, bits: key `j` of a row
/// is bit `j % 8` of the row's byte `j / 8` (bytes contiguous along the keys, `stride[3]` unused;
/// fixed lengths only).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MaskPackParams {
    pub mask: View4,
    pub classes: View4,
    pub bits: View4,
    /// `[mb, mh, mq, sk]`; a packed batch's `[sequences, mh, {1|max_seqlen_q}, max_seqlen_k]`.
    pub dims: [u32; 4],
    pub packed: u32,
    pub seq_rows: u32,
    pub seqs: Seqs,
}

/// Parameters of the kernel that applies a block mask to the 64x64 block classes: output class
/// `[pb, ph, qb, kb]` (contiguous, `dims`) is EMPTY unless the mask's block holding it is kept,
/// else the per-score part's class (`classes_in`, broadcast through zero strides) or FULL without
/// one. The block mask is given as kept flags (u8, nonzero = kept) of `cell`-sized cells
/// `[pb, ph, cell_rows, cell_cols]` (zero strides where broadcast); a block of `block` scores
/// (`block` a multiple of `cell`) is kept if any of its cells is, which turns 64x64 classes into a
/// 128x128 block mask.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockMaskParams {
    pub cells: View4,
    pub cell_rows: u32,
    pub cell_cols: u32,
    pub cell: u32,
    pub block: u32,
    pub classes_in: View4,
    pub classes: u64,
    /// `[pb, ph, q_blocks, k_blocks]` of the output.
    pub dims: [u32; 4],
}

/// Parameters of the key-compaction kernels (a count pass, then the compaction, both over chunks
/// of `COMPACT_THREADS x COMPACT_KEYS_PER_THREAD` keys): for each plane `[mb, mh]` of a
/// query-broadcast mask (`[mb, mh, 1, sk]`, bool bytes, or bits as in [`MaskPackParams::packed`]),
/// the kept keys' indices in ascending order (`pos`, i32 `[planes, sk]`, -1 past the count), each key's slot in that list (`slot`, i32
/// `[planes, sk]`, -1 for a hidden key), the kept keys at or before each key (`ranks`, i32
/// `[planes, sk]`) and the count (`counts`, u32 `[planes]`); `chunk_counts`
/// (u32 `[planes, chunks]`) passes each chunk's count from the first pass to the second. Planes
/// are `plane_stride` elements apart (`sk` rounded up to a 64-key block: a gathered problem's
/// keys, read from `pos`, are whole blocks; -1 past the count up to the stride).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyCompactParams {
    pub mask: View4,
    pub pos: u64,
    pub slot: u64,
    pub ranks: u64,
    pub counts: u64,
    pub chunk_counts: u64,
    /// `[mb, mh, sk]`.
    pub dims: [u32; 3],
    pub packed: u32,
    pub plane_stride: u32,
    pub _pad: u32,
}

/// Threads per block of the key-compaction kernels (one block per chunk of a plane) and the keys
/// each thread takes.
pub const COMPACT_THREADS: u32 = 64;
pub const COMPACT_KEYS_PER_THREAD: u32 = 16;

/// Which compacted key list an operand's `(batch, head)` reads: the list of plane
/// `(x * batch, (y / head_div) * head)` (strides in i32 elements, zero where broadcast). A null
/// `ptr` is the identity list (entry `c` is `c`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyLists {
    pub ptr: u64,
    pub batch: u64,
    pub head: u64,
    pub head_div: u32,
    pub _pad: u32,
}

/// Parameters of the row-gather kernel: output row `(x, y, q, c)` of `dims` (`row_bytes` bytes,
/// at `dst + x dst_stride[0] + y dst_stride[1] + q dst_stride[2] + c dst_stride[3]`, byte strides)
/// is source row `(x, y / src_head_div, q, lists[c])` (zero strides where broadcast), or zeros
/// past the list's end (-1). Copied in `unit`-byte pieces (16, or 2 where a row or stride is not
/// 16-byte aligned). Gathers K and V rows and a bias's key columns.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GatherParams {
    pub src: u64,
    pub src_stride: [u64; 4],
    pub dst: u64,
    pub dst_stride: [u64; 4],
    /// `[X, Y, Q, W]` of the output.
    pub dims: [u32; 4],
    pub row_bytes: u32,
    pub unit: u32,
    pub src_head_div: u32,
    /// 1: rows past a list's end are left unwritten (a gathered forward reads none of them)
    /// instead of zeroed.
    pub skip_missing: u32,
    pub lists: KeyLists,
}

/// Parameters of the scatter kernel, the gather's adjoint: output row `(x, y, q, j)` of `dims`
/// (`row_elems` 16-bit elements, byte strides) is the sum over the source rows
/// `(x ratio[0] + a, y ratio[1] + b, q, slot[j])`, `a < ratio[0]`, `b < ratio[1]`, whose key list
/// (`lists` read at `(x ratio[0] + a, y ratio[1] + b)` and key `j`) holds key `j`, in that fixed
/// order (f32 sums; zero where none does). Writes dK, dV and dbias from their gathered forms.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ScatterParams {
    pub src: u64,
    pub src_stride: [u64; 4],
    pub dst: u64,
    pub dst_stride: [u64; 4],
    /// `[X, Y, Q, sk]` of the output.
    pub dims: [u32; 4],
    pub ratio: [u32; 2],
    pub row_elems: u32,
    pub unit: u32,
    /// The key slots (`KeyCompactParams::slot`) by source plane.
    pub slots: KeyLists,
}

/// Parameters of the kernel that writes the mask of a gathered problem: for each plane
/// `[mb, mh]`, block classes `[mb, mh, q_blocks, k_blocks]` and bits `[mb, mh, sq, k_blocks]` (as
/// [`MaskPackParams`] writes them, every word written) over the `k_blocks * 64` gathered keys,
/// compacted key `c` of plane `p` being original key `pos[p][c]` (ascending, -1 past the count):
/// visible to query `i` iff `band` shows original key `pos[c]` to it in a problem of `seqlen_q`
/// queries and `seqlen_k` keys.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GatherMaskParams {
    pub pos: u64,
    /// Elements between planes' key lists.
    pub pos_plane: u64,
    pub classes: u64,
    pub bits: u64,
    pub band: Band,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub q_blocks: u32,
    pub k_blocks: u32,
}

/// Parameters of the kernel that turns index lists (`attn_indices`: i32 `[pb, ph, rows, w]` through
/// element strides, -1 = padding) into bit-packed score masks: key `j` of row `r` is bit `j % 32` of
/// u32 word `r * row_words + j / 32` of `bits` (zeroed before; the packed-bits byte order). An entry
/// below -1 or at or past `seqlen_k` sets `error` to 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IndicesParams {
    pub indices: View4,
    pub bits: u64,
    pub error: u64,
    /// `[pb, ph, rows, w]`.
    pub dims: [u32; 4],
    pub seqlen_k: u32,
    pub row_words: u32,
}

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

/// Launch bounds the link step writes into the PTX (`.maxntid`, `.minnctapersm`), CUDA's
/// `__launch_bounds__`: (kernel name, threads per block, CTAs per SM to fit). ptxas then keeps
/// each thread's registers within what that many CTAs leave; the host launches these kernels
/// with exactly these threads.
pub const LAUNCH_BOUNDS: [(&str, u32, u32); 26] = [
    (names::SELECT_KEYS_16, SELECT_THREADS, select_ctas_per_sm(2)),
    (names::SELECT_KEYS_32, SELECT_THREADS, select_ctas_per_sm(4)),
    (names::FWD_BF16_D64_GATHER_NARROW, 128, GATHER_NARROW_CTAS_PER_SM),
    (names::FWD_F16_D64_GATHER_NARROW, 128, GATHER_NARROW_CTAS_PER_SM),
    (names::FWD_SM90_BF16_D64_GATHER_NARROW, 128, GATHER_NARROW_CTAS_PER_SM),
    (names::FWD_SM90_F16_D64_GATHER_NARROW, 128, GATHER_NARROW_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d64", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d64_mods", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d64_mods_gather", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d64_mods_packed", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d64_mods_paged", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d64", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d64_mods", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d64_mods_gather", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d64_mods_packed", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d64_mods_paged", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d128", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d128_mods", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d128_mods_gather", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d128_mods_packed", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d128_mods_paged", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d128", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d128_mods", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d128_mods_gather", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d128_mods_packed", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d128_mods_paged", 256, FWD_SM90_CTAS_PER_SM),
];

/// CTAs per SM the Hopper forward's 128-row tiles are compiled for. Each CTA's two warpgroups
/// meet at the same barriers and so reach their products and softmaxes together; a second CTA
/// on the SM, on its own schedule, keeps the tensor cores busy through one CTA's softmax (one
/// CTA per SM, at 166-188 registers, was slower than `mma.sync`: H100, b2 h32 hk8 8K, d64
/// dense 4.54 ms against 3.55).
pub const FWD_SM90_CTAS_PER_SM: u32 = 2;

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

/// Threads per block of the gather, scatter and gathered-mask kernels.
pub const GATHER_THREADS: u32 = 256;

/// Threads per block of the block-mask kernel (one output class each).
pub const BLOCK_MASK_THREADS: u32 = 256;

/// Threads per block of the mask-pack kernel: 4 per row of a 64x64 block.
pub const MASK_PACK_THREADS: u32 = 256;

/// Tile shape of a forward kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FwdTile {
    pub head_dim: u32,
    /// Query rows per CTA.
    pub block_m: u32,
    /// Keys per pipeline stage.
    pub block_n: u32,
    pub warps: u32,
    /// Hopper variant (sm_90a module, [`FWD_TILES_SM90`]): S = QKᵀ and O += PV are warpgroup
    /// `wgmma`s (Q, K and V read from shared memory, P from registers), one warp per 16 query rows.
    pub wgmma: bool,
}

impl FwdTile {
    pub const fn threads(&self) -> u32 {
        self.warps * 32
    }
    /// Query rows each warp owns, in 16-row MMA tiles.
    pub const fn m_tiles_per_warp(&self) -> u32 {
        self.block_m / (16 * self.warps)
    }
    /// Dynamic shared memory: Q, K, V tiles, the bias and packed-mask tiles of one key block,
    /// the gather variant's key positions, the CTA's grid position, then the online softmax's
    /// running state.
    pub const fn smem_bytes(&self) -> u32 {
        let qkv = (self.block_m + 2 * self.block_n) * self.head_dim * 2;
        qkv + self.bias_tile_bytes() + self.mask_tile_bytes() + self.key_pos_bytes() + POSITION_BYTES + self.softmax_state_bytes()
    }
    /// The gather variant's key positions of two key tiles (the current one's and the next's).
    pub const fn key_pos_bytes(&self) -> u32 {
        2 * self.block_n * 4
    }
    /// A running max and sum (f32) per thread per row it holds: two rows per 16-row MMA tile.
    pub const fn softmax_state_bytes(&self) -> u32 {
        self.threads() * self.m_tiles_per_warp() * 2 * 2 * 4
    }
    pub const fn bias_tile_bytes(&self) -> u32 {
        self.block_m * self.block_n * 2
    }
    pub const fn mask_tile_bytes(&self) -> u32 {
        mask_tile_bytes(self.block_m, self.block_n)
    }
}

/// Forward kernels shipped for one head dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FwdVariants {
    /// The lean variant (no mask, bias or softcap), where it fits in registers without spills;
    /// without one, the modifier variant serves every call.
    pub plain: Option<FwdTile>,
    /// The variant with score modifiers.
    pub mods: FwdTile,
    /// A tile of fewer query rows for the gather variant, where the modifier tile's grid would
    /// leave the GPU under two CTAs per SM ([`gather_tile`]).
    pub gather_narrow: Option<FwdTile>,
}

/// CTAs per SM the narrow gather tiles are compiled for (registers bounded to fit them).
pub const GATHER_NARROW_CTAS_PER_SM: u32 = 3;

/// The gather variant's tile for a grid of `ctas` CTAs (query tiles x heads x batch) with the
/// modifier tile on a GPU of `sms` SMs: the narrow tile where it has one and that grid is under
/// two CTAs per SM (the modifier tile's occupancy at d64). A gathered query tile visits few key
/// tiles, each a chain of dependent steps; half the rows per CTA and three CTAs per SM hide
/// more of that latency than key splits, which add a combine pass (H100, b1 h2 d64, 16K
/// queries, 1024 kept keys: 128-row tiles with 2 key splits 0.080-0.088 ms, 64-row tiles
/// 0.061 ms; at 32K queries, 512 CTAs, the 128-row tile is the faster, 0.083-0.093 against
/// 0.098-0.100 ms). At d128 a 64-row tile was slower throughout (b1 h16 hk4, 2048 kept keys,
/// 8K queries: 0.375 against 0.331 ms), as were 8 warps on 128 rows at d64 and d128.
pub const fn gather_tile(v: &FwdVariants, ctas: u64, sms: u32) -> (FwdTile, bool) {
    match v.gather_narrow {
        Some(t) if ctas < 2 * sms as u64 => (t, true),
        _ => (v.mods, false),
    }
}

const fn tile(head_dim: u32, block_m: u32, block_n: u32, warps: u32) -> FwdTile {
    FwdTile { head_dim, block_m, block_n, warps, wgmma: false }
}

/// A Hopper forward tile: a warpgroup per 64 query rows, so that each warp's 16 rows are its
/// share of the warpgroup's m64 products.
const fn wgmma_tile(head_dim: u32, block_m: u32, block_n: u32) -> FwdTile {
    FwdTile { head_dim, block_m, block_n, warps: block_m / 16, wgmma: true }
}

/// The shipped forward tiles. Shapes are chosen per head dim so that no variant spills under
/// ptxas for sm_80 or sm_90 (`cargo xtask ptxas` checks; the GPU test `no_kernel_spills_on_this_gpu`
/// checks the driver's own compilation). 32 query rows per warp halve the shared-memory reads per
/// MMA against 16; up to d128 both variants afford it (d128: 253-255 and 249-255 registers),
/// d192 and d256 do not. d64 takes 128-key tiles (255 registers): half the barriers and
/// per-tile bookkeeping per key, ~15 % faster on training shapes, though 28 % slower on
/// sparse decoding at 512K keys, where each visited tile carries twice the keys.
pub const FWD_TILES: [FwdVariants; 6] = [
    FwdVariants { plain: Some(tile(32, 128, 64, 4)), mods: tile(32, 128, 64, 4), gather_narrow: None },
    FwdVariants { plain: Some(tile(64, 128, 128, 4)), mods: tile(64, 128, 128, 4), gather_narrow: Some(tile(64, 64, 128, 4)) },
    FwdVariants { plain: Some(tile(96, 128, 64, 4)), mods: tile(96, 128, 64, 4), gather_narrow: None },
    FwdVariants { plain: Some(tile(128, 128, 64, 4)), mods: tile(128, 128, 64, 4), gather_narrow: None },
    FwdVariants { plain: Some(tile(192, 64, 64, 4)), mods: tile(192, 64, 64, 4), gather_narrow: None },
    FwdVariants { plain: Some(tile(256, 128, 64, 8)), mods: tile(256, 128, 64, 8), gather_narrow: None },
];

/// The Hopper forward tiles (sm_90a module, `names::FWD_WGMMA_PREFIX`): the portable tiles'
/// shapes, so that the work orders, key splits and gather tile choice are theirs, with a warp per
/// 16 query rows.
pub const FWD_TILES_SM90: [FwdVariants; 2] = [
    FwdVariants { plain: Some(wgmma_tile(64, 128, 128)), mods: wgmma_tile(64, 128, 128), gather_narrow: Some(wgmma_tile(64, 64, 128)) },
    FwdVariants { plain: Some(wgmma_tile(128, 128, 64)), mods: wgmma_tile(128, 128, 64), gather_narrow: None },
];

/// The forward kernels for a head dimension: the Hopper module's where `wgmma` (the GPU runs
/// it) and it has that head dim, else the portable ones.
pub const fn fwd_variants_for(head_dim: u32, wgmma: bool) -> Option<FwdVariants> {
    if wgmma {
        let mut i = 0;
        while i < FWD_TILES_SM90.len() {
            if FWD_TILES_SM90[i].mods.head_dim == head_dim {
                return Some(FWD_TILES_SM90[i]);
            }
            i += 1;
        }
    }
    fwd_variants(head_dim)
}

/// The portable kernels shipped for a head dimension.
pub const fn fwd_variants(head_dim: u32) -> Option<FwdVariants> {
    let mut i = 0;
    while i < FWD_TILES.len() {
        if FWD_TILES[i].mods.head_dim == head_dim {
            return Some(FWD_TILES[i]);
        }
        i += 1;
    }
    None
}

/// Device element types of q/k/v/o (and bias) on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceElem {
    F16,
    Bf16,
}

impl DeviceElem {
    pub const fn name(self) -> &'static str {
        match self {
            DeviceElem::F16 => "f16",
            DeviceElem::Bf16 => "bf16",
        }
    }
}

/// The score modifiers a kernel variant compiles in. A lean variant leaves the others' code
/// (and registers) out: the backward with a mask but no bias or softcap runs as fast as without
/// a mask wherever the mask's tiles are full, and a bias without a softcap skips the softcap's
/// derivative in every score.
pub mod modifiers {
    /// None: plain and causal attention.
    pub const NONE: u8 = 0;
    /// A mask; no bias, no softcap (the Hopper backward only).
    pub const MASK: u8 = 1;
    /// A bias, and a mask if given; no softcap (the Hopper backward only). Its mask tiles are
    /// the score bits alone, not narrowed by block classes: a mask with block parts (whose
    /// visited tiles may hold empty blocks over shown bits) takes `ALL` instead.
    pub const BIAS: u8 = 2;
    /// Mask, bias and softcap, each if given.
    pub const ALL: u8 = 3;

    /// The kernel-name suffix of a variant.
    pub const fn suffix(modifiers: u8) -> &'static str {
        match modifiers {
            NONE => "",
            MASK => "_mask",
            BIAS => "_bias",
            _ => "_mods",
        }
    }

    /// Whether a backward variant runs where `BwdParams::kv_heads_first` and a work order
    /// (`FwdParams::order`) place it: the lean ones (`MASK`, `BIAS`). The others read their block
    /// index (the kernels at the register limit have no room to hold a placed position).
    pub const fn bwd_placed(variant: u8) -> bool {
        variant == MASK || variant == BIAS
    }
}

/// Exported kernel names, built by one rule on both sides: `dmattn_fwd_<elem>_d<head_dim>`, with
/// the variant's suffix (`modifiers::suffix`) appended.
pub mod names {
    pub const MASK_PACK: &str = "dmattn_mask_pack";
    /// The mask pack for key-side masks (one row a plane): a warp per 64-key word.
    pub const MASK_PACK_KEYS: &str = "dmattn_mask_pack_keys";
    pub const BLOCK_MASK: &str = "dmattn_block_mask";
    pub const KEY_COUNT: &str = "dmattn_key_count";
    pub const KEY_COMPACT: &str = "dmattn_key_compact";
    pub const GATHER_ROWS: &str = "dmattn_gather_rows";
    pub const INDICES_BITS: &str = "dmattn_indices_bits";
    pub const GATHER_MASK: &str = "dmattn_gather_mask";
    /// Key selection over 16-bit (bf16, f16) and 32-bit (f32) bias elements.
    pub const SELECT_KEYS_16: &str = "dmattn_select_keys_16";
    pub const SELECT_KEYS_32: &str = "dmattn_select_keys_32";
    /// `dmattn_scatter_rows_<elem>`.
    pub const SCATTER_ROWS_PREFIX: &str = "dmattn_scatter_rows_";
    pub const BWD_PREFIX: &str = "dmattn_bwd_";
    /// The Hopper backward kernels (sm_90a module): `dmattn_bwd_sm90_<elem>_d<dim>[_mask|_bias|_mods]`.
    pub const BWD_WGMMA_PREFIX: &str = "dmattn_bwd_sm90_";
    /// Appended to a backward kernel's name for its deterministic variant, which adds dQ and
    /// dBias in a fixed order (bit-identical runs) instead of with atomics.
    pub const DETERMINISTIC_SUFFIX: &str = "_det";
    /// Appended to a Hopper backward kernel's name (plain and `_mask` variants) for its variant
    /// that takes any band ([`super::Band::needs_band_kernel`]): the others take only bands
    /// without a left edge or compression, whose code then folds away (the backward's tiles are
    /// at the register limit). Of the portable backward, the `_mods` variants take any band.
    pub const BAND_SUFFIX: &str = "_band";
    /// Appended to a forward kernel's modifier-variant name (`dmattn_fwd_<elem>_d<dim>_mods`)
    /// for its gather-attention variant ([`super::FwdParams::key_ranks`]).
    pub const GATHER_SUFFIX: &str = "_gather";
    /// Appended to a forward kernel's modifier-variant name for its packed-batch variant
    /// ([`super::Seqs`]; its own kernel: the sequences' loads in the fixed-length one spilled
    /// it once the mask's origin moved per sequence).
    pub const PACKED_SUFFIX: &str = "_packed";
    /// Appended to a forward kernel's modifier-variant name for its paged-K/V variant
    /// ([`super::Seqs::block_table`], a packed batch's; its own kernel, without mask tiles: a
    /// branch in the modifier variants spilled them).
    pub const PAGED_SUFFIX: &str = "_paged";
    /// Appended to a gather variant's name for its narrow tile ([`super::FwdVariants::gather_narrow`]).
    pub const NARROW_SUFFIX: &str = "_narrow";
    /// The narrow gather variants (launch bounds, [`super::LAUNCH_BOUNDS`]).
    pub const FWD_BF16_D64_GATHER_NARROW: &str = "dmattn_fwd_bf16_d64_mods_gather_narrow";
    pub const FWD_F16_D64_GATHER_NARROW: &str = "dmattn_fwd_f16_d64_mods_gather_narrow";
    pub const FWD_SM90_BF16_D64_GATHER_NARROW: &str = "dmattn_fwd_sm90_bf16_d64_mods_gather_narrow";
    pub const FWD_SM90_F16_D64_GATHER_NARROW: &str = "dmattn_fwd_sm90_f16_d64_mods_gather_narrow";
    pub const BWD_PRE_PREFIX: &str = "dmattn_bwd_pre_";
    pub const CONVERT_PREFIX: &str = "dmattn_convert_";
    pub const COMBINE_PREFIX: &str = "dmattn_fwd_combine_";
    /// `dmattn_decode_<elem>_d<dim>`, and its paged-K/V kernel with [`PAGED_SUFFIX`]: the
    /// decoding forward ([`super::DecodeParams`]).
    pub const DECODE_PREFIX: &str = "dmattn_decode_";
    pub const FWD_PREFIX: &str = "dmattn_fwd_";
    /// `dmattn_fwd_sm90_<elem>_d<dim>[_mods[_gather[_narrow]|_packed|_paged]]`: the Hopper forward
    /// ([`super::FWD_TILES_SM90`]).
    pub const FWD_WGMMA_PREFIX: &str = "dmattn_fwd_sm90_";
    /// `dmattn_fwd_order_d<dim>`: the work order of that head dim's modifier variant.
    pub const FWD_ORDER_PREFIX: &str = "dmattn_fwd_order_d";
    /// `dmattn_bwd_order_n<block_n>`: the work order of a backward with that key tile.
    pub const BWD_ORDER_PREFIX: &str = "dmattn_bwd_order_n";
    /// `dmattn_softmax_rows_<elem>`: the materialising path's row softmax.
    pub const SOFTMAX_ROWS_PREFIX: &str = "dmattn_softmax_rows_";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Hopper forward tiles have the portable ones' shapes (the work-order kernels, built
    /// once per head dim, count tiles of that shape), a warpgroup per 64 rows, and fit the
    /// shared memory the portable tiles take.
    #[test]
    fn hopper_forward_tiles_match_the_portable_shapes() {
        for v in FWD_TILES_SM90 {
            let p = fwd_variants(v.mods.head_dim).unwrap();
            for (h, t) in [(v.mods, p.mods), (v.plain.unwrap(), p.plain.unwrap())].into_iter().chain(v.gather_narrow.zip(p.gather_narrow)) {
                assert!(h.wgmma && !t.wgmma);
                assert_eq!((h.head_dim, h.block_m, h.block_n), (t.head_dim, t.block_m, t.block_n));
                assert_eq!((h.m_tiles_per_warp(), h.block_m % 64), (1, 0));
                assert!(h.smem_bytes() <= 227 * 1024);
            }
            assert_eq!(fwd_variants_for(v.mods.head_dim, true), Some(v));
            assert_eq!(fwd_variants_for(v.mods.head_dim, false), Some(p));
        }
        assert_eq!(fwd_variants_for(96, true), fwd_variants(96));
    }

    #[test]
    fn block_class_of_any_and_all() {
        assert_eq!(block_class::of(false, false), block_class::EMPTY);
        assert_eq!(block_class::of(false, true), block_class::EMPTY);
        assert_eq!(block_class::of(true, false), block_class::PARTIAL);
        assert_eq!(block_class::of(true, true), block_class::FULL);
    }

    #[test]
    fn positions_unpack_to_what_was_packed() {
        for (x, y, z) in [(0, 0, 0), (1, 2, 3), (u32::MAX, 0xffff, 0xffff), (7, 0xffff, 0), (0, 0, 0xffff)] {
            assert_eq!(unpacked_position(packed_position(x, y, z)), (x, y, z));
        }
    }

    #[test]
    fn mask_word_byte_inverts_mask_bit() {
        // Each key alone, and a few mixed words, against the key-by-key packing.
        let pack = |keys: &[u32]| keys.iter().fold(0u64, |w, &k| w | 1 << mask_bit(k));
        for k in 0..MASK_WORD_KEYS {
            for nt in 0..8 {
                let want = if k / 8 == nt { 1 << (k % 8) } else { 0 };
                assert_eq!(mask_word_byte(pack(&[k]), nt), want, "key {k}, n8 tile {nt}");
            }
        }
        let keys = [0, 3, 9, 10, 17, 31, 32, 45, 46, 47, 60, 63];
        for nt in 0..8 {
            let want = keys.iter().filter(|&&k| k / 8 == nt).fold(0, |b, &k| b | 1 << (k % 8));
            assert_eq!(mask_word_byte(pack(&keys), nt), want);
        }
    }

    #[test]
    fn mask_bits_of_bytes_matches_mask_bit_key_by_key() {
        // Every byte value in every position, at every key offset of a word.
        for k in (0..MASK_WORD_KEYS).step_by(4) {
            for pos in 0..4 {
                for byte in 0..=255u32 {
                    let filler = [0u32, 0x01, 0xff][(byte % 3) as usize];
                    let bytes: [u32; 4] = core::array::from_fn(|i| if i == pos { byte } else { (filler + i as u32) & 0xff });
                    let x = bytes.iter().enumerate().fold(0, |x, (i, b)| x | b << (8 * i));
                    let want = (0..4).fold(0u64, |w, i| w | ((bytes[i] != 0) as u64) << mask_bit(k + i as u32));
                    assert_eq!(mask_bits_of_bytes(x, k), want, "k {k} bytes {bytes:02x?}");
                }
            }
        }
    }
}
