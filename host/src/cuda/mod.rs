//! The CUDA backend: checks what the kernels need beyond the shared validation, prepares the
//! mask (block classes and packed bits, read by forward and backward alike) and launches. The
//! unfused forward on cuBLAS is in `materialized`.
mod decode;
mod gather;
mod launch;
mod lists;
mod materialized;
mod packed;
mod prepare;
mod select;
mod tma;

pub(crate) use prepare::{Forms, PreparedMask, fixed_key_bytes, key_side_bytes, pack_sequences, prepare, to_sequences};
pub(crate) use decode::reads_key_bytes;
pub(crate) use select::select_keys;
pub(crate) use lists::from_bits as lists_from_bits;
pub use select::{force_select_launches, force_wide_selection};
pub use gather::force_gather_query_chunks;
pub use decode::{force_decode_ctas_per_sm, force_decode_order};

use crate::attention::{Forward, ForwardBuffers, GradientBuffers, Gradients, Saved};
use crate::cpu::lse_shape;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::problem::{Dims, PackedLayout, Problem};
use crate::tensor::Tensor;
use crate::memory::DeviceBuffer;
use crate::sparse::MaskData;
use std::sync::Arc;
use dmattn_abi::{
    BwdParams, BwdSharesParams, BwdTile, BwdPreParams, CombineParams, ConvertParams, DeviceElem, DqConvertParams, FwdParams, FwdTile, KeyLists, ORDER_SMEM_BYTES, ORDER_WARPS, OrderParams,
    PRE_THREADS, QueryRows, Seqs, View4, bwd_split_kernel, bwd_splits, bwd_tile, flags, fwd_variants_for, modifiers,
};
use launch::{Launch, launch};

const BACKEND: &str = "CUDA";

fn device_elem(arg: &'static str, dtype: DType) -> Result<DeviceElem> {
    match dtype {
        DType::F16 => Ok(DeviceElem::F16),
        DType::BF16 => Ok(DeviceElem::Bf16),
        other => Err(Error::DType { arg, expected: "f16 or bf16 (the CUDA kernels' types)".into(), got: other }),
    }
}

/// `[b, s, h, d]` q/k/v/o, or a packed batch's `[total, h, d]` as batch 1: unit stride on d,
/// 16-byte aligned rows, so tiles load with `cp.async`.
fn qkv_view(t: &Tensor, arg: &'static str) -> Result<View4> {
    let (shape, s) = match (t.shape(), t.strides()) {
        (&[n, h, d], &[sn, sh, sd]) => ([1, n, h, d], [0, sn, sh, sd]),
        (sh, st) => (<[usize; 4]>::try_from(sh).expect("validated"), <[usize; 4]>::try_from(st).expect("validated")),
    };
    let layout_err = |reason: String| Error::Layout { arg, backend: BACKEND, reason };
    if shape[3] > 1 && s[3] != 1 {
        return Err(layout_err(format!("head_dim stride is {}, must be 1", s[3])));
    }
    // Size-1 dimensions are never stepped over, so their strides do not matter.
    for (dim, name) in [(0, "batch"), (1, "sequence"), (2, "head")] {
        if shape[dim] > 1 && !s[dim].is_multiple_of(8) {
            return Err(layout_err(format!("{name} stride {} is not a multiple of 8 elements (16 bytes)", s[dim])));
        }
    }
    let ptr = t.device_ptr().expect("CUDA tensor");
    if !ptr.is_multiple_of(16) {
        return Err(layout_err("the first element is not 16-byte aligned".into()));
    }
    let stride = |d: usize| if shape[d] == 1 { 0 } else { s[d] as u64 };
    Ok(View4 { ptr, stride: [stride(0), stride(1), stride(2), 1] })
}

/// A `[{1|b}, {1|hk|h}, {1|sq}, {1|sk}]` mask or bias as seen through zero strides.
fn broadcast_view(t: &Tensor) -> View4 {
    let stride = |d: usize| if t.shape()[d] == 1 { 0 } else { t.strides()[d] as u64 };
    View4 { ptr: t.device_ptr().expect("CUDA tensor"), stride: [stride(0), stride(1), stride(2), stride(3)] }
}

/// Query head → mask/bias head divisor for a broadcast operand with `n` heads.
fn head_div(d: &Dims, n: usize) -> u32 {
    if n == d.kv_heads && n != d.heads { d.kv_group() as u32 } else { 1 }
}

/// A mask or bias as a kernel reads it: its broadcast view and its head divisor.
fn broadcast_operand(d: &Dims, t: &Tensor) -> (View4, u32) {
    (broadcast_view(t), head_div(d, t.shape()[1]))
}

/// A bias with a key dimension and none along the queries (`[.., .., 1, sk]`): the forward
/// copies one row of it per key tile (`flags::BIAS_ROW`), at the gathered keys in the gather
/// variant.
fn key_side(bias: &Tensor) -> bool {
    bias.shape()[2] == 1 && bias.shape()[3] > 1
}

/// The bias can be copied in 16-byte rows (unit key stride, 8-element aligned rows and base).
fn bias_vectorizable(bias: &Tensor, view: &View4) -> bool {
    bias.shape()[3] > 1 && bias.strides()[3] == 1 && view.ptr.is_multiple_of(16) && view.stride[..3].iter().all(|s| s % 8 == 0)
}

fn check_limits(d: &Dims, block_m: u32) -> Result<()> {
    let limit = |arg: &'static str, n: usize, max: usize| {
        if n > max { Err(Error::Param { arg, reason: format!("{n} exceeds the CUDA backend's limit of {max}") }) } else { Ok(()) }
    };
    limit("q", d.seqlen_q, i32::MAX as usize - block_m as usize)?;
    limit("k", d.seqlen_k, i32::MAX as usize / 2)?;
    limit("q", d.heads, 65535)?;
    limit("q", d.batch, 65535)
}

/// The leanest kernel variant (`dmattn_abi::modifiers`) with the score modifiers a call uses.
fn modifiers_of(p: &Problem) -> u8 {
    match (p.mask.is_some(), p.bias.is_some(), p.softcap > 0.0) {
        (_, _, true) => modifiers::ALL,
        (_, true, false) => modifiers::BIAS,
        (true, false, false) => modifiers::MASK,
        (false, false, false) => modifiers::NONE,
    }
}

fn kernel_name(prefix: &str, elem: DeviceElem, head_dim: usize, modifiers: u8) -> String {
    format!("{prefix}{}_d{head_dim}{}", elem.name(), modifiers::suffix(modifiers))
}

fn unsupported_head_dim(head_dim: usize) -> Error {
    Error::Unsupported { what: format!("head_dim {head_dim} (supported: 32, 64, 96, 128, 192, 256)"), backend: BACKEND }
}

/// Checks shared by forward and backward: element type, bias dtype.
fn check_operands(p: &Problem, saved: &Saved) -> Result<DeviceElem> {
    let elem = device_elem("q", p.dtype)?;
    if let Some(bias) = &saved.bias
        && bias.dtype() != p.dtype
    {
        return Err(Error::DType { arg: "bias", expected: format!("{:?} (the dtype of q)", p.dtype), got: bias.dtype() });
    }
    Ok(elem)
}

/// The prepared mask's device data, where the call has one.
fn device_mask(saved: &Saved) -> Option<&PreparedMask> {
    match saved.mask.as_ref()?.data.as_ref()? {
        MaskData::Cuda(m) => Some(m),
        MaskData::Cpu(_) => unreachable!("a CPU mask on a CUDA call is rejected by validation"),
    }
}

/// `saved` with its mask prepared where it was left as key-side bytes (see
/// `prepare::KeyBytes`), for the kernels that do not read bytes (all but the decoding one);
/// `None` where there is nothing to prepare.
fn with_prepared_key_bytes(dev: &CudaDevice, saved: &Saved) -> Result<Option<Saved>> {
    let (Some(mask), Some(key_bytes)) = (&saved.mask, device_mask(saved).and_then(|m| m.key_bytes.as_ref())) else { return Ok(None) };
    let prepared = mask.with_data(MaskData::Cuda(key_bytes.prepared(dev)?));
    Ok(Some(Saved { mask: Some(prepared), ..saved.clone() }))
}

/// The forward kernel's parameters for `saved`'s operands (the backward reads the same);
/// `gathered`: for the gather variant, which reads a key-side bias at the listed keys, aligned
/// or not.
fn fwd_params(p: &Problem, saved: &Saved, out: &Tensor, lse: &Tensor, gathered: bool) -> Result<FwdParams> {
    let d = p.dims;
    let mut params = FwdParams {
        q: qkv_view(&saved.q, "q")?,
        k: qkv_view(&saved.k, "k")?,
        v: qkv_view(&saved.v, "v")?,
        o: qkv_view(out, "out")?,
        lse: lse.device_ptr().expect("CUDA tensor"),
        batch: d.batch as u32,
        heads: d.heads as u32,
        kv_group: d.kv_group() as u32,
        mask_head_div: 1,
        bias_head_div: 1,
        seqlen_q: d.seqlen_q as u32,
        seqlen_k: d.seqlen_k as u32,
        scale_log2: (p.scale * std::f64::consts::LOG2_E) as f32,
        softcap: p.softcap as f32,
        band: p.band,
        seqs: seqs_params(p, saved)?,
        ..FwdParams::default()
    };
    if let Some(m) = device_mask(saved) {
        (params.mask_bits, params.block_map, params.mask_head_div) = (m.bits, m.classes, head_div(&d, m.planes[1]));
    }
    if let (Some(bias), Some(layout)) = (&saved.bias, p.packed_bias) {
        // Read element by element (a sequence's first key or row is not 16-byte aligned in
        // general); where a sequence starts is `Seq::origin`'s.
        (params.bias, params.bias_head_div) = (packed_view(bias, layout), head_div(&d, bias.shape()[1]));
    } else if let Some(bias) = &saved.bias {
        (params.bias, params.bias_head_div) = broadcast_operand(&d, bias);
        let vectorizable = bias_vectorizable(bias, &params.bias);
        if vectorizable {
            params.flags |= flags::BIAS_VEC;
        }
        // A key-side bias: one row per key tile.
        if key_side(bias) && (vectorizable || gathered) {
            params.flags |= flags::BIAS_ROW;
        }
    }
    Ok(params)
}

/// Where a packed batch's sequences are, the LSE's rows, and paged K/V's block table (see
/// [`Seqs`]).
fn seqs_params(p: &Problem, saved: &Saved) -> Result<Seqs> {
    let Some(s) = &p.seqs else { return Ok(Seqs { lse_rows: p.dims.seqlen_q as u32, ..Seqs::default() }) };
    let (q, k) = s.device_tensors();
    let ptr = |t: &Tensor| t.device_ptr().expect("a CUDA call's sequence lengths and block table are on its device");
    let mut seqs = Seqs { cu_q: ptr(q), cu_k: ptr(k), lse_rows: s.total_q() as u32, ..Seqs::default() };
    if let Some(pages) = &p.pages {
        // The kernels offset pages and rows in them in 32 bits (`Seq::paged_offset`).
        for (t, arg) in [(&saved.k, "k"), (&saved.v, "v")] {
            let (shape, st) = (t.shape(), t.strides());
            let extent: usize = (1..4).map(|i| (shape[i] - 1) * st[i]).sum::<usize>() + 1;
            if extent > u32::MAX as usize {
                return Err(Error::Layout { arg, backend: BACKEND, reason: format!("a page spans {extent} elements, past 2^32") });
            }
            if shape[0] > 1 && st[0] > u32::MAX as usize {
                return Err(Error::Layout { arg, backend: BACKEND, reason: format!("page stride {} is past 2^32 elements", st[0]) });
            }
        }
        seqs.page_shift = pages.page_size.trailing_zeros();
        seqs.block_table = ptr(pages.table.device_tensor());
        seqs.table_stride = pages.table.max_pages() as u32;
    }
    Ok(seqs)
}

/// Key splits for a forward whose grid would leave the GPU mostly idle (few query tiles, long
/// keys: decoding): enough splits for two CTAs per SM, at least two key tiles each. Returns
/// (splits, key tiles per split); (1, _) is no split.
fn key_splits(sms: u32, d: &Dims, block_m: u32, block_n: u32) -> (u32, u32) {
    // (A packed batch of sequences without queries has no CTA.)
    let ctas = (d.seqlen_q.div_ceil(block_m as usize) * d.heads * d.batch).max(1);
    let k_tiles = d.seqlen_k.div_ceil(block_n as usize);
    let target = (2 * sms as usize).div_ceil(ctas).min(k_tiles / 2).min(128).min(65535 / d.batch);
    if target < 2 {
        return (1, k_tiles as u32);
    }
    let per_split = k_tiles.div_ceil(target);
    (k_tiles.div_ceil(per_split) as u32, per_split as u32)
}

/// Key tiles (of the warp-specialised kernels' 128 keys) a call must span for those one-CTA-an-SM
/// kernels (mask-only, or with every modifier) to beat the two-CTA modifier kernel where one
/// serves fixed lengths (d64, `fwd_sm90_two_cta_mods`), whose second CTA hides its short rows'
/// prologue and epilogue (H200, 50 % masks: 2 tiles 0.34 -> 0.42 ms, 9 level, 16-32 6-10 %
/// faster). Elsewhere (d128) the warp-specialised kernels always serve.
const WS_MIN_KEY_TILES: usize = 16;

/// Whether the warp-specialised tile `ws` pays for a fixed-length call (`forced`: the testing
/// hook's answer where there is a two-CTA kernel to weigh it against).
fn ws_pays(ws: FwdTile, d: &Dims, forced: Option<bool>) -> bool {
    !dmattn_abi::fwd_sm90_two_cta_mods(d.head_dim as u32) || forced.unwrap_or(d.seqlen_k.div_ceil(ws.block_n as usize) >= WS_MIN_KEY_TILES)
}

