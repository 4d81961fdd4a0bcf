//! The CPU backend: the f64 reference behind the same API, inputs and outputs in their dtypes.
use crate::attention::{Gradients, Saved};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::problem::Problem;
use crate::reference::{self, Operands};
use crate::tensor::Tensor;

fn operands(s: &Saved) -> Result<Operands> {
    Ok(Operands {
        q: s.q.to_f64_vec()?,
        k: s.k.to_f64_vec()?,
        v: s.v.to_f64_vec()?,
        mask: s.mask.as_ref().map(|m| m.to_f64_vec().map(|v| v.into_iter().map(|x| x != 0.0).collect())).transpose()?,
        bias: s.bias.as_ref().map(|b| b.to_f64_vec()).transpose()?,
    })
}

/// The dtype LSE is reported in: f64 for f64 inputs, f32 otherwise.
pub(crate) fn lse_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 { DType::F64 } else { DType::F32 }
}

fn tensor(values: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::from_fn(shape, dtype, &Device::Cpu, |i| values[i])
}

pub(crate) fn forward(p: &Problem, s: &Saved) -> Result<(Tensor, Tensor)> {
    let (out, lse) = reference::forward(p, &operands(s)?);
    Ok((tensor(&out, s.q.shape(), p.dtype)?, tensor(&lse, &lse_shape(p), lse_dtype(p.dtype))?))
}

pub(crate) fn lse_shape(p: &Problem) -> [usize; 3] {
    [p.dims.batch, p.dims.heads, p.dims.seqlen_q]
}

pub(crate) fn backward(p: &Problem, s: &Saved, out: &Tensor, lse: &Tensor, dout: &Tensor) -> Result<Gradients> {
    let (dq, dk, dv, dbias) =
        reference::backward(p, &operands(s)?, &out.to_f64_vec()?, &lse.to_f64_vec()?, &dout.to_f64_vec()?);
    Ok(Gradients {
        dq: tensor(&dq, s.q.shape(), p.dtype)?,
        dk: tensor(&dk, s.k.shape(), p.dtype)?,
        dv: tensor(&dv, s.v.shape(), p.dtype)?,
        dbias: match (dbias, &s.bias) {
            (Some(db), Some(b)) => Some(tensor(&db, b.shape(), b.dtype())?),
            _ => None,
        },
    })
}
