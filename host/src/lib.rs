//! # dmattn
//!
//! Trainable dynamic-mask sparse attention: FlashAttention-style attention with arbitrary
//! boolean masks and additive bias (each broadcastable over batch, heads, queries and keys),
//! causal masking, softcap and GQA/MQA. Key tiles a mask hides entirely are skipped. The CUDA
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
mod attention;
mod buffers;
mod cpu;
mod cuda;
mod device;
mod dtype;
mod error;
mod memory;
mod problem;
mod reference;
mod tensor;

pub use attention::{Attention, Forward, GradientBuffers, Gradients, attention};
pub use device::{CudaDevice, Device, KernelResources};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use problem::Dims;
pub use tensor::{Layout, Tensor, set_output_poisoning};