/// The query rows a row pass walks: `[batch, seqlen_q]`, or a packed batch's `[1, total_q]`.
fn query_rows(p: &Problem) -> QueryRows {
    let d = &p.dims;
    let (batch, seqlen_q) = p.seqs.as_ref().map_or((d.batch, d.seqlen_q), |s| (1, s.total_q()));
    QueryRows { batch: batch as u32, heads: d.heads as u32, seqlen_q: seqlen_q as u32, head_dim: d.head_dim as u32 }
}

/// Blocks of a row pass over `rows` (`bwd_pre::for_each_row`; grid-stride beyond 4096).
fn row_blocks(rows: &QueryRows) -> u32 {
    let per_block = PRE_THREADS / 32 * (32 / rows.lanes());
    rows.count().div_ceil(per_block).clamp(1, 4096)
}

/// A packed batch's bias or mask (`[total_k, heads]` or `[total_q, heads, max_seqlen_k]`, dim
/// `i`'s stride `s(i)`) as the kernels read it: `[·, heads, rows, keys]`, with `stride[0]` the
/// step per packed key (`Seq::origin`): the key stride of a key-side operand, 0 for a
/// query-based one.
pub(crate) fn packed_strides(layout: PackedLayout, heads: usize, s: impl Fn(usize) -> u64) -> [u64; 4] {
    let head = if heads == 1 { 0 } else { s(1) };
    match layout {
        PackedLayout::KeySide => [s(0), head, 0, s(0)],
        PackedLayout::PerQuery => [0, head, s(0), s(2)],
    }
}

/// A packed batch's bias or mask tensor `t` (on the device) as the kernels read it, by its own
/// strides ([`packed_strides`]).
pub(crate) fn packed_view(t: &Tensor, layout: PackedLayout) -> View4 {
    let s = t.strides();
    View4 { ptr: t.device_ptr().expect("CUDA tensor"), stride: packed_strides(layout, t.shape()[1], |i| s[i] as u64) }
}

/// The bias's dims as the backward's dbias turns see them (`BwdParams::bias_dims`: size 1
/// where CTAs of several batch entries, kv heads or key tiles add to one element): its broadcast
/// shape; a packed batch's as one bias per sequence, whose keys are its own.
fn bias_dims(p: &Problem) -> [u32; 4] {
    match (p.bias, &p.seqs) {
        (None, _) => [1; 4],
        // (Sizes of at least 2 read as not shared, heads as they are.)
        (Some([_, heads, rows, keys]), Some(seqs)) => [seqs.batch().max(2), heads, rows, keys.max(2)].map(|x| x as u32),
        (Some(shape), None) => shape.map(|x| x as u32),
    }
}

/// The f32 dbias accumulator's strides: the bias's own layout, contiguous (a packed batch's as
/// [`packed_strides`] reads it), so that it converts to dbias element by element.
fn dbias_strides(p: &Problem) -> [u64; 4] {
    match (p.bias, p.packed_bias) {
        (None, _) => [0; 4],
        (Some([_, heads, rows, keys]), Some(layout)) => {
            let dims = match layout {
                PackedLayout::KeySide => [keys, heads, 1],
                PackedLayout::PerQuery => [rows, heads, keys],
            };
            packed_strides(layout, heads, |i| dims[i + 1..].iter().product::<usize>() as u64)
        }
        (Some(shape), None) => prepare::strides(shape),
    }
}

/// The caller's buffer where given, else a new one.
fn output(provided: Option<&Tensor>, shape: &[usize], dtype: DType, device: &crate::Device) -> Result<Tensor> {
    match provided {
        Some(t) => Ok(t.clone()),
        None => Tensor::empty(shape, dtype, device),
    }
}

/// The key lists of a call whose prepared mask runs as gather attention.
fn key_lists(saved: &Saved) -> Option<Arc<gather::KeyListsBuf>> {
    device_mask(saved)?.gather.clone()
}

/// What the forward's grid reads besides its operands: nothing, a prepared mask (block classes,
/// which a work order can sort by), or gathered keys' ranks (the gather variant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FwdMask {
    None,
    Prepared,
    Gathered,
}

/// How a forward runs, worked out from the problem and the GPU's size alone: the kernel, its
/// tile and grid, the key splits, and whether a work order runs its CTAs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FwdPlan {
    /// The element type the operands were checked to be (the combine pass's too).
    pub elem: DeviceElem,
    pub kernel: String,
    pub tile: FwdTile,
    pub grid: (u32, u32, u32),
    /// Key splits (1: none) and key tiles per split (0: the gather variant shares the tiles its
    /// rows see evenly, a count the host does not know).
    pub splits: u32,
    pub split_tiles: u32,
    pub ordered: bool,
    /// CTAs take their query tiles heads fastest, heaviest first (`flags::HEADS_FIRST`): the
    /// gather variant's stand-in for a work order over grids of more than a wave.
    pub heads_first: bool,
    /// The kernel takes `FwdTmaParams`: Q, K and V tensor maps beside the parameters (the Hopper
    /// lean forward over fixed-length operands, whose producer copies with the bulk tensor copy
    /// engine).
    pub tma: bool,
    /// CTAs of that kernel where it is persistent (`dmattn_abi::fwd_ws_persistent`), which take
    /// the query tiles of `grid` in turn ([`FwdPlan::launch_grid`]); 0: a CTA a query tile.
    pub ctas: u32,
}

impl FwdPlan {
    /// The grid launched: a CTA a query tile (and split), but for the persistent kernel.
    pub fn launch_grid(&self) -> (u32, u32, u32) {
        if self.ctas > 0 { (self.ctas, 1, 1) } else { self.grid }
    }
}

/// CTAs of the persistent lean forward (one an SM, its tile's occupancy) for `tiles` query
/// tiles: as many as run at once, so that none waits for a wave, but no more than the tiles.
fn persistent_ctas(sms: u32, tiles: u64) -> u32 {
    tiles.min(sms as u64) as u32
}

/// The facts about a GPU that launch plans are computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Gpu {
    pub sms: u32,
    pub l2_bytes: usize,
    /// The Hopper (sm_90a) module is loaded.
    pub wgmma: bool,
}

/// The forward's plan for `p` on `gpu`, its operands taking bulk tensor copies (see
/// [`fwd_plan_copying`]).
pub(crate) fn fwd_plan(gpu: Gpu, p: &Problem, elem: DeviceElem, mask: FwdMask) -> Result<FwdPlan> {
    fwd_plan_copying(gpu, p, elem, mask, true, None)
}

/// The forward's plan for `p` on `gpu`. `bulk_copies`: whether the Hopper lean fixed-length
/// kernel may run, whose producer copies Q, K and V by the bulk tensor copy engine through
/// tensor maps written per call: not where an operand has none (`tma::TileMap::of`: a
/// broadcast dimension). The modifier kernel then serves the lean call. `forced_ws` overrides
/// whether the one-CTA-an-SM warp-specialised kernels (mask-only, or with every modifier) pay
/// where the plan weighs them against a two-CTA one ([`force_forward_warp_specialised`]).
pub(crate) fn fwd_plan_copying(gpu: Gpu, p: &Problem, elem: DeviceElem, mask: FwdMask, bulk_copies: bool, forced_ws: Option<bool>) -> Result<FwdPlan> {
    let d = p.dims;
    let Gpu { sms, l2_bytes, wgmma } = gpu;
    let variants = fwd_variants_for(d.head_dim as u32, wgmma).ok_or_else(|| unsupported_head_dim(d.head_dim))?;
    let gathered = mask == FwdMask::Gathered;
    // The gather variant's tile: narrow where the modifier tile's grid leaves the GPU short of
    // CTAs.
    let mods_ctas = (d.seqlen_q.div_ceil(variants.mods.block_m as usize) * d.heads * d.batch) as u64;
    let (gather_tile, narrow) = dmattn_abi::gather_tile(&variants, mods_ctas, sms);
    // Split-KV runs in the modifier variants only (see `key_splits`), in the key tiles of the
    // kernel that runs: the gather tile's (a gathered call's keys are at most its call's), the
    // warp-specialised modifier tile's for fixed lengths on Hopper where it has one (d128), else
    // the modifier tile's.
    let split_tile = match variants.mods_ws {
        _ if gathered => gather_tile,
        Some(ws) if p.seqs.is_none() && ws_pays(ws, &d, forced_ws) => ws,
        None | Some(_) => variants.mods,
    };
    let (splits, split_tiles) = key_splits(sms, &d, split_tile.block_m, split_tile.block_n);
    // The forward's variants: the gather variant, lean, or every modifier. Packed batches have a
    // lean kernel in the Hopper module only (contiguous or paged K/V alike, so that both take the
    // same products and give the same bits).
    let lean_serves = p.seqs.is_none() || (variants.plain.is_some_and(|t| t.wgmma) && dmattn_abi::fwd_sm90_lean_packed(d.head_dim as u32));
    // The bulk-copy kernel is persistent and numbers its query tiles in a u32 (`FwdTmaParams`):
    // beyond, the modifier kernel serves (no tensors that large fit on a GPU today).
    let query_tiles = |block_m: u32| d.seqlen_q.div_ceil(block_m as usize) as u64 * (d.heads * d.batch) as u64;
    let bulk_copies = bulk_copies && variants.plain.is_none_or(|t| query_tiles(t.block_m) < 1 << 31);
    // Fixed lengths on Hopper: the warp-specialised modifier kernel (the modifier tile's query
    // rows, so the same work order), at d64 over enough key tiles (`ws_pays`).
    // A mask alone, unsplit: the mask-only kernel, where there is one (its 128-key tiles; the
    // same query rows as the modifier tile, so the same work order).
    let mods_tile = match (variants.mods_ws, variants.mask_ws) {
        (_, Some(ws)) if p.seqs.is_none() && modifiers_of(p) == modifiers::MASK && splits == 1 && forced_ws.unwrap_or_else(|| ws_pays(ws, &d, None)) => ws,
        (Some(ws), _) if p.seqs.is_none() && ws_pays(ws, &d, forced_ws) => ws,
        _ => variants.mods,
    };
    let (tile, mods) = match variants.plain {
        _ if gathered => (gather_tile, true),
        Some(plain) if modifiers_of(p) == modifiers::NONE && splits == 1 && lean_serves && (bulk_copies || !plain.producer || p.seqs.is_some()) => {
            let packed = p.seqs.is_some().then(|| dmattn_abi::fwd_ws_packed_tile(&variants)).flatten();
            (packed.unwrap_or(plain), false)
        }
        _ => (mods_tile, true),
    };
    check_limits(&d, tile.block_m)?;
    let prefix = if tile.wgmma { dmattn_abi::names::FWD_WGMMA_PREFIX } else { dmattn_abi::names::FWD_PREFIX };
    let variant = match (mods, tile.mask_only) {
        (false, _) => modifiers::NONE,
        (true, true) => modifiers::MASK,
        (true, false) => modifiers::ALL,
    };
    let mut kernel = kernel_name(prefix, elem, d.head_dim, variant);
    if Some(tile) == variants.mods_ws && dmattn_abi::fwd_sm90_two_cta_mods(d.head_dim as u32) {
        kernel += dmattn_abi::names::WS_SUFFIX;
    }
    // A packed batch: the variant's packed kernel, or over paged K/V its paged one (the
    // fixed-length kernels hold no sequence bounds).
    if p.seqs.is_some() {
        kernel += if p.pages.is_some() { dmattn_abi::names::PAGED_SUFFIX } else { dmattn_abi::names::PACKED_SUFFIX };
    }
    if gathered {
        kernel += dmattn_abi::names::GATHER_SUFFIX;
        if narrow {
            kernel += dmattn_abi::names::NARROW_SUFFIX;
        }
    }
    let grid = (d.seqlen_q.div_ceil(tile.block_m as usize) as u32, d.heads as u32, d.batch as u32 * splits);
    // A packed batch's order comes from its lengths (`packed`), wherever there is more than a
    // wave.
    let packed_pays = p.seqs.is_some() && grid.0 as u64 * grid.1 as u64 * grid.2 as u64 > 2 * sms as u64;
    // Heads fastest (`HEADS_FIRST`) only where the keys are not split and the grid is more than
    // a wave.
    let swappable = splits == 1 && grid.0 as u64 * grid.1 as u64 > sms as u64;
    // A per-query bias that heads share (broadcast over heads or kv groups), on the
    // warp-specialised modifier kernel: heads fastest, so that the CTAs reading a bias tile run
    // together and it comes from DRAM once rather than once a head (`bias_heads_first`), in
    // place of a work order. Same-run A/B (H200, b2 h32 hk8, 50 % blocks + a `[b, 1, s, s]`
    // bias): d128 4K / 8K / 16K 3 / 3 / 6.5 % faster; the d64 two-CTA kernel 3 % slower at 4K,
    // level at 8K, so it keeps its order.
    let bias_first = mods && tile.producer && !gathered && swappable && bias_heads_first(p);
    let ordered = splits == 1 && mods && !bias_first && (mask == FwdMask::Prepared && order_pays(sms, l2_bytes, &d, grid) || packed_pays);
    let heads_first = bias_first || (gathered && swappable);
    let tma = tile.producer && !mods && p.seqs.is_none();
    let persistent = tma && dmattn_abi::fwd_ws_persistent(d.head_dim as u32);
    let ctas = if persistent { persistent_ctas(sms, grid.0 as u64 * grid.1 as u64 * grid.2 as u64) } else { 0 };
    Ok(FwdPlan { elem, kernel, tile, grid, splits, split_tiles: if gathered { 0 } else { split_tiles }, ordered, heads_first, tma, ctas })
}

