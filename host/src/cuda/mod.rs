//! The CUDA backend: checks what the kernels need beyond the shared validation, prepares the
//! mask (block classes and packed bits, read by forward and backward alike) and launches.
mod launch;

use crate::attention::{Forward, Saved};
use crate::cpu::lse_shape;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::problem::{Dims, Problem};
use crate::tensor::Tensor;
use cudarc::driver::CudaSlice;
use dmattn_abi::{BLOCK_MAP_K, BLOCK_MAP_Q, DeviceElem, FwdParams, FwdTile, MaskPackParams, View4, flags, fwd_variants};
use launch::{Launch, launch};
use std::sync::Arc;

const BACKEND: &str = "CUDA";

fn device_elem(arg: &'static str, dtype: DType) -> Result<DeviceElem> {
    match dtype {
        DType::F16 => Ok(DeviceElem::F16),
        DType::BF16 => Ok(DeviceElem::Bf16),
        other => Err(Error::DType { arg, expected: "f16 or bf16 (the CUDA kernels' types)".into(), got: other }),
    }
}

/// `[b, s, h, d]` q/k/v/o: unit stride on d, 16-byte aligned rows, so tiles load with `cp.async`.
fn qkv_view(t: &Tensor, arg: &'static str) -> Result<View4> {
    let s = t.strides();
    let layout_err = |reason: String| Error::Layout { arg, backend: BACKEND, reason };
    if t.shape()[3] > 1 && s[3] != 1 {
        return Err(layout_err(format!("head_dim stride is {}, must be 1", s[3])));
    }
    // Size-1 dimensions are never stepped over, so their strides do not matter.
    for (dim, name) in [(0, "batch"), (1, "sequence"), (2, "head")] {
        if t.shape()[dim] > 1 && s[dim] % 8 != 0 {
            return Err(layout_err(format!("{name} stride {} is not a multiple of 8 elements (16 bytes)", s[dim])));
        }
    }
    let ptr = t.device_ptr().expect("CUDA tensor");
    if ptr % 16 != 0 {
        return Err(layout_err("the first element is not 16-byte aligned".into()));
    }
    let stride = |d: usize| if t.shape()[d] == 1 { 0 } else { s[d] as u64 };
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

/// A mask prepared once per forward and reused by its backward: 64x64 block classes (the
/// tile-skip decision) and the mask packed one bit per score.
#[derive(Clone)]
pub(crate) struct PreparedMask {
    _classes: Arc<CudaSlice<u8>>,
    _bits: Arc<CudaSlice<u8>>,
    classes: View4,
    bits: View4,
    head_div: u32,
}

fn prepare_mask(dev: &CudaDevice, p: &Problem, mask: &Tensor) -> Result<PreparedMask> {
    let [mb, mh, mq, mk] = p.mask.expect("mask shape");
    let d = &p.dims;
    let (q_blocks, k_blocks) = (mq.div_ceil(BLOCK_MAP_Q as usize), d.seqlen_k.div_ceil(BLOCK_MAP_K as usize));
    let stream = dev.stream();
    // Safety: the pack kernel writes every class and every word of these buffers.
    let classes = unsafe { stream.alloc::<u8>(mb * mh * q_blocks * k_blocks)? };
    let bits = unsafe { stream.alloc::<u8>(8 * mb * mh * mq * k_blocks)? };
    let mut view = broadcast_view(mask);
    // A key-broadcast mask is read as sk keys of stride 0, so it packs like any other.
    if mk == 1 {
        view.stride[3] = 0;
    }
    let ptr = |b: &CudaSlice<u8>| {
        use cudarc::driver::DevicePtr;
        b.device_ptr(stream).0
    };
    let params = MaskPackParams {
        mask: view,
        classes: ptr(&classes),
        bits: ptr(&bits),
        dims: [mb as u32, mh as u32, mq as u32, d.seqlen_k as u32],
        q_blocks: q_blocks as u32,
        k_blocks: k_blocks as u32,
    };
    launch(dev, &Launch::mask_pack((k_blocks as u32, q_blocks as u32, (mb * mh) as u32)), params)?;
    let zero_if = |broadcast: bool, v: usize| if broadcast { 0 } else { v as u64 };
    Ok(PreparedMask {
        classes: View4 {
            ptr: params.classes,
            stride: [zero_if(mb == 1, mh * q_blocks * k_blocks), zero_if(mh == 1, q_blocks * k_blocks), zero_if(mq == 1, k_blocks), 1],
        },
        bits: View4 {
            ptr: params.bits,
            stride: [zero_if(mb == 1, mh * mq * k_blocks), zero_if(mh == 1, mq * k_blocks), zero_if(mq == 1, k_blocks), 1],
        },
        head_div: head_div(d, mh),
        _classes: Arc::new(classes),
        _bits: Arc::new(bits),
    })
}

/// The bias can be copied in 16-byte rows (unit key stride, 8-element aligned rows and base).
fn bias_vectorizable(bias: &Tensor, view: &View4) -> bool {
    bias.shape()[3] > 1 && bias.strides()[3] == 1 && view.ptr % 16 == 0 && view.stride[..3].iter().all(|s| s % 8 == 0)
}

fn check_limits(d: &Dims, tile: &FwdTile) -> Result<()> {
    let limit = |arg: &'static str, n: usize, max: usize| {
        if n > max { Err(Error::Param { arg, reason: format!("{n} exceeds the CUDA backend's limit of {max}") }) } else { Ok(()) }
    };
    limit("q", d.seqlen_q, i32::MAX as usize - tile.block_m as usize)?;
    limit("k", d.seqlen_k, i32::MAX as usize / 2)?;
    limit("q", d.heads, 65535)?;
    limit("q", d.batch, 65535)
}

