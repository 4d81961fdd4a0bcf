//! Typed errors: every rejection names the argument and what was expected.
use crate::DType;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{arg}` has shape {got:?}, expected {expected}")]
    Shape { arg: &'static str, expected: String, got: Vec<usize> },

    #[error("`{arg}` has dtype {got:?}, expected {expected}")]
    DType { arg: &'static str, expected: String, got: DType },

    #[error("`{arg}` has a layout the {backend} backend cannot read: {reason}")]
    Layout { arg: &'static str, backend: &'static str, reason: String },

    #[error("`{arg}` is on {got}, expected {expected}")]
    Device { arg: &'static str, expected: String, got: String },

    #[error("`{arg}` is invalid: {reason}")]
    Param { arg: &'static str, reason: String },

    #[error("{what} is not supported by the {backend} backend")]
    Unsupported { what: String, backend: &'static str },

    #[error("no CUDA device: {0}")]
    NoCuda(String),

    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),

    #[error("cuBLAS error: {0}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),
}

pub type Result<T> = std::result::Result<T, Error>;