pub(crate) fn forward(dev: &CudaDevice, p: Problem, saved: Saved, into: ForwardBuffers) -> Result<Forward> {
    let elem = check_operands(&p, &saved)?;
    let decode = |saved: &Saved| decode::decode_plan(dev.sms(), &p, elem, device_mask(saved).map(decode::MaskShape::of));
    // A mask left as key-side bytes is prepared unless the decoding kernel reads it (the plan
    // then made again: a fixed-length call's prepared as key lists, which that kernel declines).
    let plan = decode(&saved);
    if plan.is_none() && p.pages.is_some() && p.mask.is_some() {
        // The paged kernels of the general forward have no mask tiles (their lookups left no
        // registers for them). (A mask's form does not decide whether the decoding kernel
        // takes a call: checked before any is prepared.)
        let what = "a mask with paged K/V outside decoding (a kv group's heads times the longest sequence's queries above 64, or a band with sinks)".into();
        return Err(Error::Unsupported { what, backend: BACKEND });
    }
    let (plan, saved) = match plan {
        Some(plan) if plan.mask_bytes => (Some(plan), saved),
        plan => match with_prepared_key_bytes(dev, &saved)? {
            Some(prepared) => (decode(&prepared), prepared),
            None => (plan, saved),
        },
    };
    if let Some(plan) = plan {
        let (out, lse) = run_decode(dev, &plan, &p, &saved, into)?;
        return Ok(Forward { out, lse, problem: p, saved });
    }
    if let Some(lists) = lists::row_lists(&saved)
        && let Some(plan) = lists::lists_plan(&p, elem, lists.planes)
    {
        let (out, lse) = forward_outputs(&p, &saved, into)?;
        lists::launch_lists(dev, &p, &plan, lists, fwd_params(&p, &saved, &out, &lse, false)?)?;
        return Ok(Forward { out, lse, problem: p, saved });
    }
    if let Some(lists) = key_lists(&saved) {
        return gather::forward(dev, p, saved, &lists, into);
    }
    let mask = if device_mask(&saved).is_some() { FwdMask::Prepared } else { FwdMask::None };
    let bulk_copies = tensor_maps_exist(&p, &saved)?;
    let mut plan = fwd_plan_copying(dev.gpu(), &p, elem, mask, bulk_copies, FORCED_WS.with(|f| f.get()))?;
    if let Some(ctas) = FORCED_PERSISTENT_CTAS.with(|f| f.get())
        && plan.ctas > 0
    {
        plan.ctas = plan.ctas.min(ctas);
    }
    let (out, lse) = run_forward(dev, &plan, &p, &saved, into, None)?;
    Ok(Forward { out, lse, problem: p, saved })
}

/// A forward's O and LSE: the caller's buffers (checked), else one allocation for both.
fn forward_outputs(p: &Problem, saved: &Saved, into: ForwardBuffers) -> Result<(Tensor, Tensor)> {
    let device = saved.q.device();
    Ok(match (into.out, into.lse) {
        (None, None) => {
            let mut t = Tensor::empty_together(&[(saved.q.shape(), p.dtype), (&lse_shape(p), DType::F32)], &device)?;
            (t.remove(0), t.remove(0))
        }
        (out, lse) => (output(out, saved.q.shape(), p.dtype, &device)?, output(lse, &lse_shape(p), DType::F32, &device)?),
    })
}

