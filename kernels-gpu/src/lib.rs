//! dmattn's device code, compiled to PTX by `host/build.rs` (rustc's NVPTX backend). Kernels are
//! composed from a few modules: PTX primitives (`arch`), element types and their MMA (`elem`),
//! shared-memory tiles (`tile`), the mask logic every kernel shares (`mask`), the online softmax
//! (`softmax`), score start values and logits (`scores`), and the kernels themselves (`fwd`,
//! `bwd`, `decode` (the forward for few queries), `bwd_pre`, `mask_pack` and `block_mask` (mask preparation; `mask_pack` also lays a mask out for a packed batch), `gather` (gather attention), `lists` (per-query index lists), `select` and `select_wide` (masks made from a bias), `schedule` for the forward's work order, `combine` for
//! split-KV, and `softmax_rows` for the unfused path). Entry points are instantiated here from
//! the tile table in `dmattn-abi`. The crate builds twice: for sm_80 (every kernel but the
//! Hopper ones; it runs on Hopper too) and for sm_90a (only the `wgmma` forward and backward).
#![no_std]
#![feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)]
// The sm_90a build instantiates only the Hopper kernels: the other kernels' code goes unused.
#![cfg_attr(target_feature = "sm_90a", allow(dead_code, unused_imports))]
// Each module expands only its own kernels' macros.
#![allow(unused_macros)]

mod arch;
mod block_info;
mod block_mask;
mod bwd;
mod bwd_pre;
mod combine;
mod decode;
mod lists;
mod elem;
mod fwd;
#[cfg(target_feature = "sm_90a")]
mod fwd_ws;
mod gather;
mod gemm;
mod mask;
mod mask_pack;
mod schedule;
mod scores;
mod select;
mod select_wide;
mod seq;
mod softmax;
mod softmax_rows;
mod tile;

