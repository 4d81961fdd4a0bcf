//! The physical ceilings measured on the same GPU in the same run: a large bf16 matrix product
//! through cuBLAS, and a device-to-device copy.
use crate::timing::Timer;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use dmattn::CudaDevice;
use dmattn_bench::results::Ceilings;
use half::bf16;

pub fn measure(dev: &CudaDevice, timer: &Timer) -> dmattn::Result<Ceilings> {
    let stream = dev.stream();
    let n = 8192usize;
    let a: Vec<bf16> = (0..n * n).map(|i| bf16::from_f32(((i * 2654435761usize) % 1000) as f32 / 1000.0 - 0.5)).collect();
    let (da, db) = (stream.clone_htod(&a)?, stream.clone_htod(&a)?);
    let mut dc = stream.alloc_zeros::<bf16>(n * n)?;
    let blas = CudaBlas::new(stream.clone())?;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: n as i32,
        k: n as i32,
        alpha: bf16::ONE,
        lda: n as i32,
        ldb: n as i32,
        beta: bf16::ZERO,
        ldc: n as i32,
    };
    let ms = timer.median_ms(stream, |_| unsafe { blas.gemm(cfg, &da, &db, &mut dc) }.map_err(dmattn::Error::from))?;
    let matmul_tflops = 2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e12;

    let bytes = 1usize << 30;
    let pattern: Vec<u8> = (0..bytes).map(|i| (i * 31 % 251) as u8).collect();
    let src = stream.clone_htod(&pattern)?;
    let mut dst = stream.alloc_zeros::<u8>(bytes)?;
    let ms = timer.median_ms(stream, |_| Ok(stream.memcpy_dtod(&src, &mut dst)?))?;
    let copy_gbps = 2.0 * bytes as f64 / (ms * 1e-3) / 1e9;
    Ok(Ceilings { matmul_tflops, copy_gbps })
}
