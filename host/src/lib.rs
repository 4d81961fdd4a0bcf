//! # dmattn
//!
//! Trainable dynamic-mask sparse attention: FlashAttention-style attention with arbitrary
//! boolean masks and additive bias (each broadcastable over batch, heads, queries and keys),
//! causal masking, softcap and GQA/MQA, and one sparse-mask type ([`SparseMask`]: windows,
//! compressed causal, sink keys, block bitsets, BCSR, bit-packed masks, ANDed, prepared once and
//! reused). Key tiles a mask hides entirely are skipped. The CUDA
//! kernels are written in Rust (`kernels-gpu`, compiled to PTX by rustc's NVPTX backend); a CPU
//! backend with f64 accumulation answers the same calls and is the reference the kernels are
//! tested against.
//!
//! ```
//! # fn main() -> dmattn::Result<()> {
//! use dmattn::{attention, DType, Device, Tensor};
//! let (dev, _why_not_gpu) = Device::cuda_or_cpu();
//! let dt = if dev.is_cuda() { DType::BF16 } else { DType::F32 };
//! let q = Tensor::from_fn(&[1, 128, 4, 64], dt, &dev, |i| ((i * 7919) % 13) as f64 / 13.0 - 0.5)?;
//! let kv = Tensor::from_fn(&[1, 256, 2, 64], dt, &dev, |i| ((i * 104729) % 17) as f64 / 17.0 - 0.5)?;
//! let keep = Tensor::from_fn(&[1, 1, 128, 256], DType::Bool, &dev, |i| (i % 5 != 0) as u8 as f64)?;
//! let fwd = attention(&q, &kv, &kv).mask(&keep).causal(true).forward()?;
//! assert_eq!(fwd.out.shape(), &[1, 128, 4, 64]);
//! # Ok(()) }
//! ```
//!
//! ## Over a framework's memory and stream
//!
//! [`CudaDevice::from_stream`] puts dmattn on a caller's stream (and its context, e.g. the
//! primary context PyTorch and candle use); [`Tensor::from_cuda_slice`],
//! [`Tensor::from_cuda_view`] and [`Tensor::from_raw_parts`] wrap the caller's buffers without a
//! copy; [`Attention::out`], [`Attention::lse`] and [`Forward::backward_into`] write into the
//! caller's buffers. Calls queue their work on that stream and return without waiting, so a
//! forward with its backward can be captured into a CUDA graph (drop the [`Forward`] before the
//! capture ends, so that the graph also frees its temporary buffers, and give every output and
//! gradient a caller's buffer). `cudarc` is re-exported for the types these take.
//!
//! ```
//! # fn main() -> dmattn::Result<()> {
//! use dmattn::cudarc::driver::CudaContext;
//! use dmattn::{CudaDevice, Tensor, attention};
//! use half::bf16;
//! # if dmattn::Device::cuda(0).is_err() { return Ok(()); } // no GPU here
//! // The caller's context (the device's primary one), stream and buffers.
//! let stream = CudaContext::new(0)?.new_stream()?;
//! let (b, s, h, d) = (1, 256, 4, 64);
//! let x = |f: f32| (0..b * s * h * d).map(|i| bf16::from_f32((i as f32 * f).sin())).collect::<Vec<_>>();
//! let (q, k, v) = (stream.clone_htod(&x(0.3))?, stream.clone_htod(&x(0.7))?, stream.clone_htod(&x(1.1))?);
//! let out = stream.alloc_zeros::<bf16>(b * s * h * d)?;
//!
//! let dev = CudaDevice::from_stream(stream.clone())?;
//! let wrap = |buf| Tensor::from_cuda_slice(buf, &[b, s, h, d], &dev);
//! let (q, k, v, out) = (wrap(q)?, wrap(k)?, wrap(v)?, wrap(out)?);
//! let fwd = attention(&q, &k, &v).causal(true).out(&out).forward()?; // queued on `stream`
//! stream.synchronize()?;
//! assert!(out.to_f64_vec()?.iter().all(|x| x.is_finite()));
//! # let _ = fwd;
//! # Ok(()) }
//! ```
mod attention;
#[cfg(feature = "candle")]
pub mod candle;
mod buffers;
mod cpu;
mod cuda;
mod device;
mod dtype;
mod error;
mod memory;
mod ptx;
mod pages;
mod problem;
mod reference;
mod select;
mod seqlens;
mod sparse;
mod tensor;

pub use cudarc;
pub use half;
pub use attention::{Attention, Forward, GradientBuffers, Gradients, attention};
pub use device::{CudaDevice, Device, KernelResources};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use problem::Dims;
pub use select::{SelectKeys, select_keys};
pub use pages::PageTable;
pub use seqlens::SeqLens;
pub use sparse::{PreparedMask, SparseMask, force_per_query_lists};
pub use tensor::{Layout, Tensor, set_output_poisoning};
#[doc(hidden)]
pub use cuda::{force_backward_placement, force_backward_query_split, force_forward_warp_specialised, force_forward_persistent_ctas, force_decode_ctas_per_sm, force_decode_order, force_gather_query_chunks, force_select_launches, force_wide_selection};