use dmattn_abi::{
    BlockMaskParams, BwdParams, BwdSharesParams, DecodeParams, GatherMaskParams, GatherParams, IndicesParams, ListBitsParams, ListsParams, KeyCompactParams, ScatterParams, SelectParams, SelectWideParams, BwdPreParams, BwdTile, CombineParams, ConvertParams, DqConvertParams, FwdParams, FwdTile, OrderParams, FwdVariants, MaskPackParams, MaskSeqsParams,
    SoftmaxRowsParams, bwd_splits, bwd_tile, fwd_variants, fwd_variants_for, modifiers,
};
use elem::{Bf16, F16};

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    unsafe { core::arch::nvptx::trap() }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_bwd_shares(p: BwdSharesParams) {
    unsafe { bwd_pre::shares(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_mask_pack(p: MaskPackParams) {
    unsafe { mask_pack::mask_pack(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_mask_pack_bits(p: MaskPackParams) {
    unsafe { mask_pack::mask_pack_bits(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_mask_pack_keys(p: MaskPackParams) {
    unsafe { mask_pack::mask_pack_keys(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_mask_to_seqs(p: MaskSeqsParams) {
    unsafe { mask_pack::mask_to_seqs(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_block_mask(p: BlockMaskParams) {
    unsafe { block_mask::block_mask(&p) }
}

/// The work order of each head dim's modifier variant: `dmattn_fwd_order_d<dim>`
/// (`dmattn_abi::names::FWD_ORDER_PREFIX`).
#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_key_count(p: KeyCompactParams) {
    unsafe { gather::key_count(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_key_compact(p: KeyCompactParams) {
    unsafe { gather::key_compact(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_gather_rows(p: GatherParams) {
    unsafe { gather::gather_rows(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_indices_bits(p: IndicesParams) {
    unsafe { gather::indices_bits(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_indices_row_bits(p: IndicesParams) {
    unsafe { gather::indices_row_bits(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_lists_from_bits(p: ListBitsParams) {
    unsafe { lists::lists_from_bits(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_select_keys_16(p: SelectParams) {
    unsafe { select::select_keys::<16>(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_select_keys_32(p: SelectParams) {
    unsafe { select::select_keys::<32>(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_select_wide_16(p: SelectWideParams) {
    unsafe { select_wide::select_wide::<16>(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_select_wide_32(p: SelectWideParams) {
    unsafe { select_wide::select_wide::<32>(&p) }
}

#[cfg(not(target_feature = "sm_90a"))]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_gather_mask(p: GatherMaskParams) {
    unsafe { gather::gather_mask(&p) }
}

macro_rules! fwd_order_kernels {
    ($($d:literal: $name:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: OrderParams) {
            const T: FwdTile = variants($d).mods;
            unsafe { schedule::fwd_order::<{ T.block_m as usize }, { T.block_n as usize }>(&p) }
        }
    )*};
}

/// The backward's work order for each key tile size: `dmattn_bwd_order_n<block_n>`
/// (`dmattn_abi::names::BWD_ORDER_PREFIX`).
macro_rules! bwd_order_kernels {
    ($($n:literal: $name:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: OrderParams) {
            unsafe { schedule::bwd_order::<$n>(&p) }
        }
    )*};
}

#[cfg(not(target_feature = "sm_90a"))]
bwd_order_kernels! {
    64: dmattn_bwd_order_n64;
    128: dmattn_bwd_order_n128;
}

#[cfg(not(target_feature = "sm_90a"))]
fwd_order_kernels! {
    32: dmattn_fwd_order_d32;
    64: dmattn_fwd_order_d64;
    96: dmattn_fwd_order_d96;
    128: dmattn_fwd_order_d128;
    192: dmattn_fwd_order_d192;
    256: dmattn_fwd_order_d256;
}

/// The Hopper module's forward tiles (`dmattn_abi::FWD_TILES_SM90`).
const fn sm90_variants(head_dim: u32) -> FwdVariants {
    match fwd_variants_for(head_dim, true) {
        Some(v) if v.mods.wgmma => v,
        _ => panic!("no Hopper tile shape for this head dim"),
    }
}

const fn variants(head_dim: u32) -> FwdVariants {
    match fwd_variants(head_dim) {
        Some(v) => v,
        None => panic!("no tile shape for this head dim"),
    }
}

/// Forward entry points per (element type, head dim): `dmattn_fwd_<elem>_d<dim>_mods` (all
/// score modifiers, fixed lengths), its gather variant `.._mods_gather` (`names::GATHER_SUFFIX`),
/// its packed-batch variant `.._mods_packed` (`names::PACKED_SUFFIX`), that one's paged-K/V
/// variant `.._mods_paged` (`names::PAGED_SUFFIX`) and, where the tile table ships
/// one, the lean `dmattn_fwd_<elem>_d<dim>` (no mask, bias or softcap): the
/// names `dmattn_abi::names` gives the host.
macro_rules! fwd_kernels {
    ($($elem:ty, $d:literal: $mods:ident, $gather:ident, $packed:ident, $paged:ident $(, $plain:ident)?;)*) => {$(
        fwd_kernels!(@one $mods, $elem, $d, variants($d).mods, true, false, false, false);
        fwd_kernels!(@one $gather, $elem, $d, variants($d).mods, true, true, false, false);
        fwd_kernels!(@one $packed, $elem, $d, variants($d).mods, true, false, true, false);
        fwd_kernels!(@one $paged, $elem, $d, variants($d).mods, true, false, true, true);
        $(fwd_kernels!(@one $plain, $elem, $d, match variants($d).plain { Some(t) => t, None => panic!() }, false, false, false, false);)?
    )*};
    (@one $name:ident, $elem:ty, $d:literal, $tile:expr, $with_mods:literal, $gather:literal, $packed:literal, $paged:literal) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: FwdParams) {
            const T: FwdTile = $tile;
            unsafe {
                fwd::forward::<$elem, $d, { T.block_m as usize }, { T.block_n as usize },
                    { T.threads() as usize }, { T.m_tiles_per_warp() as usize },
                    { T.block_n as usize / 8 }, { $d / 16 }, { $d / 8 }, $with_mods, $gather, $packed, $paged, { T.wgmma }>(&p)
            }
        }
    };
}

// A plain name is listed exactly where `FWD_TILES` has a lean tile (instantiating one it lacks
// panics at compile time).
#[cfg(not(target_feature = "sm_90a"))]
fwd_kernels! {
    Bf16, 32: dmattn_fwd_bf16_d32_mods, dmattn_fwd_bf16_d32_mods_gather, dmattn_fwd_bf16_d32_mods_packed, dmattn_fwd_bf16_d32_mods_paged, dmattn_fwd_bf16_d32;
    Bf16, 64: dmattn_fwd_bf16_d64_mods, dmattn_fwd_bf16_d64_mods_gather, dmattn_fwd_bf16_d64_mods_packed, dmattn_fwd_bf16_d64_mods_paged, dmattn_fwd_bf16_d64;
    Bf16, 96: dmattn_fwd_bf16_d96_mods, dmattn_fwd_bf16_d96_mods_gather, dmattn_fwd_bf16_d96_mods_packed, dmattn_fwd_bf16_d96_mods_paged, dmattn_fwd_bf16_d96;
    Bf16, 128: dmattn_fwd_bf16_d128_mods, dmattn_fwd_bf16_d128_mods_gather, dmattn_fwd_bf16_d128_mods_packed, dmattn_fwd_bf16_d128_mods_paged, dmattn_fwd_bf16_d128;
    Bf16, 192: dmattn_fwd_bf16_d192_mods, dmattn_fwd_bf16_d192_mods_gather, dmattn_fwd_bf16_d192_mods_packed, dmattn_fwd_bf16_d192_mods_paged, dmattn_fwd_bf16_d192;
    Bf16, 256: dmattn_fwd_bf16_d256_mods, dmattn_fwd_bf16_d256_mods_gather, dmattn_fwd_bf16_d256_mods_packed, dmattn_fwd_bf16_d256_mods_paged, dmattn_fwd_bf16_d256;
    F16, 32: dmattn_fwd_f16_d32_mods, dmattn_fwd_f16_d32_mods_gather, dmattn_fwd_f16_d32_mods_packed, dmattn_fwd_f16_d32_mods_paged, dmattn_fwd_f16_d32;
    F16, 64: dmattn_fwd_f16_d64_mods, dmattn_fwd_f16_d64_mods_gather, dmattn_fwd_f16_d64_mods_packed, dmattn_fwd_f16_d64_mods_paged, dmattn_fwd_f16_d64;
    F16, 96: dmattn_fwd_f16_d96_mods, dmattn_fwd_f16_d96_mods_gather, dmattn_fwd_f16_d96_mods_packed, dmattn_fwd_f16_d96_mods_paged, dmattn_fwd_f16_d96;
    F16, 128: dmattn_fwd_f16_d128_mods, dmattn_fwd_f16_d128_mods_gather, dmattn_fwd_f16_d128_mods_packed, dmattn_fwd_f16_d128_mods_paged, dmattn_fwd_f16_d128;
    F16, 192: dmattn_fwd_f16_d192_mods, dmattn_fwd_f16_d192_mods_gather, dmattn_fwd_f16_d192_mods_packed, dmattn_fwd_f16_d192_mods_paged, dmattn_fwd_f16_d192;
    F16, 256: dmattn_fwd_f16_d256_mods, dmattn_fwd_f16_d256_mods_gather, dmattn_fwd_f16_d256_mods_packed, dmattn_fwd_f16_d256_mods_paged, dmattn_fwd_f16_d256;
}

/// The narrow gather variants (`FwdVariants::gather_narrow`) of a tile table: `names::FWD_*_GATHER_NARROW`.
macro_rules! fwd_gather_narrow {
    ($variants:ident: $($elem:ty, $d:literal: $name:ident;)*) => {$(
        fwd_kernels!(@one $name, $elem, $d, match $variants($d).gather_narrow { Some(t) => t, None => panic!() }, true, true, false, false);
    )*};
}

#[cfg(not(target_feature = "sm_90a"))]
fwd_gather_narrow! { variants:
    Bf16, 64: dmattn_fwd_bf16_d64_mods_gather_narrow;
    F16, 64: dmattn_fwd_f16_d64_mods_gather_narrow;
}

/// The tensor maps of a bulk-copy forward, written in stream order before it (one thread).
#[cfg(target_feature = "sm_90a")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dmattn_store_tensor_maps(p: dmattn_abi::TensorMapsParams) {
    unsafe { fwd_ws::store_tensor_maps(&p) }
}

/// The Hopper module's warp-specialised forward (`fwd_ws`): the lean one
/// (`dmattn_fwd_sm90_<elem>_d<dim>[_packed|_paged]`, the lean tile of `FWD_TILES_SM90`; the
/// fixed-length one takes `FwdTmaParams`, its producer on the bulk tensor copy engine, and is
/// persistent where `fwd_ws_persistent` says so), the
/// fixed-length modifier one (`.._mods`, its `mods_ws` tile) and the mask-only one (`.._mask`,
/// its `mask_ws` tile).
macro_rules! fwd_ws_kernel {
    (tma $name:ident, $elem:ty, $d:literal) => {
        fwd_ws_kernel!(@kernel $name, $elem, $d, false, false, false, { dmattn_abi::fwd_ws_persistent($d) }, sm90_variants($d).plain, p: dmattn_abi::FwdTmaParams, (&p.fwd, p.maps));
    };
    (mods $name:ident, $elem:ty, $d:literal) => {
        fwd_ws_kernel!(@tile $name, $elem, $d, false, false, true, sm90_variants($d).mods_ws);
    };
    (mask $name:ident, $elem:ty, $d:literal) => {
        fwd_ws_kernel!(@tile $name, $elem, $d, false, false, true, sm90_variants($d).mask_ws);
    };
    (@tile $name:ident, $elem:ty, $d:literal, $packed:literal, $paged:literal, $mods:literal, $tile:expr) => {
        fwd_ws_kernel!(@kernel $name, $elem, $d, $packed, $paged, $mods, false, $tile, p: FwdParams, (&p, 0));
    };
    // `$p: $params` the kernel's parameter, `$args` what `fwd_ws::forward` takes of it.
    (@kernel $name:ident, $elem:ty, $d:literal, $packed:literal, $paged:literal, $mods:literal, $persistent:expr, $tile:expr, $p:ident: $params:ty, ($($args:expr),*)) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name($p: $params) {
            const T: FwdTile = match $tile { Some(t) if t.producer && t.modifiers == $mods => t, _ => panic!() };
            unsafe {
                fwd_ws::forward::<$elem, $d, { T.block_m as usize }, { T.block_n as usize }, { T.block_n as usize / 8 }, { $d / 16 },
                    { $d / 8 }, { T.block_n as usize / 16 }, $packed, $paged, $mods, { !T.mask_only }, $persistent, { T.ws_registers($mods || $paged).0 },
                    { T.ws_registers($mods || $paged).1 }>($($args),*)
            }
        }
    };
}

/// The Hopper forward (`dmattn_fwd_sm90_<elem>_d<dim>[_packed|_mask|_mods[_gather[_narrow]|_packed|_paged]]`,
/// `names::FWD_WGMMA_PREFIX`): the lean and fixed-length modifier ones warp-specialised, the portable forward's other variants on `wgmma` products, and where
/// `fwd_sm90_lean_packed` says so a lean packed-batch variant (no mask, bias or softcap).
macro_rules! fwd_wgmma_kernels {
    ($($elem:ty, $d:literal: $plain:ident, $mods:ident ($mods_kind:ident $(, $mask:ident)?), $gather:ident, $packed:ident, $paged:ident $(, $narrow:ident)?;)*) => {$(
        fwd_ws_kernel!(tma $plain, $elem, $d);
        fwd_mods_kernel!($mods_kind $mods, $elem, $d);
        $(fwd_ws_kernel!(mask $mask, $elem, $d);)?
        fwd_kernels!(@one $gather, $elem, $d, sm90_variants($d).mods, true, true, false, false);
        fwd_kernels!(@one $packed, $elem, $d, sm90_variants($d).mods, true, false, true, false);
        fwd_kernels!(@one $paged, $elem, $d, sm90_variants($d).mods, true, false, true, true);
        $(fwd_gather_narrow! { sm90_variants: $elem, $d: $narrow; })?
    )*};
}

/// The Hopper fixed-length modifier kernel: warp-specialised (`ws`, where `FWD_TILES_SM90` has a
/// `mods_ws` tile) or the `wgmma` forward at two CTAs an SM (`wgmma`; at d64 beside the
/// warp-specialised one, `.._mods_ws`, see `fwd_sm90_two_cta_mods`).
macro_rules! fwd_mods_kernel {
    (ws $name:ident, $elem:ty, $d:literal) => {
        fwd_ws_kernel!(mods $name, $elem, $d);
    };
    (wgmma $name:ident, $elem:ty, $d:literal) => {
        const _: () = assert!(sm90_variants($d).mods_ws.is_none() || dmattn_abi::fwd_sm90_two_cta_mods($d));
        fwd_kernels!(@one $name, $elem, $d, sm90_variants($d).mods, true, false, false, false);
    };
}

#[cfg(target_feature = "sm_90a")]
fwd_wgmma_kernels! {
    Bf16, 64: dmattn_fwd_sm90_bf16_d64, dmattn_fwd_sm90_bf16_d64_mods (wgmma, dmattn_fwd_sm90_bf16_d64_mask), dmattn_fwd_sm90_bf16_d64_mods_gather, dmattn_fwd_sm90_bf16_d64_mods_packed, dmattn_fwd_sm90_bf16_d64_mods_paged, dmattn_fwd_sm90_bf16_d64_mods_gather_narrow;
    F16, 64: dmattn_fwd_sm90_f16_d64, dmattn_fwd_sm90_f16_d64_mods (wgmma, dmattn_fwd_sm90_f16_d64_mask), dmattn_fwd_sm90_f16_d64_mods_gather, dmattn_fwd_sm90_f16_d64_mods_packed, dmattn_fwd_sm90_f16_d64_mods_paged, dmattn_fwd_sm90_f16_d64_mods_gather_narrow;
    Bf16, 128: dmattn_fwd_sm90_bf16_d128, dmattn_fwd_sm90_bf16_d128_mods (ws, dmattn_fwd_sm90_bf16_d128_mask), dmattn_fwd_sm90_bf16_d128_mods_gather, dmattn_fwd_sm90_bf16_d128_mods_packed, dmattn_fwd_sm90_bf16_d128_mods_paged;
    F16, 128: dmattn_fwd_sm90_f16_d128, dmattn_fwd_sm90_f16_d128_mods (ws, dmattn_fwd_sm90_f16_d128_mask), dmattn_fwd_sm90_f16_d128_mods_gather, dmattn_fwd_sm90_f16_d128_mods_packed, dmattn_fwd_sm90_f16_d128_mods_paged;
}

// d64's warp-specialised modifier kernel, beside its two-CTA one (`fwd_sm90_two_cta_mods`).
#[cfg(target_feature = "sm_90a")]
fwd_ws_kernel!(mods dmattn_fwd_sm90_bf16_d64_mods_ws, Bf16, 64);
#[cfg(target_feature = "sm_90a")]
fwd_ws_kernel!(mods dmattn_fwd_sm90_f16_d64_mods_ws, F16, 64);

/// The Hopper module's lean packed-batch forward (`dmattn_fwd_sm90_<elem>_d<dim>_packed`) and
/// its paged-K/V kernel (`.._paged`), both on `fwd_ws_packed_tile`: the same products, so paged
/// and contiguous K/V give the same bits.
macro_rules! fwd_lean_packed {
    ($($elem:ty, $d:literal: $packed:ident, $paged:ident;)*) => {$(
        const _: () = assert!(dmattn_abi::fwd_sm90_lean_packed($d));
        fwd_ws_kernel!(@tile $packed, $elem, $d, true, false, false, dmattn_abi::fwd_ws_packed_tile(&sm90_variants($d)));
        fwd_ws_kernel!(@tile $paged, $elem, $d, true, true, false, dmattn_abi::fwd_ws_packed_tile(&sm90_variants($d)));
    )*};
}

#[cfg(target_feature = "sm_90a")]
fwd_lean_packed! {
    Bf16, 64: dmattn_fwd_sm90_bf16_d64_packed, dmattn_fwd_sm90_bf16_d64_paged;
    F16, 64: dmattn_fwd_sm90_f16_d64_packed, dmattn_fwd_sm90_f16_d64_paged;
    Bf16, 128: dmattn_fwd_sm90_bf16_d128_packed, dmattn_fwd_sm90_bf16_d128_paged;
    F16, 128: dmattn_fwd_sm90_f16_d128_packed, dmattn_fwd_sm90_f16_d128_paged;
}

/// Backward entry points per (element type, head dim): `dmattn_bwd_<elem>_d<dim>[_mods][_det]`
/// (score modifiers; deterministic accumulation). The `_mods` variants take any band; the plain
/// ones only bands without a left edge or compression (`Visibility::of_band`).
macro_rules! bwd_kernels {
    ($($elem:ty, $d:literal: $plain:ident, $mods:ident, $plain_det:ident, $mods_det:ident;)*) => {$(
        bwd_kernels!(@one $plain, $elem, $d, modifiers::NONE, false, false, false, bwd_splits($d));
        bwd_kernels!(@one $mods, $elem, $d, modifiers::ALL, false, false, true, bwd_splits($d));
        bwd_kernels!(@one $plain_det, $elem, $d, modifiers::NONE, true, false, false, false);
        bwd_kernels!(@one $mods_det, $elem, $d, modifiers::ALL, true, false, true, false);
    )*};
    (@one $name:ident, $elem:ty, $d:literal, $modifiers:expr, $det:literal, $wgmma:literal, $band:literal, $split:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: BwdParams) {
            const T: BwdTile = match bwd_tile($d, $det, $wgmma, $modifiers) { Some(t) => t, None => panic!() };
            const { assert!(T.wgmma == $wgmma) };
            unsafe {
                bwd::backward::<$elem, $d, { T.block_m as usize }, { T.block_n as usize }, { T.stages as usize },
                    { T.warps as usize }, { $d / 16 },
                    { T.sdp_rows as usize }, { T.sdp_m_tiles() as usize }, { T.sdp_n_tiles() as usize }, { T.sdp_chunk_tiles() as usize },
                    { T.kv_keys as usize }, { T.kv_m_tiles() as usize }, { T.kv_d_tiles() as usize }, { T.block_m as usize / 16 },
                    { T.dq_rows as usize }, { T.dq_m_tiles() as usize }, { T.dq_d_tiles() as usize }, { T.dq_pass_tiles() as usize },
                    { T.block_n as usize / 16 }, { $modifiers }, $det, $wgmma, { T.bias }, $band, { $split && !$det }>(&p, T.params_offset())
            }
        }
    };
}

#[cfg(not(target_feature = "sm_90a"))]
bwd_kernels! {
    Bf16, 32: dmattn_bwd_bf16_d32, dmattn_bwd_bf16_d32_mods, dmattn_bwd_bf16_d32_det, dmattn_bwd_bf16_d32_mods_det;
    Bf16, 64: dmattn_bwd_bf16_d64, dmattn_bwd_bf16_d64_mods, dmattn_bwd_bf16_d64_det, dmattn_bwd_bf16_d64_mods_det;
    Bf16, 96: dmattn_bwd_bf16_d96, dmattn_bwd_bf16_d96_mods, dmattn_bwd_bf16_d96_det, dmattn_bwd_bf16_d96_mods_det;
    Bf16, 128: dmattn_bwd_bf16_d128, dmattn_bwd_bf16_d128_mods, dmattn_bwd_bf16_d128_det, dmattn_bwd_bf16_d128_mods_det;
    Bf16, 192: dmattn_bwd_bf16_d192, dmattn_bwd_bf16_d192_mods, dmattn_bwd_bf16_d192_det, dmattn_bwd_bf16_d192_mods_det;
    Bf16, 256: dmattn_bwd_bf16_d256, dmattn_bwd_bf16_d256_mods, dmattn_bwd_bf16_d256_det, dmattn_bwd_bf16_d256_mods_det;
    F16, 32: dmattn_bwd_f16_d32, dmattn_bwd_f16_d32_mods, dmattn_bwd_f16_d32_det, dmattn_bwd_f16_d32_mods_det;
    F16, 64: dmattn_bwd_f16_d64, dmattn_bwd_f16_d64_mods, dmattn_bwd_f16_d64_det, dmattn_bwd_f16_d64_mods_det;
    F16, 96: dmattn_bwd_f16_d96, dmattn_bwd_f16_d96_mods, dmattn_bwd_f16_d96_det, dmattn_bwd_f16_d96_mods_det;
    F16, 128: dmattn_bwd_f16_d128, dmattn_bwd_f16_d128_mods, dmattn_bwd_f16_d128_det, dmattn_bwd_f16_d128_mods_det;
    F16, 192: dmattn_bwd_f16_d192, dmattn_bwd_f16_d192_mods, dmattn_bwd_f16_d192_det, dmattn_bwd_f16_d192_mods_det;
    F16, 256: dmattn_bwd_f16_d256, dmattn_bwd_f16_d256_mods, dmattn_bwd_f16_d256_det, dmattn_bwd_f16_d256_mods_det;
}

/// The Hopper backward (the sm_90a module holds these and nothing else):
/// `dmattn_bwd_sm90_<elem>_d<dim>[_mask|_bias|_mods]` (`dmattn_abi::names::BWD_WGMMA_PREFIX`),
/// with the lean modifier variants (`modifiers::MASK`, `BIAS`): without the softcap's code (and
/// the bias's), a mask whose tiles are full costs nothing over no mask, and a bias's scores
/// skip the softcap's derivative.
macro_rules! bwd_wgmma_kernels {
    ($($elem:ty, $d:literal: $plain:ident, $mask:ident, $bias:ident, $mods:ident, $plain_band:ident, $mask_band:ident;)*) => {$(
        bwd_wgmma_kernels!(@without_bias $elem, $d, bwd_splits($d); $plain, $mask, $plain_band, $mask_band);
        bwd_kernels!(@one $bias, $elem, $d, modifiers::BIAS, false, true, false, bwd_splits($d));
        bwd_kernels!(@one $mods, $elem, $d, modifiers::ALL, false, true, false, bwd_splits($d));
    )*};
    // The variants without a bias (with no mask or a mask, any band or none), `$split` whether
    // they may split query tiles.
    (@without_bias $elem:ty, $d:literal, $split:expr; $plain:ident, $mask:ident, $plain_band:ident, $mask_band:ident) => {
        bwd_kernels!(@one $plain, $elem, $d, modifiers::NONE, false, true, false, $split);
        bwd_kernels!(@one $mask, $elem, $d, modifiers::MASK, false, true, false, $split);
        bwd_kernels!(@one $plain_band, $elem, $d, modifiers::NONE, false, true, true, $split);
        bwd_kernels!(@one $mask_band, $elem, $d, modifiers::MASK, false, true, true, $split);
    };
}

#[cfg(target_feature = "sm_90a")]
bwd_wgmma_kernels! {
    Bf16, 64: dmattn_bwd_sm90_bf16_d64, dmattn_bwd_sm90_bf16_d64_mask, dmattn_bwd_sm90_bf16_d64_bias, dmattn_bwd_sm90_bf16_d64_mods, dmattn_bwd_sm90_bf16_d64_band, dmattn_bwd_sm90_bf16_d64_mask_band;
    Bf16, 128: dmattn_bwd_sm90_bf16_d128, dmattn_bwd_sm90_bf16_d128_mask, dmattn_bwd_sm90_bf16_d128_bias, dmattn_bwd_sm90_bf16_d128_mods, dmattn_bwd_sm90_bf16_d128_band, dmattn_bwd_sm90_bf16_d128_mask_band;
    F16, 64: dmattn_bwd_sm90_f16_d64, dmattn_bwd_sm90_f16_d64_mask, dmattn_bwd_sm90_f16_d64_bias, dmattn_bwd_sm90_f16_d64_mods, dmattn_bwd_sm90_f16_d64_band, dmattn_bwd_sm90_f16_d64_mask_band;
    F16, 128: dmattn_bwd_sm90_f16_d128, dmattn_bwd_sm90_f16_d128_mask, dmattn_bwd_sm90_f16_d128_bias, dmattn_bwd_sm90_f16_d128_mods, dmattn_bwd_sm90_f16_d128_band, dmattn_bwd_sm90_f16_d128_mask_band;
}

/// Hopper d128 backward kernels that may split a key tile's query tiles among CTAs
/// (`dmattn_abi::bwd_split_kernel`, `..._split`): the unsplit kernels do not compile the split's
/// f32 epilogue in, which slowed their calls (see `dmattn_abi::bwd_splits`). The variants without
/// a bias: the bias ones sit at the register limit.
macro_rules! bwd_split_kernels {
    ($($elem:ty, $d:literal: $plain:ident, $mask:ident, $plain_band:ident, $mask_band:ident;)*) => {$(
        const _: () = assert!(!bwd_splits($d));
        bwd_wgmma_kernels!(@without_bias $elem, $d, true; $plain, $mask, $plain_band, $mask_band);
    )*};
}

#[cfg(target_feature = "sm_90a")]
bwd_split_kernels! {
    Bf16, 128: dmattn_bwd_sm90_bf16_d128_split, dmattn_bwd_sm90_bf16_d128_mask_split, dmattn_bwd_sm90_bf16_d128_band_split, dmattn_bwd_sm90_bf16_d128_mask_band_split;
    F16, 128: dmattn_bwd_sm90_f16_d128_split, dmattn_bwd_sm90_f16_d128_mask_split, dmattn_bwd_sm90_f16_d128_band_split, dmattn_bwd_sm90_f16_d128_mask_band_split;
}

/// The decoding forward per (element type, head dim) (`dmattn_abi::names::DECODE_PREFIX`):
/// `dmattn_decode_<elem>_d<dim>` and its paged-K/V kernel `.._paged`.
macro_rules! decode_kernels {
    ($($elem:ty, $d:literal: $name:ident, $paged:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: DecodeParams) {
            unsafe { decode::decode::<$elem, $d, { $d / 16 }, { $d / 8 }, false>(&p) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $paged(p: DecodeParams) {
            unsafe { decode::decode::<$elem, $d, { $d / 16 }, { $d / 8 }, true>(&p) }
        }
    )*};
}

#[cfg(not(target_feature = "sm_90a"))]
decode_kernels! {
    Bf16, 32: dmattn_decode_bf16_d32, dmattn_decode_bf16_d32_paged;
    Bf16, 64: dmattn_decode_bf16_d64, dmattn_decode_bf16_d64_paged;
    Bf16, 96: dmattn_decode_bf16_d96, dmattn_decode_bf16_d96_paged;
    Bf16, 128: dmattn_decode_bf16_d128, dmattn_decode_bf16_d128_paged;
    Bf16, 192: dmattn_decode_bf16_d192, dmattn_decode_bf16_d192_paged;
    Bf16, 256: dmattn_decode_bf16_d256, dmattn_decode_bf16_d256_paged;
    F16, 32: dmattn_decode_f16_d32, dmattn_decode_f16_d32_paged;
    F16, 64: dmattn_decode_f16_d64, dmattn_decode_f16_d64_paged;
    F16, 96: dmattn_decode_f16_d96, dmattn_decode_f16_d96_paged;
    F16, 128: dmattn_decode_f16_d128, dmattn_decode_f16_d128_paged;
    F16, 192: dmattn_decode_f16_d192, dmattn_decode_f16_d192_paged;
    F16, 256: dmattn_decode_f16_d256, dmattn_decode_f16_d256_paged;
}

/// The forward over per-query index lists per (element type, head dim)
/// (`dmattn_abi::names::LISTS_FWD_PREFIX`): `dmattn_lists_fwd_<elem>_d<dim>` without bias or
/// softcap, `.._mods` with them.
macro_rules! lists_kernels {
    ($($elem:ty, $d:literal: $lean:ident, $mods:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $lean(p: ListsParams) {
            unsafe { lists::lists_fwd::<$elem, $d, { $d / 16 }, { $d / 8 }, { modifiers::NONE }>(&p) }
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $mods(p: ListsParams) {
            unsafe { lists::lists_fwd::<$elem, $d, { $d / 16 }, { $d / 8 }, { modifiers::ALL }>(&p) }
        }
    )*};
}

#[cfg(not(target_feature = "sm_90a"))]
lists_kernels! {
    Bf16, 32: dmattn_lists_fwd_bf16_d32, dmattn_lists_fwd_bf16_d32_mods;
    Bf16, 64: dmattn_lists_fwd_bf16_d64, dmattn_lists_fwd_bf16_d64_mods;
    Bf16, 96: dmattn_lists_fwd_bf16_d96, dmattn_lists_fwd_bf16_d96_mods;
    Bf16, 128: dmattn_lists_fwd_bf16_d128, dmattn_lists_fwd_bf16_d128_mods;
    F16, 32: dmattn_lists_fwd_f16_d32, dmattn_lists_fwd_f16_d32_mods;
    F16, 64: dmattn_lists_fwd_f16_d64, dmattn_lists_fwd_f16_d64_mods;
    F16, 96: dmattn_lists_fwd_f16_d96, dmattn_lists_fwd_f16_d96_mods;
    F16, 128: dmattn_lists_fwd_f16_d128, dmattn_lists_fwd_f16_d128_mods;
}

/// Per element type: the backward's delta and conversion passes, the split-KV combines, and the
/// materialising path's row softmax (`dmattn_softmax_rows_<elem>`).
macro_rules! elem_kernels {
    ($($elem:ty: $delta:ident, $convert:ident, $convert_dq:ident, $combine:ident, $combine_rows:ident, $softmax_rows:ident, $scatter:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $scatter(p: ScatterParams) {
            unsafe { gather::scatter_rows::<$elem>(&p) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $delta(p: BwdPreParams) {
            unsafe { bwd_pre::delta::<$elem>(&p) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $convert(p: ConvertParams) {
            unsafe { bwd_pre::convert::<$elem>(&p) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $convert_dq(p: DqConvertParams) {
            unsafe { bwd_pre::convert_dq::<$elem>(&p) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $combine(p: CombineParams) {
            unsafe { combine::combine::<$elem>(&p) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $combine_rows(p: CombineParams) {
            unsafe { combine::combine_rows::<$elem>(&p) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $softmax_rows(p: SoftmaxRowsParams) {
            unsafe { softmax_rows::softmax_rows::<$elem>(&p) }
        }
    )*};
}

#[cfg(not(target_feature = "sm_90a"))]
elem_kernels! {
    Bf16: dmattn_bwd_pre_bf16, dmattn_convert_bf16, dmattn_convert_dq_bf16, dmattn_fwd_combine_bf16, dmattn_combine_rows_bf16, dmattn_softmax_rows_bf16, dmattn_scatter_rows_bf16;
    F16: dmattn_bwd_pre_f16, dmattn_convert_f16, dmattn_convert_dq_f16, dmattn_fwd_combine_f16, dmattn_combine_rows_f16, dmattn_softmax_rows_f16, dmattn_scatter_rows_f16;
}