/// Whether the stream is being captured into a CUDA graph, where nothing may be read back and
/// host memory a call frees may not feed a copy.
fn capturing(dev: &CudaDevice) -> Result<bool> {
    use cudarc::driver::sys::CUstreamCaptureStatus;
    Ok(dev.stream().capture_status()? != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Whether q, k and v each have a tensor map (`tma::TileMap::of`; the tile's rows do not
/// matter here).
fn tensor_maps_exist(p: &Problem, saved: &Saved) -> Result<bool> {
    let d = p.dims;
    let fits = |t: &Tensor, rows: usize, heads: usize, arg| -> Result<bool> {
        Ok(tma::TileMap::of(&qkv_view(t, arg)?, [d.batch, rows, heads, d.head_dim], 64).is_some())
    };
    Ok(fits(&saved.q, d.seqlen_q, d.heads, "q")? && fits(&saved.k, d.seqlen_k, d.kv_heads, "k")? && fits(&saved.v, d.seqlen_k, d.kv_heads, "v")?)
}

/// The lean Hopper forward's parameters (`FwdPlan::tma`): `params` and the tensor maps of Q, K
/// and V for its tiles, written to a device buffer by a kernel queued before the forward
/// (returned: the stream orders its release after the forward). A kernel rather than a copy: a
/// CUDA graph keeps a kernel's parameters, but only the address of a copy's host source, which
/// this call frees.
fn tma_params(dev: &CudaDevice, p: &Problem, plan: &FwdPlan, params: FwdParams) -> Result<(dmattn_abi::FwdTmaParams, DeviceBuffer)> {
    let d = p.dims;
    let map = |view: &dmattn_abi::View4, rows: usize, heads: usize, box_rows: u32, name: &str| {
        let shape = [d.batch, rows, heads, d.head_dim];
        let map = tma::TileMap::of(view, shape, box_rows).ok_or_else(|| Error::Unsupported {
            what: format!("a tensor map of {name} for the bulk-copy forward (the plan checked that one exists)"),
            backend: BACKEND,
        })?;
        map.encode(view, plan.elem)
    };
    let (bm, bn) = (plan.tile.block_m, plan.tile.block_n);
    let maps = [map(&params.q, d.seqlen_q, d.heads, bm, "q")?, map(&params.k, d.seqlen_k, d.kv_heads, bn, "k")?, map(&params.v, d.seqlen_k, d.kv_heads, bn, "v")?];
    // The maps, then the persistent kernel's tile counter (the maps' kernel zeroes it).
    let buf = DeviceBuffer::uninit(dev.stream(), dmattn_abi::FWD_TMA_BUFFER_BYTES)?;
    debug_assert_eq!(std::mem::size_of_val(&maps) as u64, dmattn_abi::FWD_TMA_NEXT_TILE);
    // The copy engine takes maps 64-byte aligned; the pool's allocations are 256-byte aligned.
    debug_assert_eq!(buf.ptr() % 64, 0);
    let store = dmattn_abi::TensorMapsParams { dst: buf.ptr(), maps: maps.map(|m| m.0) };
    launch(dev, &Launch::kernel(dmattn_abi::names::STORE_TENSOR_MAPS, (1, 1, 1), 1, 0), store)?;
    Ok((dmattn_abi::FwdTmaParams { fwd: params, maps: buf.ptr() }, buf))
}

/// Runs a forward `plan` of problem `p` on `saved`'s operands (with the gathered keys' ranks and
/// positions for the gather variant, `FwdParams::key_ranks`): the work order where planned, the
/// kernel, and the combine pass of a split. Returns O and LSE.
fn run_forward(dev: &CudaDevice, plan: &FwdPlan, p: &Problem, saved: &Saved, into: ForwardBuffers, gathered: Option<(KeyLists, u64)>) -> Result<(Tensor, Tensor)> {
    let (key_ranks, key_pos) = gathered.unwrap_or_default();
    let d = p.dims;
    let (out, lse) = forward_outputs(p, saved, into)?;
    let launch_fwd = |params| launch(dev, &Launch::kernel(&plan.kernel, plan.grid, plan.tile.threads(), plan.tile.smem_bytes()), params);
    let params_for = |out: &Tensor, lse: &Tensor| -> Result<FwdParams> { Ok(FwdParams { key_ranks, key_pos, ..fwd_params(p, saved, out, lse, gathered.is_some())? }) };
    if plan.splits == 1 {
        let mut params = params_for(&out, &lse)?;
        // Held until the launch is queued; the stream orders its release after the kernel.
        let _order = match &p.seqs {
            Some(seqs) if plan.ordered => {
                let order = packed::device_order(dev, seqs, &p.band, packed::OrderKey::Forward { heads: plan.grid.1, block_m: plan.tile.block_m, block_n: plan.tile.block_n, grid_x: plan.grid.0 }, capturing(dev)?)?;
                params.order = order.as_ref().map_or(0, |o| o.ptr());
                order.map(Order::Kept)
            }
            None if plan.ordered => {
                let name = format!("{}{}", dmattn_abi::names::FWD_ORDER_PREFIX, d.head_dim);
                let (buf, at) = work_order(dev, &name, &params, plan.grid, false)?;
                params.order = at;
                Some(Order::Made(buf))
            }
            _ => None,
        };
        if plan.heads_first {
            params.flags |= flags::HEADS_FIRST;
        }
        if plan.tma {
            // The maps' buffer is held until the launch is queued, as `_order` is.
            let (params, _maps) = tma_params(dev, p, plan, params)?;
            launch(dev, &Launch::kernel(&plan.kernel, plan.launch_grid(), plan.tile.threads(), plan.tile.smem_bytes()), params)?;
        } else {
            launch_fwd(params)?;
        }
    } else {
        split_and_combine(dev, p, plan.elem, plan.splits, &out, &lse, |o_part, lse_part, strides| {
            let mut params = params_for(o_part, lse_part)?;
            (params.splits, params.split_tiles) = (plan.splits, plan.split_tiles);
            (params.o_split_stride, params.lse_split_stride) = strides;
            launch_fwd(params)
        })?;
    }
    Ok((out, lse))
}

/// A forward whose `splits` key splits each write a normalised partial O and LSE: `run(o, lse,
/// (o_split_stride, lse_split_stride))` launches the splits' kernel on the partials (one
/// allocation), then the combine pass merges them into `out` and `lse`.
fn split_and_combine(
    dev: &CudaDevice,
    p: &Problem,
    elem: DeviceElem,
    splits: u32,
    out: &Tensor,
    lse: &Tensor,
    run: impl FnOnce(&Tensor, &Tensor, (u64, u64)) -> Result<()>,
) -> Result<()> {
    let rows = query_rows(p);
    let (b, sq, h, hd) = (rows.batch as usize, rows.seqlen_q as usize, p.dims.heads, p.dims.head_dim);
    let n = splits as usize;
    let mut parts = Tensor::empty_together(&[(&[n * b, sq, h, hd], p.dtype), (&[n * b, h, sq], DType::F32)], &out.device())?;
    let (o_part, lse_part) = (parts.remove(0), parts.remove(0));
    run(&o_part, &lse_part, ((b * sq * h * hd) as u64, (b * h * sq) as u64))?;
    let combine = CombineParams {
        o_part: o_part.device_ptr().expect("CUDA tensor"),
        lse_part: lse_part.device_ptr().expect("CUDA tensor"),
        o: qkv_view(out, "out")?,
        lse: lse.device_ptr().expect("CUDA tensor"),
        splits,
        rows,
    };
    launch(dev, &combine_launch(elem, &rows, dev.sms()), combine)
}

/// The combine's launch for `rows` on a GPU of `sms` SMs: where the rows number at most the
/// SMs, a CTA a row (`dmattn_combine_rows_<elem>`, the row's splits shared by its threads: a
/// decoding call of one query over long keys has a few rows and up to 128 splits), else a few
/// lanes a row (`dmattn_fwd_combine_<elem>`).
fn combine_launch(elem: DeviceElem, rows: &QueryRows, sms: u32) -> Launch {
    use dmattn_abi::names::{COMBINE_PREFIX, COMBINE_ROWS_PREFIX};
    if rows.count() <= sms {
        let name = format!("{COMBINE_ROWS_PREFIX}{}", elem.name());
        return Launch::kernel(&name, (rows.count(), 1, 1), PRE_THREADS, dmattn_abi::COMBINE_ROWS_SMEM_BYTES);
    }
    Launch::kernel(&format!("{COMBINE_PREFIX}{}", elem.name()), (row_blocks(rows), 1, 1), PRE_THREADS, 0)
}

/// Runs a decoding `plan` (see [`decode::decode_plan`]) of problem `p` on `saved`'s operands:
/// its kernel, and the combine pass of a split. Returns O and LSE.
fn run_decode(dev: &CudaDevice, plan: &decode::DecodePlan, p: &Problem, saved: &Saved, into: ForwardBuffers) -> Result<(Tensor, Tensor)> {
    check_limits(&p.dims, dmattn_abi::DECODE_ROWS)?;
    let (out, lse) = forward_outputs(p, saved, into)?;
    // Held until the launches are queued; kept with the sequence lengths.
    let order = match &p.seqs {
        Some(seqs) if plan.ordered => {
            let which = packed::OrderKey::Decode { kv_heads: plan.grid.0, splits: plan.splits, split_keys: plan.split_keys };
            packed::device_order(dev, seqs, &p.band, which, capturing(dev)?)?
        }
        _ => None,
    };
    let order_at = order.as_ref().map_or(0, |o| o.ptr());
    // A key-side mask as the caller gave it (no launch before the kernel).
    let mask_bytes = device_mask(saved).and_then(|m| m.key_bytes.as_ref()).map_or(View4::ABSENT, |k| k.view);
    if plan.splits == 1 {
        decode::launch_decode(dev, plan, FwdParams { order: order_at, ..fwd_params(p, saved, &out, &lse, false)? }, mask_bytes)?;
    } else {
        split_and_combine(dev, p, plan.elem, plan.splits, &out, &lse, |o_part, lse_part, strides| {
            let mut params = fwd_params(p, saved, o_part, lse_part, false)?;
            params.splits = plan.splits;
            (params.o_split_stride, params.lse_split_stride) = strides;
            params.order = order_at;
            decode::launch_decode(dev, plan, params, mask_bytes)
        })?;
    }
    Ok((out, lse))
}

/// A forward's work order, held until its launch is queued: made for the call, or kept with a
/// packed batch's lengths.
#[allow(dead_code)] // held, not read
enum Order {
    Made(DeviceBuffer),
    Kept(Arc<DeviceBuffer>),
}

/// Whether a fixed-length forward's bias is read by several heads a row (`[.., 1 | hk, sq, sk]`
/// under more heads): in grid order (query tiles fastest) or a work order, the heads sharing a
/// bias tile run a wave or more apart and each reads it from DRAM (H200, ncu, b2 h32 hk8 d128 8K,
/// 50 % blocks + a `[b, 1, s, s]` bias: L2 hit rate 57 %, 26 % of DRAM bandwidth; the same
/// blocks without the bias 96 %).
fn bias_heads_first(p: &Problem) -> bool {
    p.seqs.is_none() && p.bias.is_some_and(|s| s[1] < p.dims.heads && s[2] > 1)
}

/// Whether running the forward's CTAs heaviest first pays: the order interleaves heads, so
/// neighbouring CTAs no longer share one head's K and V in L2; it is kept to problems whose K
/// and V all fit in L2 at once, and to grids of more than one CTA per SM (a single wave has no
/// tail to balance). The kernels number CTAs in u32.
fn order_pays(sms: u32, l2_bytes: usize, d: &Dims, grid: (u32, u32, u32)) -> bool {
    let ctas = grid.0 as u64 * grid.1 as u64 * grid.2 as u64;
    let kv_bytes = 2 * 2 * d.batch * d.kv_heads * d.seqlen_k * d.head_dim;
    ctas > sms as u64 && ctas <= u32::MAX as u64 && kv_bytes <= l2_bytes
}

/// Whether the backward's placement pays where it has no work order to fall back on the grid
/// order (`bwd_plan`: a call with a prepared mask is placed whatever this says): kv heads first
/// (`lean`: the lean variant's, under a causal-like band). Placement gives up the grid order's
/// sharing of Q and dO in L2 between the key tiles of a kv head, so they are kept to problems
/// whose Q and dO stay within a few times L2's size, or that have few key tiles to share them: at
/// most 256 L2 sizes (`lean`: 512) read again if each key tile read them from DRAM. Same-run A/Bs
/// against grid order (50 MB L2; in L2 sizes):
/// - placed, b2 h32 hk8, 50 % blocks with and without a bias (H100): d64 4K and 8K, d128 4K
///   (43-164) 4.5-10 % faster; d128 8K (328) 3-17 % slower, d64 16K (655) unchanged. Gathered
///   d128 32K, top-2048 keys (H200; 82): 18 % faster, its CTAs' query walks differing most.
/// - lean, b2 h32 hk8 (H100): causal d128 4K (82) 18 % faster, 8K (328) 5 %, 16K (1311) 5 %
///   slower; compressed causal (factor 4) 16K x 4K, d64 (164) 21 % and d128 (328) 19 % faster.
fn bwd_placement_pays(l2_bytes: usize, d: &Dims, n_blocks: usize, lean: bool) -> bool {
    let q_dout_bytes = 2 * 2 * d.batch * d.heads * d.seqlen_q * d.head_dim;
    let reread_limit = if lean { 512 } else { 256 } * l2_bytes;
    q_dout_bytes <= 3 * l2_bytes || q_dout_bytes.saturating_mul(n_blocks) <= reread_limit
}

/// A work order (`FwdParams::order`) for a grid of `grid` CTAs from the ordering kernel `name`:
/// each CTA's visited tiles counted from the block map and sorted heaviest first, in one
/// launch. The buffer holds the order (u64 per CTA), then the counts (u32 per CTA).
fn work_order(dev: &CudaDevice, name: &str, fwd: &FwdParams, grid: (u32, u32, u32), kv_heads_first: bool) -> Result<(DeviceBuffer, u64)> {
    let ctas = (grid.0 * grid.1 * grid.2) as usize;
    // The pass writes a count for every CTA before reading it, and fills every slot.
    let buf = DeviceBuffer::uninit(dev.stream(), 12 * ctas)?;
    let order = buf.ptr();
    let params = OrderParams { fwd: *fwd, work: order + 8 * ctas as u64, order, ticket: dev.order_ticket(), kv_heads_first: kv_heads_first as u32 };
    let blocks = ctas.div_ceil(ORDER_WARPS as usize) as u32;
    launch(dev, &Launch::kernel(name, (blocks, 1, 1), 32 * ORDER_WARPS, ORDER_SMEM_BYTES), params)?;
    Ok((buf, order))
}

/// A zeroed device buffer of `n` f32 or u32 elements and its address.
fn zeroed(dev: &CudaDevice, n: usize) -> Result<(DeviceBuffer, u64)> {
    let buf = DeviceBuffer::filled(dev.stream(), 4 * n, 0)?;
    let ptr = buf.ptr();
    Ok((buf, ptr))
}

/// Converts `len` accumulated f32 values at `src` into `dst` (16-bit `elem`).
fn convert(dev: &CudaDevice, elem: DeviceElem, src: u64, dst: &Tensor, len: usize) -> Result<()> {
    let params = ConvertParams { src, dst: dst.device_ptr().expect("CUDA tensor"), len: len as u64 };
    let blocks = (len.div_ceil(2 * PRE_THREADS as usize)).clamp(1, 4096) as u32;
    let name = format!("{}{}", dmattn_abi::names::CONVERT_PREFIX, elem.name());
    launch(dev, &Launch::kernel(&name, (blocks, 1, 1), PRE_THREADS, 0), params)
}

/// dQ's f32 accumulator: its elements and strides. The Hopper kernels (`wgmma`) add to the
/// blocked layout of `dmattn_abi::DqConvertParams` (a fixed-length entry's rows rounded up to 16,
/// a packed batch's padded per sequence); the others to `[b, sq, h, d]`.
struct DqAccum {
    len: usize,
    stride: [u64; 4],
}

/// [`DqAccum`] for `rows` (a packed batch's: one entry of `total_q` rows, of `sequences`).
/// An entry is the whole accumulator of a single-entry call: batch stride 0, as the kernels'
/// packed indexing (`seq::localize`) and the other operands' views have it.
fn dq_accum_layout(rows: &QueryRows, sequences: Option<usize>, blocked: bool) -> DqAccum {
    let (h, d) = (rows.heads as usize, rows.head_dim as usize);
    let group = dmattn_abi::DQ_GROUP_ROWS as usize;
    let per_entry = match (sequences, blocked) {
        (_, false) => rows.seqlen_q as usize,
        (None, true) => (rows.seqlen_q as usize).next_multiple_of(group),
        (Some(n), true) => dmattn_abi::dq_blocked_rows(rows.seqlen_q as u64, n as u64) as usize,
    };
    let row = (h * d) as u64;
    let entry = if rows.batch == 1 { 0 } else { per_entry as u64 * row };
    let stride = if blocked { [entry, row, (group * d) as u64, 1] } else { prepare::strides([rows.batch as usize, per_entry, h, d]) };
    DqAccum { len: rows.batch as usize * per_entry * h * d, stride }
}

/// dQ out of the Hopper kernels' blocked accumulator (`params.dq_accum`) into `dst` (contiguous,
/// the shape `q_shape` of the query rows).
fn convert_dq(dev: &CudaDevice, elem: DeviceElem, p: &Problem, params: &BwdParams, dst: &Tensor, q_shape: [usize; 4]) -> Result<()> {
    let d = &p.dims;
    // Written through dq's own strides: a caller's is contiguous, a gathered backward's head
    // chunks pass a strided view of one (`gather::Chunks::Heads`; multiples of 8 elements). A
    // packed call's 3-D dq is seen as `q_shape`.
    let dst = if dst.shape().len() == 4 { broadcast_view(dst) } else { View4 { ptr: dst.device_ptr().expect("CUDA tensor"), stride: prepare::strides(q_shape) } };
    let cp = DqConvertParams {
        src: params.dq_accum,
        dst,
        seqs: params.fwd.seqs,
        batch: d.batch as u32,
        seqlen_q: d.seqlen_q as u32,
        heads: d.heads as u32,
        head_dim: d.head_dim as u32,
    };
    // Units of the longest sequence, `lanes` threads each (`bwd_pre::convert_dq`).
    let x = cp.units(cp.seqlen_q).div_ceil(PRE_THREADS / cp.lanes()).clamp(1, 65535);
    let z = d.batch.clamp(1, 65535) as u32;
    let name = format!("{}{}", dmattn_abi::names::CONVERT_DQ_PREFIX, elem.name());
    launch(dev, &Launch::kernel(&name, (x, 1, z), PRE_THREADS, 0), cp)
}

/// The backward variant of `tile` (the Hopper module's or the portable one's) for a call with
/// `modifiers`: the leanest that module has.
fn bwd_variant(tile: &BwdTile, modifiers: u8) -> u8 {
    // Only the Hopper backward has the lean modifier variants.
    match modifiers {
        modifiers::MASK | modifiers::BIAS if !tile.wgmma => modifiers::ALL,
        v => v,
    }
}

/// The backward variant of `tile` for a call with `modifiers` whose band needs a band kernel
/// (`banded`): the portable `_mods` variants, and the Hopper plain and `_mask` ones' `_band`
/// variants (see `dmattn_abi::names::BAND_SUFFIX`).
fn bwd_band_variant(tile: &BwdTile, modifiers: u8, banded: bool) -> u8 {
    if banded && !tile.wgmma { modifiers::ALL } else { bwd_variant(tile, modifiers) }
}

/// Whether the Hopper backward serves a call: it has band kernels only without a bias.
fn bwd_wgmma_serves(modifiers: u8, banded: bool) -> bool {
    !banded || modifiers == modifiers::NONE || modifiers == modifiers::MASK
}

/// The backward kernel of `tile` for a call with `modifiers` (see [`bwd_band_variant`]), where
/// `split` (its query tiles shared among CTAs) the one that may split them.
fn bwd_kernel_name(tile: &BwdTile, elem: DeviceElem, head_dim: usize, modifiers: u8, deterministic: bool, banded: bool, split: bool) -> String {
    let prefix = if tile.wgmma { dmattn_abi::names::BWD_WGMMA_PREFIX } else { dmattn_abi::names::BWD_PREFIX };
    let mut name = kernel_name(prefix, elem, head_dim, bwd_band_variant(tile, modifiers, banded));
    if deterministic {
        name += dmattn_abi::names::DETERMINISTIC_SUFFIX;
    }
    if banded && tile.wgmma {
        name += dmattn_abi::names::BAND_SUFFIX;
    }
    if split && !bwd_splits(head_dim as u32) {
        name += dmattn_abi::names::SPLIT_SUFFIX;
    }
    name
}

/// The unfused forward (`materialized`), over gathered keys where the mask says so.
pub(crate) fn forward_materialized(dev: &CudaDevice, p: Problem, saved: Saved) -> Result<Forward> {
    if p.seqs.is_some() {
        return Err(Error::Unsupported { what: "forward_materialized of a packed batch".into(), backend: BACKEND });
    }
    let saved = with_prepared_key_bytes(dev, &saved)?.unwrap_or(saved);
    match key_lists(&saved) {
        Some(lists) => gather::forward_materialized(dev, p, saved, &lists),
        None => materialized::forward(dev, p, saved),
    }
}

/// How a backward runs, worked out from the problem and the GPU's size alone: the kernel, its
/// tile and grid, where its CTAs go, and how many CTAs share each key tile's query tiles.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BwdPlan {
    pub kernel: String,
    pub tile: BwdTile,
    pub grid: (u32, u32, u32),
    /// CTAs run heaviest first, in an order the work-order pass makes.
    pub ordered: bool,
    /// The grid is `(kv_heads, key tiles, batch)` (`BwdParams::kv_heads_first`).
    pub kv_heads_first: bool,
    /// log2 of the CTAs each key tile's query tiles are split among (`BwdParams::q_split_shift`);
    /// a split call launches `grid` once per batch entry.
    pub q_split_shift: u32,
}

/// A grid of at most this many CTAs per SM splits its query tiles (`bwd_q_split_shift`) ...
const BWD_SPLIT_BELOW_PER_SM: u64 = 2;
/// ... where it has at most this many batch entries (a split call launches once per entry).
const BWD_SPLIT_MAX_BATCH: usize = 8;
/// Split grids aim at this many CTAs per SM ...
const BWD_SPLIT_TARGET_PER_SM: u64 = 4;
/// ... each walking at least this many query tiles (its K/V load and dK/dV additions are then
/// small beside its steps).
const BWD_SPLIT_MIN_TILES: usize = 8;

/// log2 of the CTAs each key tile's query tiles are split among, for `batch` entries of `ctas`
/// CTAs each (one per key tile and kv head) over `m_tiles` query tiles: where the grid leaves the
/// GPU short (few key tiles: short or compressed keys, few heads), each entry's tiles are shared
/// until its launch reaches `BWD_SPLIT_TARGET_PER_SM` CTAs per SM or a share would walk fewer
/// than `BWD_SPLIT_MIN_TILES`. (H100, b2 h32 hk8 d64, 16K queries over 256 compressed keys: 32
/// CTAs of 256 query tiles each, the GPU a quarter busy.)
fn bwd_q_split_shift(sms: u32, batch: usize, ctas: u64, m_tiles: usize) -> u32 {
    let mut shift = 0;
    if ctas == 0 || batch > BWD_SPLIT_MAX_BATCH || batch as u64 * ctas > BWD_SPLIT_BELOW_PER_SM * sms as u64 {
        return 0;
    }
    while ctas << shift < BWD_SPLIT_TARGET_PER_SM * sms as u64 && m_tiles >> (shift + 1) >= BWD_SPLIT_MIN_TILES && shift < 16 {
        shift += 1;
    }
    shift
}

std::thread_local! {
    static FORCED_WS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Testing hook: while `Some(on)`, a fixed-length forward this thread runs that may take a
/// one-CTA-an-SM warp-specialised kernel in place of a two-CTA one (the mask-only kernel for a
/// mask alone with its keys not split; at d64 the modifier one) does (`true`) or does not,
/// however few key tiles it spans (see `WS_MIN_KEY_TILES`), so that small problems exercise
/// those kernels; `None`: the plan's own choice.
#[doc(hidden)]
pub fn force_forward_warp_specialised(on: Option<bool>) {
    FORCED_WS.with(|f| f.set(on));
}

std::thread_local! {
    static FORCED_PERSISTENT_CTAS: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// Testing hook: while `Some(n)` (n ≥ 1), a forward this thread runs on the persistent lean
/// kernel (Hopper, fixed lengths, no mask, bias or softcap, d128) launches at most `n` CTAs, so that
/// small problems put many query tiles through each CTA; `None`: one an SM.
#[doc(hidden)]
pub fn force_forward_persistent_ctas(n: Option<u32>) {
    FORCED_PERSISTENT_CTAS.with(|f| f.set(n.map(|n| n.max(1))));
}

std::thread_local! {
    static FORCED_SPLIT: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// Testing hook: while `Some(shift)`, every backward this thread runs that may split its query
/// tiles (not deterministic, not packed, contiguous dK/dV) splits them among `2^shift` CTAs per
/// key tile, whatever its size, so that small problems exercise the split path's edges (shares
/// with no visible tile, bands, masks). `None`: the plan's own choice.
#[doc(hidden)]
pub fn force_backward_query_split(shift: Option<u32>) {
    FORCED_SPLIT.with(|f| f.set(shift.map(|s| s.min(8))));
}

std::thread_local! {
    static FORCED_PLACEMENT: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Testing hook: while `Some(on)`, a backward this thread runs that could be placed (a work
/// order, kv heads first) is, or is not, whatever its size and `bwd_placement_pays` say, so that
/// small problems exercise the placed grids; `None`: the plan's own choice.
#[doc(hidden)]
pub fn force_backward_placement(on: Option<bool>) {
    FORCED_PLACEMENT.with(|f| f.set(on));
}

/// The backward's plan for `p` on `gpu`, with `modifiers` (the variant the call needs), a
/// `prepared` mask, and dK/dV outputs that are `contiguous` (split query tiles accumulate them in
/// f32 and convert into contiguous outputs); `forced_split` overrides the split where one may run
/// ([`force_backward_query_split`]).
pub(crate) fn bwd_plan(gpu: Gpu, p: &Problem, elem: DeviceElem, modifiers: u8, prepared: bool, contiguous: bool, forced_split: Option<u32>) -> Result<BwdPlan> {
    let d = p.dims;
    let deterministic = p.deterministic;
    let banded = p.band.needs_band_kernel();
    let wgmma = gpu.wgmma && bwd_wgmma_serves(modifiers, banded);
    let tile = bwd_tile(d.head_dim as u32, deterministic, wgmma, modifiers).ok_or_else(|| unsupported_head_dim(d.head_dim))?;
    check_limits(&d, tile.block_m)?;
    let (m_tiles, n_blocks) = (d.seqlen_q.div_ceil(tile.block_m as usize), d.seqlen_k.div_ceil(tile.block_n as usize));
    let (entry_ctas, sms) = ((n_blocks * d.kv_heads) as u64, gpu.sms as u64);
    let ctas = entry_ctas * d.batch as u64;
    // Split query tiles add their dK/dV in any order: not in deterministic mode. Packed CTAs find
    // their sequence in the grid's z (`seq::localize`). Bands with a right edge off the diagonal
    // (or a left edge alone) do not split (`Band::splits_queries`), nor calls without a kernel
    // that may (`bwd_splits`, `bwd_split_kernel`).
    let variant = bwd_band_variant(&tile, modifiers, banded);
    let hd = d.head_dim as u32;
    let splittable = !deterministic
        && p.seqs.is_none()
        && contiguous
        && p.band.splits_queries()
        && (bwd_splits(hd) || bwd_split_kernel(hd, tile.wgmma, variant));
    let q_split_shift = match forced_split {
        _ if !splittable => 0,
        Some(shift) => shift,
        None => bwd_q_split_shift(gpu.sms, d.batch, entry_ctas, m_tiles),
    };
    // CTAs run in grid order, x fastest: one kv head's key tiles side by side, so that their dQ
    // additions to a query tile meet in L2 and they share its Q and dO. A placed variant may run
    // otherwise where there is more than one wave (a single wave has neither a tail to balance
    // nor waves to keep apart) and `bwd_placement_pays`: heaviest first under a mask, and with a
    // bias every kv head adds to (broadcast over heads) the kv heads of a key tile side by side,
    // so that their dbias additions meet in L2 rather than each wave's going through DRAM to the
    // whole f32 accumulator (H100, d64 8K, 50 % blocks + bias: 7.7 GB of DRAM traffic, 0.8 GB
    // without the bias). Not for a packed batch: its CTAs find their sequence and key tile in the
    // grid (`seq::localize`), and the work-order pass reads fixed-length block maps.
    // With a work order (a prepared mask) a placed variant is placed whatever its size: the order
    // keeps the grid order where its key tiles' work varies little (`schedule::balanced` in the
    // kernels: random blocks), and runs them heaviest first where it varies a lot (a causal-like
    // pattern given as a mask). Without one, `bwd_placement_pays` decides.
    // The lean variant, which reads no work order, still runs kv heads first under a band whose
    // right edge alone bounds it (causal, compressed causal): there a kv head's key tiles get
    // lighter tile by tile, so kv heads first runs every kv head's heaviest tiles first.
    let falling = p.band.right != dmattn_abi::Band::NONE && p.band.left == dmattn_abi::Band::NONE;
    let lean = !modifiers::bwd_placed(variant) && modifiers::bwd_swaps(variant) && falling;
    let placement = !deterministic
        && q_split_shift == 0
        && p.seqs.is_none()
        && (lean || modifiers::bwd_placed(variant))
        && FORCED_PLACEMENT.with(|f| f.get()).unwrap_or_else(|| ctas > sms && ((prepared && !lean) || bwd_placement_pays(gpu.l2_bytes, &d, n_blocks, lean)));
    let placed = placement && !lean;
    // Key tiles then count along grid y and in a packed position's y: both 16-bit.
    let kv_heads_first = d.kv_heads > 1 && n_blocks <= u16::MAX as usize && placement && (lean || p.bias.is_some_and(|s| s[1] == 1));
    // A split call's launches (one per batch entry) take the splits along z.
    let (n, hk, b) = (n_blocks as u32, d.kv_heads as u32, if q_split_shift > 0 { 1 << q_split_shift } else { d.batch as u32 });
    let grid = if kv_heads_first { (hk, n, b) } else { (n, hk, b) };
    // Deterministic mode keeps grid order: there CTAs wait on CTAs of lower block index, which
    // the hardware schedules first, so any grid size is safe.
    let ordered = placed && prepared && ctas <= u32::MAX as u64;
    let kernel = bwd_kernel_name(&tile, elem, d.head_dim, modifiers, deterministic, banded, q_split_shift > 0);
    Ok(BwdPlan { kernel, tile, grid, ordered, kv_heads_first, q_split_shift })
}

/// The backward's element type and plan for the forward of `p` over `saved` on `dev`, into dK/dV
/// outputs that are `contiguous` (see [`bwd_plan`]).
pub(crate) fn backward_plan(dev: &CudaDevice, p: &Problem, saved: &Saved, contiguous: bool) -> Result<(DeviceElem, BwdPlan)> {
    let elem = check_operands(p, saved)?;
    // The Hopper `BIAS` variant reads no block classes (see `modifiers::BIAS`).
    let modifiers = match modifiers_of(p) {
        modifiers::BIAS if device_mask(saved).is_some_and(|m| m.blocks) => modifiers::ALL,
        m => m,
    };
    let prepared = device_mask(saved).is_some();
    Ok((elem, bwd_plan(dev.gpu(), p, elem, modifiers, prepared, contiguous, FORCED_SPLIT.with(|f| f.get()))?))
}

/// `p` for batch entry `b` alone: every batch-strided operand's base at the entry, its batch
/// stride 0, LSE and delta at its rows (a split call's launch, see `BwdParams::q_split_shift`).
fn batch_entry(p: &BwdParams, b: u64) -> BwdParams {
    let at = |v: View4, elem: u64| if v.is_present() { View4 { ptr: v.ptr + elem * b * v.stride[0], stride: [0, v.stride[1], v.stride[2], v.stride[3]] } } else { v };
    let f = &p.fwd;
    let rows = 4 * b * f.heads as u64 * f.seqs.lse_rows as u64;
    BwdParams {
        fwd: FwdParams {
            q: at(f.q, 2),
            k: at(f.k, 2),
            v: at(f.v, 2),
            o: at(f.o, 2),
            mask_bits: at(f.mask_bits, 8),
            bias: at(f.bias, 2),
            block_map: at(f.block_map, 1),
            lse: f.lse + rows,
            batch: 1,
            ..*f
        },
        dout: at(p.dout, 2),
        dq_accum: at(p.dq_accum, 4),
        dk: at(p.dk, 4),
        dv: at(p.dv, 4),
        dbias_accum: at(p.dbias_accum, 4),
        delta: p.delta + rows,
        ..*p
    }
}

pub(crate) fn backward(dev: &CudaDevice, fwd: &Forward, dout: &Tensor, into: GradientBuffers) -> Result<Gradients> {
    if let Some(saved) = with_prepared_key_bytes(dev, &fwd.saved)? {
        let packed = Forward { out: fwd.out.clone(), lse: fwd.lse.clone(), problem: fwd.problem.clone(), saved };
        return backward(dev, &packed, dout, into);
    }
    if let Some(lists) = key_lists(&fwd.saved) {
        return gather::backward(dev, fwd, &lists, dout, into);
    }
    let (p, saved) = (&fwd.problem, &fwd.saved);
    let d = p.dims;
    let device = saved.q.device();
    let dk = output(into.dk, saved.k.shape(), p.dtype, &device)?;
    let dv = output(into.dv, saved.v.shape(), p.dtype, &device)?;
    let contiguous = dk.layout().is_contiguous() && dv.layout().is_contiguous();
    let (elem, plan) = backward_plan(dev, p, saved, contiguous)?;
    let tile = plan.tile;
    let dout_view = qkv_view(dout, "dout")?;

    // delta = rowsum(dO * O).
    let rows = query_rows(p);
    let (_delta, delta) = zeroed(dev, rows.count() as usize)?;
    let pre = BwdPreParams {
        o: qkv_view(&fwd.out, "out")?,
        dout: dout_view,
        delta,
        rows,
    };
    let blocks = row_blocks(&rows);
    let pre_name = format!("{}{}", dmattn_abi::names::BWD_PRE_PREFIX, elem.name());
    launch(dev, &Launch::kernel(&pre_name, (blocks, 1, 1), PRE_THREADS, 0), pre)?;

    // Accumulators, outputs and (deterministic mode) turn counters.
    let deterministic = p.deterministic;
    let (m_tiles, n_blocks) = (d.seqlen_q.div_ceil(tile.block_m as usize), d.seqlen_k.div_ceil(tile.block_n as usize));
    let q_shape = [rows.batch as usize, rows.seqlen_q as usize, d.heads, d.head_dim];
    let dq_accum = dq_accum_layout(&rows, p.seqs.as_ref().map(|s| s.batch()), tile.wgmma);
    let (_dq_acc, dq_acc) = zeroed(dev, dq_accum.len)?;
    let bias_len = p.bias.map_or(0, |s| s.iter().product::<usize>());
    let (_dbias_acc, dbias_acc) = zeroed(dev, bias_len)?;
    let (_dq_turns, dq_turns) = zeroed(dev, if deterministic { d.batch * d.heads * m_tiles } else { 0 })?;
    let (_dbias_turns, dbias_turns) = zeroed(dev, if deterministic { d.batch * d.kv_heads * n_blocks } else { 0 })?;
    // Split query tiles add their dK and dV shares to f32 accumulators.
    let split = plan.q_split_shift > 0;
    let kv_shape = [d.batch, d.seqlen_k, d.kv_heads, d.head_dim];
    let kv_len = if split { kv_shape.iter().product() } else { 0 };
    let (_dk_acc, dk_acc) = zeroed(dev, kv_len)?;
    let (_dv_acc, dv_acc) = zeroed(dev, kv_len)?;
    let kv_accum = |ptr| View4 { ptr, stride: prepare::strides(kv_shape) };

    let mut params = BwdParams {
        fwd: fwd_params(p, saved, &fwd.out, &fwd.lse, false)?,
        dout: dout_view,
        dq_accum: View4 { ptr: dq_acc, stride: dq_accum.stride },
        dk: if split { kv_accum(dk_acc) } else { qkv_view(&dk, "dk")? },
        dv: if split { kv_accum(dv_acc) } else { qkv_view(&dv, "dv")? },
        dbias_accum: View4 { ptr: dbias_acc, stride: dbias_strides(p) },
        delta,
        dq_turns,
        dbias_turns,
        bias_dims: bias_dims(p),
        kv_heads: d.kv_heads as u32,
        kv_heads_first: plan.kv_heads_first as u32,
        q_split_shift: plan.q_split_shift,
        split_shares: 0,
        first_tile: 0,
        _pad: 0,
    };
    // Heaviest first (see `schedule`; the kernels number CTAs in u32).
    let order = if plan.ordered {
        let name = format!("{}{}", dmattn_abi::names::BWD_ORDER_PREFIX, tile.block_n);
        Some(work_order(dev, &name, &params.fwd, plan.grid, plan.kv_heads_first)?)
    } else {
        None
    };
    if let Some((_, at)) = &order {
        params.fwd.order = *at;
    }
    let kernel = Launch::kernel(&plan.kernel, plan.grid, tile.threads(), tile.smem_bytes());
    if split {
        // The shares, then a launch per batch entry (see `BwdParams::q_split_shift`).
        let entries = n_blocks << plan.q_split_shift;
        let shares = DeviceBuffer::uninit(dev.stream(), 16 * entries)?;
        let sp = BwdSharesParams {
            fwd: params.fwd,
            shares: shares.ptr(),
            block_m: tile.block_m,
            block_n: tile.block_n,
            key_tiles: n_blocks as u32,
            shift: plan.q_split_shift,
        };
        launch(dev, &Launch::kernel(dmattn_abi::names::BWD_SHARES, (entries.div_ceil(PRE_THREADS as usize) as u32, 1, 1), PRE_THREADS, 0), sp)?;
        params.split_shares = shares.ptr();
        for b in 0..d.batch {
            launch(dev, &kernel, batch_entry(&params, b as u64))?;
        }
        convert(dev, elem, dk_acc, &dk, kv_len)?;
        convert(dev, elem, dv_acc, &dv, kv_len)?;
    } else {
        launch(dev, &kernel, params)?;
    }

    let dq = output(into.dq, saved.q.shape(), p.dtype, &device)?;
    if tile.wgmma {
        convert_dq(dev, elem, p, &params, &dq, q_shape)?;
    } else if dq.layout().is_contiguous() {
        convert(dev, elem, dq_acc, &dq, dq.layout().numel())?;
    } else {
        // The flat conversion, then rows into a strided view (a gathered backward's head chunks).
        let flat = Tensor::empty(dq.shape(), dq.dtype(), &device)?;
        convert(dev, elem, dq_acc, &flat, flat.layout().numel())?;
        gather::copy_rows(dev, &flat, &dq)?;
    }
    let dbias = match &saved.bias {
        Some(b) => {
            let db = output(into.dbias, b.shape(), b.dtype(), &device)?;
            convert(dev, elem, dbias_acc, &db, bias_len)?;
            Some(db)
        }
        None => None,
    };
    Ok(Gradients { dq, dk, dv, dbias })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(batch: usize, heads: usize, seqlen_q: usize, seqlen_k: usize) -> Dims {
        Dims { batch, seqlen_q, seqlen_k, heads, kv_heads: 1, head_dim: 64 }
    }

    /// Decoding splits its keys for two CTAs per SM, at least two key tiles a split; a grid of
    /// two CTAs per SM runs unsplit.
    #[test]
    fn grids_smaller_than_the_gpu_split_their_keys() {
        assert_eq!(key_splits(132, &dims(1, 2, 1, 1 << 19), 128, 128), (128, 32));
        assert_eq!(key_splits(132, &dims(1, 2, 16384, 1024), 128, 128), (2, 4));
        assert_eq!(key_splits(132, &dims(1, 2, 32768, 1024), 128, 128).0, 1);
        let (splits, tiles) = key_splits(132, &dims(1, 2, 2048, 8192), 128, 128);
        assert!(splits > 1 && splits * tiles >= 64, "{splits} x {tiles}");
    }

    /// Few rows (one query of a few heads over split keys) take a CTA a row; many rows (the
    /// decoding batch's thousands) a few lanes a row, every row covered.
    #[test]
    fn few_rows_combine_a_cta_a_row() {
        let rows = |batch, heads, seqlen_q, head_dim| QueryRows { batch, heads, seqlen_q, head_dim };
        let few = combine_launch(DeviceElem::Bf16, &rows(1, 2, 1, 64), 132);
        assert_eq!((few.name(), few.grid()), ("dmattn_combine_rows_bf16", (2, 1, 1)));
        let edge = combine_launch(DeviceElem::F16, &rows(2, 66, 1, 128), 132);
        assert_eq!((edge.name(), edge.grid()), ("dmattn_combine_rows_f16", (132, 1, 1)));
        let many = rows(1, 32, 304, 128);
        let lanes = combine_launch(DeviceElem::Bf16, &many, 132);
        assert_eq!(lanes.name(), "dmattn_fwd_combine_bf16");
        // A warp holds 32 / lanes rows (16 bytes of the row a lane).
        assert!(lanes.grid().0 * PRE_THREADS / many.lanes() >= many.count().min(4096 * PRE_THREADS / many.lanes()));
    }

    /// An H100's size with only the portable module, and an H100.
    const A100_LIKE: Gpu = Gpu { sms: 132, l2_bytes: 50 << 20, wgmma: false };
    const H100: Gpu = Gpu { wgmma: true, ..A100_LIKE };

    fn problem(d: Dims, band: dmattn_abi::Band, bias: bool) -> Problem {
        let bias = bias.then_some([1, 1, 1, d.seqlen_k]);
        Problem { dims: d, dtype: DType::BF16, mask: None, bias, band, scale: 0.125, softcap: 0.0, deterministic: false, seqs: None, packed_bias: None, packed_mask: None, pages: None }
    }

    /// The blocked dQ accumulator holds every 16-row group the kernels add to: a fixed-length
    /// call's last entry's last group (its rows rounded up), a packed batch's every sequence at
    /// its `dq_blocked_row` (with batch stride 0: the kernels index a packed call's sequences as
    /// batch entries); the row-major one is `[b, sq, h, d]`.
    #[test]
    fn dq_accumulator_layouts() {
        for (batch, sq, heads, d) in [(1, 1, 1, 64), (1, 17, 3, 128), (3, 100, 2, 64), (2, 8192, 32, 128)] {
            let rows = QueryRows { batch, heads, seqlen_q: sq, head_dim: d };
            let a = dq_accum_layout(&rows, None, true);
            let groups = sq.div_ceil(16) as u64;
            let last = (batch as u64 - 1) * a.stride[0] + 16 * (groups - 1) * a.stride[1] + (heads as u64 - 1) * a.stride[2] + 16 * d as u64;
            assert!(last as usize <= a.len && a.stride[2] == 16 * d as u64, "{rows:?}");
            assert_eq!(a.stride[0] == 0, batch == 1);
            let r = dq_accum_layout(&rows, None, false);
            assert_eq!((r.len, r.stride), ((batch * sq * heads * d) as usize, prepare::strides([batch as usize, sq as usize, heads as usize, d as usize])));
        }
        let lens = [5u32, 16, 0, 33, 1];
        let total: u32 = lens.iter().sum();
        let rows = QueryRows { batch: 1, heads: 4, seqlen_q: total, head_dim: 64 };
        let a = dq_accum_layout(&rows, Some(lens.len()), true);
        assert_eq!(a.stride[0], 0);
        let mut q0 = 0;
        for (s, len) in lens.iter().enumerate() {
            let first = dmattn_abi::dq_blocked_row(q0, s as u32) as u64;
            let end = (first + 16 * len.div_ceil(16) as u64) * a.stride[1];
            assert!(end as usize <= a.len, "sequence {s}");
            q0 += len;
        }
    }

    /// The backward splits the query tiles of grids that leave the GPU short of CTAs (short or
    /// compressed keys) into shares of at least `BWD_SPLIT_MIN_TILES`, enough for about four CTAs
    /// per SM; never in deterministic mode, into strided dK/dV, or for grids of two CTAs per SM.
    #[test]
    fn backward_plans() {
        let plan = |d: Dims, det: bool, contiguous: bool| {
            let p = Problem { deterministic: det, ..problem(d, dmattn_abi::Band::CAUSAL, true) };
            bwd_plan(H100, &p, DeviceElem::Bf16, modifiers::BIAS, false, contiguous, None).unwrap()
        };
        // 16K queries over 256 keys, b2 h32 hk8.
        let short = Dims { kv_heads: 8, ..dims(2, 32, 16384, 256) };
        let split = plan(short, false, true);
        let (n, m) = (256u32.div_ceil(split.tile.block_n), 16384u32.div_ceil(split.tile.block_m));
        let ctas = (n * 8 * 2) as u64;
        assert!(split.q_split_shift > 0 && !split.ordered, "{split:?}");
        assert_eq!(split.grid, (n, 8, 1 << split.q_split_shift));
        assert!((ctas / 2) << split.q_split_shift >= 4 * 132 || m >> (split.q_split_shift + 1) < 8, "{split:?}");
        assert!(m >> split.q_split_shift >= 8);
        assert_eq!(plan(short, true, true).q_split_shift, 0);
        assert_eq!(plan(short, false, false).q_split_shift, 0);
        // Few query tiles: each share keeps at least 8.
        assert_eq!(plan(Dims { kv_heads: 8, ..dims(1, 8, 1024, 256) }, false, true).q_split_shift, (1024 / split.tile.block_m as u32 / 8).ilog2());
        // A right edge off the diagonal, or a left edge alone, keeps its query tiles together
        // (`Band::splits_queries`); causal windows and compressed causal split.
        let banded = |band| bwd_plan(H100, &problem(short, band, false), DeviceElem::Bf16, modifiers::NONE, false, true, None).unwrap().q_split_shift;
        assert_eq!(banded(dmattn_abi::Band { left: 100, right: 5, sinks: 0, compress: 0 }), 0);
        assert_eq!(banded(dmattn_abi::Band { left: 100, right: dmattn_abi::Band::NONE, sinks: 0, compress: 0 }), 0);
        assert!(banded(dmattn_abi::Band { left: 100, right: 0, sinks: 4, compress: 0 }) > 0);
        assert!(banded(dmattn_abi::Band { left: dmattn_abi::Band::NONE, right: 0, sinks: 0, compress: 64 }) > 0);
        // d96 and up keep one CTA per key tile (`bwd_splits`), forced or not, except on the
        // Hopper d128 kernels without a bias, which have split kernels of their own
        // (`bwd_split_kernel`): there the split calls, and only they, name them.
        let d128 = Dims { head_dim: 128, ..short };
        assert_eq!(plan(d128, false, true).q_split_shift, 0);
        let d128_plan = |band, mods, gpu, split| bwd_plan(gpu, &problem(d128, band, false), DeviceElem::Bf16, mods, false, true, split).unwrap();
        let forced = d128_plan(dmattn_abi::Band::CAUSAL, modifiers::NONE, A100_LIKE, Some(3));
        assert_eq!(forced.q_split_shift, 0);
        let forced = d128_plan(dmattn_abi::Band::CAUSAL, modifiers::NONE, H100, Some(3));
        assert_eq!((forced.q_split_shift, forced.kernel.as_str()), (3, "dmattn_bwd_sm90_bf16_d128_split"));
        let cf64 = dmattn_abi::Band { left: dmattn_abi::Band::NONE, right: 0, sinks: 0, compress: 64 };
        let own = d128_plan(cf64, modifiers::NONE, H100, None);
        assert!(own.q_split_shift > 0 && own.kernel == "dmattn_bwd_sm90_bf16_d128_band_split", "{own:?}");
        let masked = d128_plan(dmattn_abi::Band::CAUSAL, modifiers::MASK, H100, None);
        assert!(masked.q_split_shift > 0 && masked.kernel == "dmattn_bwd_sm90_bf16_d128_mask_split", "{masked:?}");
        let unsplit = bwd_plan(H100, &problem(Dims { kv_heads: 8, head_dim: 128, ..dims(2, 32, 8192, 8192) }, dmattn_abi::Band::CAUSAL, false), DeviceElem::Bf16, modifiers::NONE, false, true, None).unwrap();
        assert_eq!((unsplit.q_split_shift, unsplit.kernel.as_str()), (0, "dmattn_bwd_sm90_bf16_d128"));
        let d32 = bwd_plan(H100, &problem(Dims { head_dim: 32, ..short }, dmattn_abi::Band::CAUSAL, false), DeviceElem::Bf16, modifiers::NONE, false, true, None).unwrap();
        assert!(d32.q_split_shift > 0);
        // More than two CTAs per SM: unsplit.
        assert_eq!(plan(Dims { kv_heads: 8, ..dims(2, 32, 8192, 8192) }, false, true).q_split_shift, 0);
        assert_eq!(bwd_q_split_shift(132, 1, 2 * 132 + 1, 1 << 10), 0);
        assert_eq!(bwd_q_split_shift(132, 1, 33, 1 << 10), 4);
        assert_eq!(bwd_q_split_shift(132, 2, 33, 1 << 10), 4);
        assert_eq!(bwd_q_split_shift(132, 1, 33, 1 << 5), 2);
        // More batch entries than launches pay for; no key tiles at all.
        assert_eq!(bwd_q_split_shift(132, 9, 1, 1 << 10), 0);
        assert_eq!(bwd_q_split_shift(132, 1, 0, 1 << 10), 0);
    }

    /// The backward's placement (a work order under a prepared mask; for the lean variant under a
    /// causal-like band, its grid kv heads first): with a work order wherever there is more than a
    /// wave, otherwise where Q and dO fit a few L2 sizes, or where few key tiles would read them
    /// again (`bwd_placement_pays`); never in deterministic mode, nor for the lean variant without
    /// such a band.
    #[test]
    fn backward_placement() {
        // d128, a kv head per 4 heads; `bias`: a key-side one (broadcast over heads); `prepared`:
        // the call has a prepared mask (a work order can be written).
        let plan_of = |d: Dims, band, bias: bool, det: bool, mods: u8, prepared: bool| {
            let p = Problem { deterministic: det, ..problem(Dims { head_dim: 128, kv_heads: d.heads / 4, ..d }, band, bias) };
            bwd_plan(H100, &p, DeviceElem::Bf16, mods, prepared, true, None).unwrap()
        };
        let plan = |d: Dims, det: bool, mods: u8| plan_of(d, dmattn_abi::Band::ALL, true, det, mods, true);
        // b2 h32 d128 with a work order (a prepared mask): placed at any size (the order pass
        // keeps the grid order where the key tiles' work varies little). Without one (a bias
        // broadcast over heads: kv heads first), where Q and dO fit: 4K (134 MB), not 8K (268 MB
        // over 64 key tiles).
        assert!(plan(dims(2, 32, 4096, 4096), false, modifiers::BIAS).ordered);
        assert!(plan(dims(2, 32, 8192, 8192), false, modifiers::BIAS).ordered);
        let unprepared = |d: Dims| plan_of(d, dmattn_abi::Band::ALL, true, false, modifiers::BIAS, false);
        assert!(unprepared(dims(2, 32, 4096, 4096)).kv_heads_first);
        assert!(!unprepared(dims(2, 32, 8192, 8192)).kv_heads_first);
        // A gathered d128 32K call in four query chunks: 268 MB, but 16 key tiles.
        let gathered = plan(dims(4, 16, 8192, 2048), false, modifiers::BIAS);
        assert!(gathered.ordered && gathered.kv_heads_first, "{gathered:?}");
        assert!(!plan(dims(4, 16, 8192, 2048), true, modifiers::BIAS).ordered);
        assert!(!plan(dims(4, 16, 8192, 2048), false, modifiers::NONE).ordered);
        assert!(bwd_placement_pays(50 << 20, &Dims { head_dim: 128, ..dims(4, 16, 8192, 2048) }, 16, false));
        assert!(!bwd_placement_pays(50 << 20, &Dims { head_dim: 128, ..dims(4, 16, 8192, 8192) }, 64, false));
        // The lean variant under a causal-like band: kv heads first, no work order.
        let lean = |d: Dims, band| plan_of(d, band, false, false, modifiers::NONE, false);
        let compressed = dmattn_abi::Band { compress: 4, ..dmattn_abi::Band::CAUSAL };
        for (d, band, swapped) in [
            (dims(2, 32, 4096, 4096), dmattn_abi::Band::CAUSAL, true),
            (dims(2, 32, 8192, 8192), dmattn_abi::Band::CAUSAL, true),
            (dims(2, 32, 16384, 16384), dmattn_abi::Band::CAUSAL, false),
            (dims(2, 32, 16384, 4096), compressed, true),
            (dims(2, 32, 4096, 4096), dmattn_abi::Band::ALL, false),
            (dims(2, 32, 4096, 4096), dmattn_abi::Band { left: 256, ..dmattn_abi::Band::CAUSAL }, false),
        ] {
            let plan = lean(d, band);
            assert_eq!((plan.kv_heads_first, plan.ordered), (swapped, false), "{d:?} {band:?}");
            let n = d.seqlen_k.div_ceil(plan.tile.block_n as usize) as u32;
            assert_eq!(plan.grid, if swapped { (8, n, 2) } else { (n, 8, 2) });
        }
    }

    /// The forward's plan: the lean kernel without modifiers, the modifier kernel with any, its
    /// gather variant for gathered keys (tiles shared evenly among splits, never a work order),
    /// and a work order only for a prepared mask's grids of more than a wave.
    #[test]
    fn forward_plans() {
        let causal = dmattn_abi::Band::CAUSAL;
        let plan = |d, bias, mask| fwd_plan(A100_LIKE, &problem(d, causal, bias), DeviceElem::Bf16, mask).unwrap();
        let lean = plan(dims(2, 8, 4096, 4096), false, FwdMask::None);
        assert_eq!((lean.kernel.as_str(), lean.splits, lean.ordered), ("dmattn_fwd_bf16_d64", 1, false));
        let biased = plan(dims(2, 8, 4096, 4096), true, FwdMask::None);
        assert_eq!(biased.kernel, "dmattn_fwd_bf16_d64_mods");
        assert!(plan(dims(2, 8, 4096, 4096), true, FwdMask::Prepared).ordered);
        // Gathered: the narrow tile below two 128-row CTAs per SM (256 here), unsplit at 512.
        let gathered = plan(dims(1, 2, 16384, 16384), true, FwdMask::Gathered);
        assert_eq!((gathered.kernel.as_str(), gathered.split_tiles, gathered.ordered), ("dmattn_fwd_bf16_d64_mods_gather_narrow", 0, false));
        assert_eq!((gathered.tile.block_m, gathered.splits, gathered.grid), (64, 1, (256, 2, 1)));
        let wide = plan(dims(1, 2, 32768, 32768), true, FwdMask::Gathered);
        assert_eq!((wide.kernel.as_str(), wide.tile.block_m, wide.splits), ("dmattn_fwd_bf16_d64_mods_gather", 128, 1));
        let d128 = Dims { head_dim: 128, ..dims(1, 2, 16384, 16384) };
        assert_eq!(plan(d128, true, FwdMask::Gathered).kernel, "dmattn_fwd_bf16_d128_mods_gather");
        // More than a wave unsplit: every head's heaviest query tiles first.
        assert!(plan(dims(1, 16, 32768, 32768), true, FwdMask::Gathered).heads_first);
        assert!(!plan(dims(1, 16, 32768, 32768), true, FwdMask::Prepared).heads_first);
        // Decoding over gathered keys splits as the call's keys would, sharing its tiles evenly.
        let decode = plan(dims(1, 2, 1, 1 << 19), true, FwdMask::Gathered);
        assert_eq!((decode.splits, decode.split_tiles, decode.grid.2), (128, 0, 128));
        assert_eq!(plan(dims(1, 2, 1, 1 << 19), true, FwdMask::Prepared).split_tiles, 32);
    }

    /// A packed batch runs the modifier variant's packed kernel (the others serve fixed lengths
    /// only), over the longest sequence's query tiles and every sequence; with paged K/V, its
    /// paged kernel. Without mask, bias or softcap, the Hopper module's lean packed kernel (d64
    /// and d128), or its paged twin.
    #[test]
    fn packed_batches_run_the_modifier_variant() {
        let seqs = crate::SeqLens::from_lengths(&[100, 3000, 0], &[100, 3000, 7], &crate::Device::Cpu).unwrap();
        let packed = |heads, bias| Problem { seqs: Some(seqs.clone()), ..problem(dims(3, heads, 3000, 3000), dmattn_abi::Band::CAUSAL, bias) };
        for gpu in [A100_LIKE, H100] {
            // More than a wave: in the order its lengths give.
            let plan = fwd_plan(gpu, &packed(8, true), DeviceElem::Bf16, FwdMask::None).unwrap();
            assert!(plan.kernel.ends_with("_d64_mods_packed"), "{}", plan.kernel);
            assert_eq!((plan.grid, plan.splits, plan.ordered), ((3000u32.div_ceil(plan.tile.block_m), 8, 3), 1, true));
            // Lean on Hopper at d128 (in grid order: the lean kernel reads no work order).
            let d128 = |p: Problem| Problem { dims: Dims { head_dim: 128, ..p.dims }, ..p };
            let lean = fwd_plan(gpu, &d128(packed(8, false)), DeviceElem::Bf16, FwdMask::None).unwrap();
            let want = if gpu.wgmma { "dmattn_fwd_sm90_bf16_d128_packed" } else { "dmattn_fwd_bf16_d128_mods_packed" };
            assert_eq!((lean.kernel.as_str(), lean.ordered), (want, !gpu.wgmma));
            assert_eq!(lean.tile.block_m, 128);
            // Over paged K/V the same kernel's paged twin, on the same grid: the same bits.
            let table = crate::PageTable::new(&[0; 3 * 47], 3, &crate::Device::Cpu).unwrap();
            let pages = Some(crate::problem::KvPages { table, page_size: 64 });
            let lean_paged = fwd_plan(gpu, &Problem { pages: pages.clone(), ..d128(packed(8, false)) }, DeviceElem::Bf16, FwdMask::None).unwrap();
            assert_eq!((lean_paged.kernel.clone(), lean_paged.grid, lean_paged.tile), (lean.kernel.replace("_packed", "_paged"), lean.grid, lean.tile));
            let lean64 = fwd_plan(gpu, &packed(8, false), DeviceElem::Bf16, FwdMask::None).unwrap();
            let want = if gpu.wgmma { "dmattn_fwd_sm90_bf16_d64_packed" } else { "dmattn_fwd_bf16_d64_mods_packed" };
            // Two consumer warpgroups for packed batches (the fixed-length d64 tile has three).
            assert_eq!((lean64.kernel.as_str(), lean64.tile.block_m, lean64.tile.threads()), (want, 128, if gpu.wgmma { 384 } else { 128 }));
            // Less: grid order (and split keys, which only the modifier variant takes).
            let plan = fwd_plan(gpu, &packed(1, false), DeviceElem::Bf16, FwdMask::None).unwrap();
            assert!(!plan.ordered && plan.splits > 1 && plan.kernel.ends_with("_d64_mods_packed"));
            // Paged K/V: the same plan on the modifier variant's paged kernel.
            let paged = Problem { pages: pages.clone(), ..packed(1, false) };
            let paged_plan = fwd_plan(gpu, &paged, DeviceElem::Bf16, FwdMask::None).unwrap();
            assert_eq!(paged_plan.kernel, plan.kernel.replace("_packed", "_paged"));
            assert_eq!((paged_plan.grid, paged_plan.splits, paged_plan.split_tiles, paged_plan.tile), (plan.grid, plan.splits, plan.split_tiles, plan.tile));
            let paged8 = Problem { pages: paged.pages.clone(), ..packed(8, true) };
            assert!(fwd_plan(gpu, &paged8, DeviceElem::Bf16, FwdMask::None).unwrap().kernel.ends_with("_d64_mods_paged"));
        }
    }

    /// With the Hopper module, d64 and d128 run its forward, on the portable tiles' shapes (so the
    /// same splits, narrow gather tile and work order) but for the lean variant's tile (never split
    /// or ordered; 192 rows at d64) and at d128 the warp-specialised modifier tile (its keys split
    /// in its own 128-key tiles); other head dims the portable one.
    #[test]
    fn hopper_forward_plans() {
        let causal = dmattn_abi::Band::CAUSAL;
        for (d, bias, mask) in [(dims(2, 8, 4096, 4096), false, FwdMask::None), (dims(1, 2, 16384, 16384), true, FwdMask::Gathered), (dims(1, 2, 1, 1 << 19), true, FwdMask::Prepared)] {
            for head_dim in [32, 64, 128, 256] {
                let p = problem(Dims { head_dim, ..d }, causal, bias);
                let (portable, hopper) = (fwd_plan(A100_LIKE, &p, DeviceElem::Bf16, mask).unwrap(), fwd_plan(H100, &p, DeviceElem::Bf16, mask).unwrap());
                let wgmma = matches!(head_dim, 64 | 128);
                assert_eq!(hopper.tile.wgmma, wgmma);
                // The lean calls, and the fixed-length modifier ones that gather nothing (at d64
                // over many key tiles, as here), run the warp-specialised kernels (the lean one
                // on its own tile); the others the portable tile shapes.
                let lean = !bias && mask == FwdMask::None;
                let ws_mods = wgmma && !lean && mask != FwdMask::Gathered;
                let ws_suffix = if ws_mods && head_dim == 64 { dmattn_abi::names::WS_SUFFIX } else { "" };
                let expected = if wgmma { portable.kernel.replace("dmattn_fwd_", "dmattn_fwd_sm90_") + ws_suffix } else { portable.kernel.clone() };
                assert_eq!(hopper.kernel, expected);
                assert_eq!(hopper.ordered, portable.ordered);
                // Keys split in the launched kernel's tiles: at d128 the warp-specialised
                // modifier kernel's 128 keys, twice the portable tile's (d64's are the same).
                let key_tiles = |plan: &FwdPlan| (plan.splits, plan.split_tiles * plan.tile.block_n);
                if ws_mods && head_dim == 128 {
                    assert_eq!((hopper.tile.block_n, portable.tile.block_n), (128, 64));
                    assert!(hopper.splits <= portable.splits && hopper.splits as usize * hopper.split_tiles as usize * 128 >= d.seqlen_k, "{hopper:?}");
                    if d.seqlen_q == 1 {
                        // 512K keys: 128 splits of 32 128-key tiles (the portable tile: 64 of 64).
                        assert_eq!((hopper.splits, hopper.split_tiles, portable.split_tiles), (128, 32, 64));
                    }
                } else {
                    assert_eq!(key_tiles(&hopper), key_tiles(&portable));
                }
                let rows = if wgmma && lean && head_dim == 64 { 192 } else { portable.tile.block_m };
                assert_eq!((hopper.tile.block_m, hopper.grid.0), (rows, d.seqlen_q.div_ceil(rows as usize) as u32));
                assert_eq!(hopper.grid.1, portable.grid.1);
                assert_eq!(hopper.grid.2 / hopper.splits, portable.grid.2 / portable.splits);
                assert_eq!(hopper.tile.producer, wgmma && (lean || ws_mods));
                assert_eq!(hopper.tile.modifiers, ws_mods);
                assert!(lean || ws_mods || hopper.tile.block_n == portable.tile.block_n);
            }
        }
    }

    /// A mask alone at d64 or d128 on Hopper: the mask-only kernel on 128-key tiles where the
    /// keys are not split, on the modifier tile's query rows (the same grid and work order);
    /// split, or with a bias, the modifier kernel; at d64 over few key tiles, the two-CTA
    /// modifier kernel too.
    #[test]
    fn mask_only_plans() {
        for head_dim in [64, 128] {
            let masked = |d: Dims, bias: bool| {
                let p = problem(Dims { head_dim, ..d }, dmattn_abi::Band::CAUSAL, bias);
                Problem { mask: Some([1, 1]), ..p }
            };
            let plan = |gpu: Gpu, p: &Problem| fwd_plan(gpu, p, DeviceElem::Bf16, FwdMask::Prepared).unwrap();
            let big = masked(dims(2, 8, 8192, 8192), false);
            let (mask, mods) = (plan(H100, &big), plan(H100, &masked(dims(2, 8, 8192, 8192), true)));
            let name = format!("dmattn_fwd_sm90_bf16_d{head_dim}");
            assert_eq!((mask.kernel.clone(), mask.tile.block_n, mask.tile.mask_only), (format!("{name}_mask"), 128, true));
            assert_eq!(mods.kernel, format!("{name}_mods{}", if head_dim == 64 { "_ws" } else { "" }));
            assert_eq!((mask.grid, mask.splits, mask.ordered, mask.tile.block_m), (mods.grid, 1, mods.ordered, mods.tile.block_m));
            assert!(mask.tile.smem_bytes() <= 227 * 1024);
            let split = plan(H100, &masked(dims(1, 2, 64, 1 << 16), false));
            assert!(split.splits > 1 && split.kernel.ends_with(if head_dim == 64 { "_mods_ws" } else { "_mods" }), "{split:?}");
            assert_eq!(plan(A100_LIKE, &big).kernel, format!("dmattn_fwd_bf16_d{head_dim}_mods"));
            // Few key tiles (a 16K x 256 compressed pattern): d128 keeps the mask-only kernel.
            let short = plan(H100, &masked(dims(2, 8, 16384, 256), false));
            assert_eq!(short.kernel, format!("{name}_{}", if head_dim == 64 { "mods" } else { "mask" }));
            let edge = |sk| plan(H100, &masked(dims(2, 8, 4096, sk), false)).kernel;
            assert_eq!((edge(15 * 128).ends_with("_mask"), edge(15 * 128 + 1).ends_with("_mask")), (head_dim != 64, true));
            let forced = |on| fwd_plan_copying(H100, &masked(dims(2, 8, 16384, 256), false), DeviceElem::Bf16, FwdMask::Prepared, true, Some(on)).unwrap().kernel;
            assert_eq!((forced(true), forced(false)), (format!("{name}_mask"), format!("{name}_mods")));
        }
    }

    /// A per-query bias that heads share runs heads fastest (no work order) on the
    /// warp-specialised modifier kernel (d128; d64 over many key tiles); a bias per head, a
    /// key-side one, a grid of one wave, a split call or the d64 two-CTA kernel keep their order.
    #[test]
    fn shared_bias_runs_heads_first() {
        let d = Dims { kv_heads: 8, head_dim: 128, ..dims(2, 32, 4096, 4096) };
        let d64 = |sk| Problem { mask: Some([1, 1]), bias: Some([2, 1, 4096, sk]), ..problem(Dims { head_dim: 64, seqlen_k: sk, ..d }, dmattn_abi::Band::ALL, false) };
        let d64_plan = |sk| fwd_plan(H100, &d64(sk), DeviceElem::Bf16, FwdMask::Prepared).unwrap();
        assert!(d64_plan(4096).heads_first && d64_plan(4096).kernel.ends_with("_mods_ws"));
        assert!(!d64_plan(1024).heads_first && d64_plan(1024).kernel.ends_with("_mods"));
        let plan = |d: Dims, bias: [usize; 4]| {
            let p = Problem { mask: Some([1, 1]), bias: Some(bias), ..problem(d, dmattn_abi::Band::ALL, false) };
            fwd_plan(H100, &p, DeviceElem::Bf16, FwdMask::Prepared).unwrap()
        };
        let order = |p: FwdPlan| (p.heads_first, p.ordered);
        assert_eq!(order(plan(d, [2, 1, 4096, 4096])), (true, false));
        assert_eq!(order(plan(d, [2, 8, 4096, 4096])), (true, false));
        assert_eq!(order(plan(d, [2, 32, 4096, 4096])), (false, true));
        assert_eq!(order(plan(d, [2, 1, 1, 4096])), (false, true));
        assert!(!plan(Dims { kv_heads: 1, head_dim: 128, ..dims(1, 1, 256, 8192) }, [1, 1, 256, 8192]).heads_first);
        assert!(!plan(Dims { kv_heads: 1, head_dim: 128, ..dims(1, 2, 1, 1 << 19) }, [1, 1, 1, 1 << 19]).heads_first);
    }

    /// The bulk-copy lean kernel is persistent at d128: a CTA an SM, or one a query tile where
    /// there are fewer; `grid` keeps the query tiles it numbers. At d64 a CTA a query tile.
    #[test]
    fn persistent_lean_plans() {
        for (head_dim, rows) in [(64, 192), (128, 128)] {
            let plan = |b, h, s| fwd_plan(H100, &problem(Dims { head_dim, ..dims(b, h, s, s) }, dmattn_abi::Band::CAUSAL, false), DeviceElem::Bf16, FwdMask::None).unwrap();
            let big = plan(2, 32, 8192);
            assert!(big.tma && big.kernel == format!("dmattn_fwd_sm90_bf16_d{head_dim}"), "{big:?}");
            assert_eq!(big.grid, (8192u32.div_ceil(rows), 32, 2));
            if head_dim == 64 {
                assert_eq!((big.ctas, big.launch_grid()), (0, big.grid));
                continue;
            }
            assert_eq!((big.ctas, big.launch_grid()), (H100.sms, (H100.sms, 1, 1)));
            let small = plan(1, 2, 300);
            assert_eq!((small.ctas, small.launch_grid()), (2 * 300u32.div_ceil(rows), (2 * 300u32.div_ceil(rows), 1, 1)));
            // Other kernels launch a CTA a query tile.
            let masked = Problem { mask: Some([1, 1]), ..problem(Dims { head_dim, ..dims(2, 32, 8192, 8192) }, dmattn_abi::Band::CAUSAL, false) };
            let mods = fwd_plan(H100, &masked, DeviceElem::Bf16, FwdMask::Prepared).unwrap();
            assert_eq!((mods.tma, mods.launch_grid()), (false, mods.grid));
        }
    }

    /// Without bulk tensor copies (a broadcast operand) a lean fixed-length call
    /// on Hopper runs the modifier kernel, with no modifiers; packed batches keep their lean
    /// kernel (it copies with `cp.async`), and Ampere is unaffected.
    #[test]
    fn lean_plans_without_bulk_copies() {
        for head_dim in [64, 128] {
            let p = problem(Dims { head_dim, ..dims(2, 8, 4096, 4096) }, dmattn_abi::Band::CAUSAL, false);
            let (bulk, copying) = (fwd_plan(H100, &p, DeviceElem::Bf16, FwdMask::None).unwrap(), fwd_plan_copying(H100, &p, DeviceElem::Bf16, FwdMask::None, false, None).unwrap());
            assert!(bulk.tma && !copying.tma, "{copying:?}");
            // (At d64 over this many key tiles, the warp-specialised modifier kernel.)
            assert_eq!(copying.kernel, format!("dmattn_fwd_sm90_bf16_d{head_dim}_mods{}", if head_dim == 64 { "_ws" } else { "" }));
            assert_eq!((copying.splits, copying.ordered), (1, false));
            let ampere = fwd_plan_copying(A100_LIKE, &p, DeviceElem::Bf16, FwdMask::None, false, None).unwrap();
            assert_eq!(ampere, fwd_plan(A100_LIKE, &p, DeviceElem::Bf16, FwdMask::None).unwrap());
        }
        let seqs = Some(crate::SeqLens::from_lengths(&[100, 3000, 0], &[100, 3000, 7], &crate::Device::Cpu).unwrap());
        let packed = Problem { seqs, ..problem(Dims { head_dim: 128, ..dims(3, 8, 3000, 3000) }, dmattn_abi::Band::CAUSAL, false) };
        let copying = fwd_plan_copying(H100, &packed, DeviceElem::Bf16, FwdMask::None, false, None).unwrap();
        assert_eq!(copying.kernel, "dmattn_fwd_sm90_bf16_d128_packed");
    }

    /// Every kernel with launch bounds is in one of the modules.
    #[test]
    fn launch_bounds_name_shipped_kernels() {
        // The link step writes a bound only where it finds the entry: a misspelt name would
        // leave its kernel unbounded without a word.
        let shipped = [crate::ptx::shipped_kernels(false), crate::ptx::shipped_kernels(true)].concat();
        for (name, _, _) in dmattn_abi::LAUNCH_BOUNDS {
            assert!(shipped.iter().any(|k| k == name), "{name} is in neither module");
        }
    }

    /// Every forward kernel a plan can name is in the module it is loaded from: the Hopper one
    /// for its tiles, else the portable one.
    #[test]
    fn every_forward_plan_names_a_shipped_kernel() {
        let shipped = [crate::ptx::shipped_kernels(false), crate::ptx::shipped_kernels(true)];
        for head_dim in [32, 64, 96, 128, 192, 256] {
            for (elem, gpu) in [DeviceElem::Bf16, DeviceElem::F16].into_iter().flat_map(|e| [(e, A100_LIKE), (e, H100)]) {
                for (bias, mask) in [(false, FwdMask::None), (true, FwdMask::None), (false, FwdMask::Prepared), (true, FwdMask::Gathered), (false, FwdMask::Gathered)] {
                    for (sq, heads) in [(1, 4), (4096, 4), (16384, 2)] {
                        let d = Dims { head_dim, ..dims(1, heads, sq, 8192) };
                        let p = problem(d, dmattn_abi::Band::ALL, bias);
                        // With a mask's data where prepared (a mask alone: the mask-only kernels).
                        let p = Problem { mask: (mask == FwdMask::Prepared).then_some([1, 1]), ..p };
                        let plan = fwd_plan(gpu, &p, elem, mask).unwrap();
                        assert!(shipped[plan.tile.wgmma as usize].contains(&plan.kernel), "{} is not in the module the host loads it from", plan.kernel);
                        // A warp-specialised kernel's register split needs its launch bounds.
                        let bounded = dmattn_abi::LAUNCH_BOUNDS.iter().any(|&(n, t, _)| n == plan.kernel && t == plan.tile.threads());
                        assert!(!plan.tile.producer || bounded, "{} has no launch bounds for {} threads", plan.kernel, plan.tile.threads());
                    }
                }
                // Decoding (the portable module), contiguous and paged.
                let d = Dims { head_dim, ..dims(2, 8, 64, 8192) };
                let table = crate::PageTable::new(&[0; 2 * 128], 2, &crate::Device::Cpu).unwrap();
                for pages in [None, Some(crate::problem::KvPages { table, page_size: 64 })] {
                    let p = Problem { pages, dims: Dims { seqlen_q: 2, kv_heads: 2, ..d }, ..problem(d, dmattn_abi::Band::ALL, false) };
                    let plan = decode::decode_plan(132, &p, elem, None).unwrap();
                    assert!(shipped[0].contains(&plan.kernel), "{} is not in the portable module", plan.kernel);
                }
                // Packed batches (no gathered masks), contiguous and paged.
                let seqs = crate::SeqLens::from_lengths(&[1, 4096], &[8192, 100], &crate::Device::Cpu).unwrap();
                let table = crate::PageTable::new(&[0; 2 * 128], 2, &crate::Device::Cpu).unwrap();
                for (bias, pages) in [(false, None), (true, None), (false, Some(crate::problem::KvPages { table, page_size: 64 }))] {
                    let d = Dims { head_dim, ..dims(2, 4, 4096, 8192) };
                    let p = Problem { seqs: Some(seqs.clone()), pages: pages.clone(), ..problem(d, dmattn_abi::Band::ALL, bias) };
                    let plan = fwd_plan(gpu, &p, elem, FwdMask::None).unwrap();
                    assert!(shipped[plan.tile.wgmma as usize].contains(&plan.kernel), "{} is not in the module the host loads it from", plan.kernel);
                }
            }
        }
    }

    /// Every backward kernel the host can ask for is in the module it loads it from: each head
    /// dim, element type and mode, with and without the Hopper module, for every modifier set;
    /// and so is the work-order pass of each that may run in one.
    #[test]
    fn every_backward_call_names_a_shipped_kernel() {
        let shipped = [crate::ptx::shipped_kernels(false), crate::ptx::shipped_kernels(true)];
        for head_dim in [32, 64, 96, 128, 192, 256] {
            let modes = |e| [(e, false, false), (e, true, false), (e, false, true), (e, true, true)];
            for (elem, deterministic, hopper) in [DeviceElem::Bf16, DeviceElem::F16].into_iter().flat_map(modes) {
                for (m, banded) in [modifiers::NONE, modifiers::MASK, modifiers::BIAS, modifiers::ALL].into_iter().flat_map(|m| [(m, false), (m, true)]) {
                    let tile = bwd_tile(head_dim as u32, deterministic, hopper && bwd_wgmma_serves(m, banded), m).unwrap();
                    let name = bwd_kernel_name(&tile, elem, head_dim, m, deterministic, banded, false);
                    assert!(shipped[tile.wgmma as usize].contains(&name), "{name} is not in the module the host loads it from");
                    // And the kernel a split call asks for, where it may split.
                    let (hd, variant) = (head_dim as u32, bwd_band_variant(&tile, m, banded));
                    if !deterministic && (bwd_splits(hd) || bwd_split_kernel(hd, tile.wgmma, variant)) {
                        let name = bwd_kernel_name(&tile, elem, head_dim, m, deterministic, banded, true);
                        assert!(shipped[tile.wgmma as usize].contains(&name), "{name} is not in the module the host loads it from");
                    }
                    // A placed variant may run in a work order: its pass is in the portable module.
                    let order = format!("{}{}", dmattn_abi::names::BWD_ORDER_PREFIX, tile.block_n);
                    let placed = !deterministic && modifiers::bwd_placed(bwd_band_variant(&tile, m, banded));
                    assert!(!placed || shipped[0].contains(&order), "{order} is not in the portable module");
                }
            }
        }
    }
}
