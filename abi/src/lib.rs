//! The contract between `kernels-gpu` (device) and `dmattn` (host): kernel parameter structs,
//! tile shapes and kernel names. Both sides compile this one file, so they cannot disagree.
#![no_std]

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
    /// Bottom-right aligned causal mask: key `j` is visible to query `i` iff `j <= i + sk - sq`.
    pub const CAUSAL: u32 = 1;
    /// The bias rows can be copied with 16-byte `cp.async` (unit key stride, 16-byte aligned rows).
    pub const BIAS_VEC: u32 = 2;
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
}

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

/// Parameters of the kernel that prepares a boolean mask `[mb, mh, mq, sk]` (zero strides where
/// broadcast, a key-broadcast mask given as stride 0 over `sk` keys) for the attention kernels:
/// - `classes`: u8 `[mb, mh, q_blocks, k_blocks]`, one [`block_class`] per 64x64 block;
/// - `bits`: u64 `[mb, mh, mq, k_blocks]`, the mask packed in [`mask_bit`] order, zero past `sk`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MaskPackParams {
    pub mask: View4,
    pub classes: u64,
    pub bits: u64,
    /// `[mb, mh, mq, sk]`.
    pub dims: [u32; 4],
    pub q_blocks: u32,
    pub k_blocks: u32,
}

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
}

impl FwdTile {
    pub const fn threads(&self) -> u32 {
        self.warps * 32
    }
    /// Query rows each warp owns, in 16-row MMA tiles.
    pub const fn m_tiles_per_warp(&self) -> u32 {
        self.block_m / (16 * self.warps)
    }
    /// Dynamic shared memory: Q, K, V tiles, then the bias and packed-mask tiles of one key block.
    pub const fn smem_bytes(&self) -> u32 {
        let qkv = (self.block_m + 2 * self.block_n) * self.head_dim * 2;
        qkv + self.bias_tile_bytes() + self.mask_tile_bytes()
    }
    pub const fn bias_tile_bytes(&self) -> u32 {
        self.block_m * self.block_n * 2
    }
    pub const fn mask_tile_bytes(&self) -> u32 {
        self.block_m * self.block_n / 8
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
}

const fn tile(head_dim: u32, block_m: u32, block_n: u32, warps: u32) -> FwdTile {
    FwdTile { head_dim, block_m, block_n, warps }
}

/// The shipped forward tiles. Shapes are chosen per head dim so that no variant spills
/// (`cargo xtask ptxas` checks); the lean variant of d96 and d256 spilled by a few bytes under
/// ptxas 12.9 and is not shipped.
pub const FWD_TILES: [FwdVariants; 6] = [
    FwdVariants { plain: Some(tile(32, 128, 64, 4)), mods: tile(32, 128, 64, 4) },
    FwdVariants { plain: Some(tile(64, 128, 64, 4)), mods: tile(64, 128, 64, 4) },
    FwdVariants { plain: None, mods: tile(96, 128, 64, 4) },
    FwdVariants { plain: Some(tile(128, 128, 64, 8)), mods: tile(128, 128, 64, 8) },
    FwdVariants { plain: Some(tile(192, 64, 64, 4)), mods: tile(192, 64, 64, 4) },
    FwdVariants { plain: None, mods: tile(256, 64, 64, 4) },
];

/// The kernels shipped for a head dimension.
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

/// Exported kernel names, built by one rule on both sides: `dmattn_fwd_<elem>_d<head_dim>`, with
/// `_mods` appended for the variant with score modifiers.
pub mod names {
    pub const MASK_PACK: &str = "dmattn_mask_pack";
    pub const FWD_PREFIX: &str = "dmattn_fwd_";
}
