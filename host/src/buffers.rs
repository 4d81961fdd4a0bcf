//! Caller-provided output and gradient buffers: checked against what the call writes there and
//! against every tensor the call reads, before anything is queued.
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What a call writes into one buffer.
pub(crate) struct Expected<'a> {
    pub shape: &'a [usize],
    pub dtype: DType,
    /// The kernel writes it densely in row-major order.
    pub contiguous: bool,
}

/// Checks each `(arg, buffer, expected)` of `dests` for the call on `device`: its shape, dtype
/// and device, contiguity where required, and that it overlaps neither another buffer nor any
/// tensor of `reads`.
pub(crate) fn check(device: &Device, dests: &[(&'static str, &Tensor, Expected)], reads: &[(&'static str, &Tensor)]) -> Result<()> {
    for (i, &(arg, t, ref want)) in dests.iter().enumerate() {
        if t.shape() != want.shape {
            return Err(Error::Shape { arg, expected: format!("{:?}", want.shape), got: t.shape().to_vec() });
        }
        if t.dtype() != want.dtype {
            return Err(Error::DType { arg, expected: format!("{:?}", want.dtype), got: t.dtype() });
        }
        if !device.is_cuda() {
            return Err(Error::Unsupported { what: format!("a caller-provided buffer (`{arg}`)"), backend: "CPU" });
        }
        if !t.device().same(device) {
            return Err(Error::Device { arg, expected: format!("{device} (the device of q)"), got: t.device().to_string() });
        }
        if want.contiguous && !t.layout().is_contiguous() {
            return Err(Error::Layout { arg, backend: "CUDA", reason: format!("strides {:?}: the buffer must be contiguous", t.strides()) });
        }
        let others = dests[..i].iter().map(|&(a, t, _)| (a, t)).chain(reads.iter().copied());
        for (other, o) in others {
            if overlap(t, o) {
                return Err(Error::Param { arg, reason: format!("the buffer overlaps `{other}`") });
            }
        }
    }
    Ok(())
}

fn overlap(a: &Tensor, b: &Tensor) -> bool {
    match (a.device_range(), b.device_range()) {
        (Some((a0, a1)), Some((b0, b1))) => a0 < b1 && b0 < a1,
        _ => false,
    }
}
