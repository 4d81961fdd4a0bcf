//! Tile shapes and kernel variants: the forward's and backward's tile tables, the modifier sets
//! a variant compiles in, and the launch bounds the link step writes.
use crate::{BwdParams, POSITION_BYTES, SELECT_THREADS, names, select_ctas_per_sm};

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

/// Whether the backward kernels of head dim `head_dim` (not deterministic) can split a key tile's
/// query tiles among CTAs (`BwdParams::q_split_shift`): d32 and d64. With the split compiled in,
/// the d96/d128 bias variants spilled (ptxas: 4-216 bytes), and the others ran their unsplit
/// calls 5-18 % slower (H100, same-run A/B: d128 50 % blocks 7.74 -> 9.16 ms, windows and
/// 4x-compressed causal 5-6 %); d64's cost 1-2 %.
pub const fn bwd_splits(head_dim: u32) -> bool {
    head_dim <= 64
}

/// Whether a backward of head dim `head_dim` on the Hopper kernels (`wgmma`) with variant
/// `modifiers` has a kernel of its own that splits query tiles (`names::SPLIT_SUFFIX`), for the
/// head dims whose kernels do not compile the split in ([`bwd_splits`]): d128 without a bias
/// (the bias variants sit at the register limit). Its unsplit calls keep the kernel without it.
pub const fn bwd_split_kernel(head_dim: u32, wgmma: bool, modifiers: u8) -> bool {
    wgmma && head_dim == 128 && (modifiers == modifiers::NONE || modifiers == modifiers::MASK)
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

/// Launch bounds the link step writes into the PTX (`.maxntid`, `.minnctapersm`), CUDA's
/// `__launch_bounds__`: (kernel name, threads per block, CTAs per SM to fit). ptxas then keeps
/// each thread's registers within what that many CTAs leave; the host launches these kernels
/// with exactly these threads.
pub const LAUNCH_BOUNDS: [(&str, u32, u32); 40] = [
    (names::SELECT_KEYS_16, SELECT_THREADS, select_ctas_per_sm(2)),
    (names::SELECT_KEYS_32, SELECT_THREADS, select_ctas_per_sm(4)),
    (names::FWD_BF16_D64_GATHER_NARROW, 128, GATHER_NARROW_CTAS_PER_SM),
    (names::FWD_F16_D64_GATHER_NARROW, 128, GATHER_NARROW_CTAS_PER_SM),
    (names::FWD_SM90_BF16_D64_GATHER_NARROW, 128, GATHER_NARROW_CTAS_PER_SM),
    (names::FWD_SM90_F16_D64_GATHER_NARROW, 128, GATHER_NARROW_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d64", fwd_ws_lean_threads(64), 1),
    ("dmattn_fwd_sm90_bf16_d64_packed", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_bf16_d64_paged", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_bf16_d64_mods", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d64_mods_ws", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_bf16_d64_mask", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_bf16_d64_mods_gather", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d64_mods_packed", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d64_mods_paged", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d64", fwd_ws_lean_threads(64), 1),
    ("dmattn_fwd_sm90_f16_d64_packed", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_f16_d64_paged", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_f16_d64_mods", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d64_mods_ws", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_f16_d64_mask", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_f16_d64_mods_gather", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d64_mods_packed", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d64_mods_paged", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d128", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_bf16_d128_packed", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_bf16_d128_paged", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_bf16_d128_mods", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_bf16_d128_mask", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_bf16_d128_mods_gather", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d128_mods_packed", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_bf16_d128_mods_paged", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d128", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_f16_d128_packed", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_f16_d128_paged", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_f16_d128_mods", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_f16_d128_mask", FWD_WS_THREADS, 1),
    ("dmattn_fwd_sm90_f16_d128_mods_gather", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d128_mods_packed", 256, FWD_SM90_CTAS_PER_SM),
    ("dmattn_fwd_sm90_f16_d128_mods_paged", 256, FWD_SM90_CTAS_PER_SM),
];

/// Whether the Hopper module keeps the two-CTA modifier kernel (the `mods` tile) for fixed-length
/// calls beside the warp-specialised one (`mods_ws`, named with `names::WS_SUFFIX` there): at d64,
/// where the second CTA an SM hides the prologue and epilogue of calls over few key tiles (see
/// the host's `WS_MIN_KEY_TILES`). d128 has the warp-specialised kernel alone.
pub const fn fwd_sm90_two_cta_mods(head_dim: u32) -> bool {
    head_dim == 64
}

/// Whether the Hopper module has a lean packed-batch forward for `head_dim`
/// (`dmattn_fwd_sm90_<elem>_d<dim>_packed`, and `.._paged` over paged K/V: packed batches
/// without mask, bias or softcap, on the warp-specialised kernel; the others run the modifier
/// variant's packed or paged kernel, whose tiles then give both the same bits): every head dim
/// it has tiles for. (On the earlier lean kernel, at two CTAs an SM, d64's sequence bounds
/// spilled it at its 128-register cap.)
pub const fn fwd_sm90_lean_packed(head_dim: u32) -> bool {
    matches!(head_dim, 64 | 128)
}

/// CTAs per SM the Hopper forward's 128-row `fwd.rs` tiles are compiled for: the gather, packed
/// and paged modifier variants, and d64's fixed-length one over few key tiles (the lean
/// variants and the other fixed-length modifier ones are warp-specialised, one CTA an SM). Each CTA's two warpgroups
/// meet at the same barriers and so reach their products and softmaxes together; a second CTA
/// on the SM, on its own schedule, keeps the tensor cores busy through one CTA's softmax (one
/// CTA per SM, at 166-188 registers, was slower than `mma.sync`: H100, b2 h32 hk8 8K, d64
/// dense 4.54 ms against 3.55).
pub const FWD_SM90_CTAS_PER_SM: u32 = 2;

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
    /// Warp-specialised (sm_90a, [`FWD_WS_STAGES`]-deep K/V ring): a producer warpgroup of its
    /// own copies the K and V tiles; the `warps` are the consumers.
    pub producer: bool,
    /// A warp-specialised tile whose kernel takes the score modifiers (mask, bias, softcap,
    /// split-KV, work order): each ring slot also holds a bias tile (the packed-mask tiles: one a
    /// slot, or one in all beside a bias ring, [`fwd_ws_mask_slots`]), and the
    /// producer passes each key tile's index and fullness to the consumers.
    pub modifiers: bool,
    /// A modifier tile whose ring slots hold no bias tile: its kernel takes a mask alone (no
    /// bias or softcap), on 128-key tiles that would not fit beside the bias ring.
    pub mask_only: bool,
}

/// K/V tiles in flight in a warp-specialised forward: the consumers multiply one while the
/// producer fills the next.
pub const FWD_WS_STAGES: u32 = 2;

/// Query tiles in flight in a warp-specialised forward (`fwd_ws_q_slots`): the lean kernel over
/// fixed lengths is persistent where [`fwd_ws_persistent`] says so, and its producer copies the
/// next query tile's Q while the consumers finish the current one and store its O.
pub const FWD_WS_Q_SLOTS: u32 = 2;

/// Whether the lean fixed-length forward at `head_dim` is persistent (`FwdTmaParams`). At d128 it
/// is (same run against a CTA a query tile, H200, b2 h32 hk8, forward ms: dense 8K 3.221 ->
/// 3.146, causal 8K 1.742 -> 1.710, causal window 1024 at 16K 1.150 -> 1.037, 16K x 256
/// compressed causal 0.433 -> 0.339). The d64 kernel (three consumer warpgroups at 160
/// registers) ran slower persistent: dense 8K 2.044 -> 2.308, causal 1.188 -> 1.348, so it keeps
/// a CTA a query tile.
pub const fn fwd_ws_persistent(head_dim: u32) -> bool {
    head_dim == 128
}

/// Q slots of a warp-specialised forward: [`FWD_WS_Q_SLOTS`] for a lean tile, one with
/// modifiers (a CTA a query tile; no room beside a bias ring).
pub const fn fwd_ws_q_slots(modifiers: bool) -> u32 {
    if modifiers { 1 } else { FWD_WS_Q_SLOTS }
}

/// Barriers of a warp-specialised forward: a full and an empty one per Q slot, a full and an
/// empty one per slot of the K and V rings, and one the consumers arrive on once they have read
/// a key tile's mask bits (the single mask slot beside a bias ring, see [`fwd_ws_mask_slots`]).
pub const FWD_WS_BARRIERS: u32 = 2 * FWD_WS_Q_SLOTS + 4 * FWD_WS_STAGES + 1;

/// Packed-mask slots of a warp-specialised modifier forward: one per ring slot, but one in all
/// beside a bias ring (`bias_ring`). There, on 128-key tiles at d128, Q, the K, V and bias rings
/// take 224 KB of the 227 a CTA may have: the producer copies a tile's mask bits once the
/// consumers have read the last tile's (they do at the tile's start, a product ahead of the
/// copy), and the consumers keep their softmax state in registers.
pub const fn fwd_ws_mask_slots(bias_ring: bool) -> u32 {
    if bias_ring { 1 } else { FWD_WS_STAGES }
}

/// Register limits (`setmaxnreg`) of a warp-specialised forward's warpgroups: the producer keeps
/// what its copies' addresses need, two consumer warpgroups the rest of the 64K (one CTA per
/// SM, launched at 384 threads, 168 registers each).
pub const FWD_WS_PRODUCER_REGS: u32 = 40;
pub const FWD_WS_CONSUMER_REGS: u32 = 232;
/// The same with modifiers, where the producer also walks the block map and loads bias and mask
/// tiles (on 128-key tiles the d128 kernel's producer spilled 4 bytes at 56 registers, 8 at 64,
/// none at 72), and over paged K/V, where it looks up each row's page (at 40 registers d128
/// spilled 100 bytes). The two take the CTA's 64,512 registers exactly.
pub const FWD_WS_MODS_PRODUCER_REGS: u32 = 72;
pub const FWD_WS_MODS_CONSUMER_REGS: u32 = 216;
/// Three consumer warpgroups (512 threads, launched at 128 registers each): the lean producer
/// and consumers split the 64K exactly (FlashAttention-3's split). A paged producer's lookups
/// need more, which three consumers cannot spare (at 152 registers they spilled 48 bytes at
/// d64): packed batches take two ([`fwd_ws_packed_tile`]).
pub const FWD_WS3_PRODUCER_REGS: u32 = 32;
pub const FWD_WS3_CONSUMER_REGS: u32 = 160;

/// Threads of a warp-specialised forward CTA of two consumer warpgroups and the producer.
pub const FWD_WS_THREADS: u32 = 384;

/// The Hopper lean forward's tile for packed batches, contiguous or paged (both on one tile, so
/// that they give the same bits): the fixed-length lean tile's keys with two consumer warpgroups
/// (see [`FWD_WS3_PRODUCER_REGS`]).
pub const fn fwd_ws_packed_tile(v: &FwdVariants) -> Option<FwdTile> {
    match v.plain {
        Some(t) if t.producer => Some(ws_tile(t.head_dim, 128, t.block_n)),
        _ => None,
    }
}

/// The Hopper lean forward's threads at `head_dim` (its warp-specialised tile's).
pub const fn fwd_ws_lean_threads(head_dim: u32) -> u32 {
    match fwd_variants_for(head_dim, true) {
        Some(FwdVariants { plain: Some(t), .. }) if t.producer => t.threads(),
        _ => panic!("no warp-specialised lean forward at this head dim"),
    }
}

impl FwdTile {
    pub const fn threads(&self) -> u32 {
        self.consumer_threads() + if self.producer { 128 } else { 0 }
    }
    /// The threads that compute (all of them, but for a warp-specialised tile's producer).
    pub const fn consumer_threads(&self) -> u32 {
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
        if self.producer {
            // The Q slots, the K and V rings, with modifiers the bias ring and mask slots, the
            // tiles' indices and the grid position (lean: the Q slots' tile indices), then the
            // softmax state (in registers beside a bias ring) and the barriers.
            let q_slots = fwd_ws_q_slots(self.modifiers);
            let qkv = (q_slots * self.block_m + 2 * FWD_WS_STAGES * self.block_n) * self.head_dim * 2;
            let bias_ring = self.ws_bias_ring();
            let words = if self.modifiers {
                let bias = if bias_ring { self.bias_tile_bytes() } else { 0 };
                FWD_WS_STAGES * (bias + 4) + fwd_ws_mask_slots(bias_ring) * self.mask_tile_bytes() + POSITION_BYTES
            } else {
                4 * q_slots
            };
            let softmax = if bias_ring { 0 } else { self.softmax_state_bytes() };
            return qkv + words + softmax + 8 * FWD_WS_BARRIERS;
        }
        let qkv = (self.block_m + 2 * self.block_n) * self.head_dim * 2;
        qkv + self.bias_tile_bytes() + self.mask_tile_bytes() + self.key_pos_bytes() + POSITION_BYTES + self.softmax_state_bytes()
    }
    /// A warp-specialised modifier tile whose ring slots hold bias tiles (see
    /// [`fwd_ws_mask_slots`]).
    pub const fn ws_bias_ring(&self) -> bool {
        self.producer && self.modifiers && !self.mask_only
    }
    /// The gather variant's key positions of two key tiles (the current one's and the next's).
    pub const fn key_pos_bytes(&self) -> u32 {
        2 * self.block_n * 4
    }
    /// Registers (`setmaxnreg`) of a warp-specialised tile's producer warpgroup and of each
    /// consumer one: `big_producer` where the producer walks a block map or looks up pages.
    pub const fn ws_registers(&self, big_producer: bool) -> (u32, u32) {
        match (self.warps / 4, big_producer) {
            (2, false) => (FWD_WS_PRODUCER_REGS, FWD_WS_CONSUMER_REGS),
            (2, true) => (FWD_WS_MODS_PRODUCER_REGS, FWD_WS_MODS_CONSUMER_REGS),
            (3, false) => (FWD_WS3_PRODUCER_REGS, FWD_WS3_CONSUMER_REGS),
            _ => panic!("no register split for this many consumer warpgroups"),
        }
    }
    /// A running max and sum (f32) per thread per row it holds: two rows per 16-row MMA tile.
    pub const fn softmax_state_bytes(&self) -> u32 {
        self.consumer_threads() * self.m_tiles_per_warp() * 2 * 2 * 4
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
    /// The modifier variant's warp-specialised tile for fixed-length calls that gather nothing
    /// (the Hopper module; the query rows of `mods`, so the same work order; keys split in its
    /// own tiles), on 128-key tiles with a bias ring (50 % blocks + bias 8K 3.64 -> 2.75 ms on an
    /// H200 at d128, against 64-key tiles). At d64 it serves calls over many key tiles, beside
    /// the two-CTA kernel of `mods` ([`fwd_sm90_two_cta_mods`]): b2 h32 hk8 8K, 50 % blocks + a
    /// `[b, 1, s, s]` bias 2.60 -> 2.18 ms, Flash-DMA's training row at 16K 0.94 -> 0.83 (H200,
    /// same-run A/B; on 64-key tiles it was no faster, H100, 2026-11-27).
    pub mods_ws: Option<FwdTile>,
    /// The warp-specialised kernel for fixed-length calls with a mask alone (no bias or softcap)
    /// that neither gather nor split their keys (the Hopper module): the lean tile's 128-key
    /// tiles, without the bias ring's code and shared memory. Its query rows are the modifier
    /// tile's, so it reads the same work order.
    pub mask_ws: Option<FwdTile>,
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
    FwdTile { head_dim, block_m, block_n, warps, wgmma: false, producer: false, modifiers: false, mask_only: false }
}

/// A Hopper forward tile: a warpgroup per 64 query rows, so that each warp's 16 rows are its
/// share of the warpgroup's m64 products.
const fn wgmma_tile(head_dim: u32, block_m: u32, block_n: u32) -> FwdTile {
    FwdTile { head_dim, block_m, block_n, warps: block_m / 16, wgmma: true, producer: false, modifiers: false, mask_only: false }
}

/// A warp-specialised Hopper forward tile: [`wgmma_tile`]'s consumers and a producer warpgroup.
const fn ws_tile(head_dim: u32, block_m: u32, block_n: u32) -> FwdTile {
    FwdTile { producer: true, ..wgmma_tile(head_dim, block_m, block_n) }
}

/// [`ws_tile`] for the modifier variant.
const fn ws_mods_tile(head_dim: u32, block_m: u32, block_n: u32) -> FwdTile {
    FwdTile { modifiers: true, ..ws_tile(head_dim, block_m, block_n) }
}

/// [`ws_mods_tile`] for the mask-only kernel (no bias ring).
const fn ws_mask_tile(head_dim: u32, block_m: u32, block_n: u32) -> FwdTile {
    FwdTile { mask_only: true, ..ws_mods_tile(head_dim, block_m, block_n) }
}

/// The shipped forward tiles. Shapes are chosen per head dim so that no variant spills under
/// ptxas for sm_80 or sm_90 (`cargo xtask ptxas` checks; the GPU test `no_kernel_spills_on_this_gpu`
/// checks the driver's own compilation). 32 query rows per warp halve the shared-memory reads per
/// MMA against 16; up to d128 both variants afford it (d128: 253-255 and 249-255 registers),
/// d192 and d256 do not. d64 takes 128-key tiles (255 registers): half the barriers and
/// per-tile bookkeeping per key, ~15 % faster on training shapes, though 28 % slower on
/// sparse decoding at 512K keys, where each visited tile carries twice the keys.
pub const FWD_TILES: [FwdVariants; 6] = [
    FwdVariants { plain: Some(tile(32, 128, 64, 4)), mods: tile(32, 128, 64, 4), mods_ws: None, mask_ws: None, gather_narrow: None },
    FwdVariants { plain: Some(tile(64, 128, 128, 4)), mods: tile(64, 128, 128, 4), mods_ws: None, mask_ws: None, gather_narrow: Some(tile(64, 64, 128, 4)) },
    FwdVariants { plain: Some(tile(96, 128, 64, 4)), mods: tile(96, 128, 64, 4), mods_ws: None, mask_ws: None, gather_narrow: None },
    FwdVariants { plain: Some(tile(128, 128, 64, 4)), mods: tile(128, 128, 64, 4), mods_ws: None, mask_ws: None, gather_narrow: None },
    FwdVariants { plain: Some(tile(192, 64, 64, 4)), mods: tile(192, 64, 64, 4), mods_ws: None, mask_ws: None, gather_narrow: None },
    FwdVariants { plain: Some(tile(256, 128, 64, 8)), mods: tile(256, 128, 64, 8), mods_ws: None, mask_ws: None, gather_narrow: None },
];

/// The Hopper forward tiles (sm_90a module, `names::FWD_WGMMA_PREFIX`): the portable tiles'
/// shapes for the modifier and gather variants, so that the work orders, key splits and gather
/// tile choice are theirs, with a warp per 16 query rows (the warp-specialised modifier tile
/// keeps their query rows, and its keys split in its own tiles). The lean variant's warp-specialised
/// tile (never ordered or split) takes 128 keys at d128 too, and 192 query rows at d64: three
/// consumer warpgroups taking turns, so that each one's softmax, which at d64 outlasts one
/// warpgroup's products, runs under the other two's (FlashAttention-3's d64 shape); packed
/// batches take [`fwd_ws_packed_tile`].
pub const FWD_TILES_SM90: [FwdVariants; 2] = [
    FwdVariants { plain: Some(ws_tile(64, 192, 128)), mods: wgmma_tile(64, 128, 128), mods_ws: Some(ws_mods_tile(64, 128, 128)), mask_ws: Some(ws_mask_tile(64, 128, 128)), gather_narrow: Some(wgmma_tile(64, 64, 128)) },
    FwdVariants { plain: Some(ws_tile(128, 128, 128)), mods: wgmma_tile(128, 128, 64), mods_ws: Some(ws_mods_tile(128, 128, 128)), mask_ws: Some(ws_mask_tile(128, 128, 128)), gather_narrow: None },
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

    /// Whether a backward variant reads `BwdParams::kv_heads_first` (its grid's x and y swapped):
    /// the placed ones, and the lean one without a work order. `ALL` sits at the register limit.
    pub const fn bwd_swaps(variant: u8) -> bool {
        variant != ALL
    }
}