pub(crate) fn forward(dev: &CudaDevice, p: Problem, mut saved: Saved) -> Result<Forward> {
    let d = p.dims;
    let elem = device_elem("q", p.dtype)?;
    let variants = fwd_variants(d.head_dim as u32).ok_or_else(|| Error::Unsupported {
        what: format!("head_dim {} (supported: 32, 64, 96, 128, 192, 256)", d.head_dim),
        backend: BACKEND,
    })?;
    if let Some(bias) = &saved.bias {
        if bias.dtype() != p.dtype {
            return Err(Error::DType { arg: "bias", expected: format!("{:?} (the dtype of q)", p.dtype), got: bias.dtype() });
        }
    }
    let mods = saved.mask.is_some() || saved.bias.is_some() || p.softcap > 0.0;
    let (tile, suffix) = match (mods, variants.plain) {
        (false, Some(plain)) => (plain, ""),
        _ => (variants.mods, "_mods"),
    };
    check_limits(&d, &tile)?;

    let (q, k, v) = (qkv_view(&saved.q, "q")?, qkv_view(&saved.k, "k")?, qkv_view(&saved.v, "v")?);
    let out = Tensor::empty(saved.q.shape(), p.dtype, &saved.q.device())?;
    let lse = Tensor::empty(&lse_shape(&p), DType::F32, &saved.q.device())?;
    let prepared = saved.mask.as_ref().map(|m| prepare_mask(dev, &p, m)).transpose()?;

    let mut params = FwdParams {
        q,
        k,
        v,
        o: qkv_view(&out, "out")?,
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
        flags: if p.causal { flags::CAUSAL } else { 0 },
        ..FwdParams::default()
    };
    if let Some(m) = &prepared {
        params.mask_bits = m.bits;
        params.block_map = m.classes;
        params.mask_head_div = m.head_div;
    }
    if let Some(bias) = &saved.bias {
        params.bias = broadcast_view(bias);
        params.bias_head_div = head_div(&d, bias.shape()[1]);
        if bias_vectorizable(bias, &params.bias) {
            params.flags |= flags::BIAS_VEC;
        }
    }
    let name = format!("{}{}_d{}{}", dmattn_abi::names::FWD_PREFIX, elem.name(), d.head_dim, suffix);
    let grid = (d.seqlen_q.div_ceil(tile.block_m as usize) as u32, d.heads as u32, d.batch as u32);
    launch(dev, &Launch::kernel(&name, grid, tile.threads(), tile.smem_bytes()), params)?;
    saved.gpu = prepared;
    Ok(Forward { out, lse, problem: p, saved })
}
