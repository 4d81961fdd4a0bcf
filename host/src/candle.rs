//! dmattn as a candle op (feature `candle`): attention over candle tensors on candle's CUDA
//! device and stream, with gradients for q, k, v and the bias through candle's autograd.
//!
//! candle's custom ops take at most three tensors with gradients, and a biased attention has
//! four (q, k, v, bias). Two ops share one dmattn call: `Attn` (`CustomOp3` on q, k, v) runs
//! the forward and keeps it; where the bias needs a gradient it returns a one-element token and
//! `Finish` (`CustomOp2` on the token and the bias) returns O. Backprop reaches `Finish` first:
//! it runs dmattn's backward once, returns dbias, and leaves dq, dk and dv for `Attn`. Nothing is
//! copied: q, k, v, mask and bias are read where candle holds them, O and the gradients are
//! written into storage candle allocates.
use crate::{CudaDevice, DType, Error as DmError, Forward, GradientBuffers, Layout, Tensor as DmTensor};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::DevicePtr;
use candle_core::cuda_backend::{CudaStorageSlice, DeviceId};
use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, CustomOp3, Layout as CLayout, Result, Shape, Storage, Tensor, bail};
use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The options of [`attention`]: those of [`crate::Attention`].
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// A U8 mask (non-zero keeps a score), broadcastable as dmattn's masks are.
    pub mask: Option<Tensor>,
    /// An additive bias in q's dtype, broadcastable as dmattn's are; pass it unexpanded (its
    /// gradient has its shape).
    pub bias: Option<Tensor>,
    pub causal: bool,
    pub scale: Option<f64>,
    pub softcap: f64,
    pub deterministic: bool,
}

/// Attention of `q` `[batch, seqlen_q, heads, head_dim]` over `k`, `v`
/// `[batch, seqlen_k, kv_heads, head_dim]` (bf16 or f16, on one candle CUDA device), with
/// `options`; differentiable in q, k, v and the bias.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, options: &Options) -> Result<Tensor> {
    let bias_grad = options.bias.as_ref().is_some_and(|b| b.track_op());
    let call = Arc::new(Call { options: options.clone(), state: Mutex::new(State::default()) });
    if bias_grad {
        let token = q.apply_op3_arc(k, v, Arc::new(Box::new(Attn { call: call.clone(), token: true })))?;
        token.apply_op2_arc(options.bias.as_ref().expect("a bias"), Arc::new(Box::new(Finish(call))))
    } else {
        q.apply_op3_arc(k, v, Arc::new(Box::new(Attn { call, token: false })))
    }
}

fn err(e: DmError) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// dmattn on the stream of candle's device `dev` (one per device: its stream is fixed).
fn device(dev: &candle_core::CudaDevice) -> Result<CudaDevice> {
    static DEVICES: Mutex<Option<HashMap<DeviceId, CudaDevice>>> = Mutex::new(None);
    let mut devices = DEVICES.lock().unwrap();
    let devices = devices.get_or_insert_with(HashMap::new);
    if let Some(d) = devices.get(&dev.id()) {
        return Ok(d.clone());
    }
    let d = CudaDevice::from_stream(dev.cuda_stream()).map_err(err)?;
    devices.insert(dev.id(), d.clone());
    Ok(d)
}

/// A dmattn view of candle's storage `s` seen through `l`, without a copy.
///
/// # Safety
/// `s` must stay allocated while the view is used: `owner` keeps it so, or the caller does.
unsafe fn view(s: &CudaStorage, l: &CLayout, dev: &CudaDevice, owner: Option<Arc<dyn Any + Send + Sync>>) -> Result<DmTensor> {
    let stream = dev.stream();
    macro_rules! raw {
        ($slice:expr, $dtype:expr) => {{
            let (ptr, _record) = $slice.device_ptr(stream);
            (ptr, $slice.len(), $dtype)
        }};
    }
    let (ptr, len, dtype) = match &s.slice {
        CudaStorageSlice::BF16(x) => raw!(x, DType::BF16),
        CudaStorageSlice::F16(x) => raw!(x, DType::F16),
        CudaStorageSlice::F32(x) => raw!(x, DType::F32),
        // dmattn's masks are one byte per score, 0 = hidden: candle's U8.
        CudaStorageSlice::U8(x) => raw!(x, DType::Bool),
        _ => bail!("dmattn: {:?} tensors are not taken (bf16, f16, f32, u8 masks)", s.dtype()),
    };
    let layout = Layout { shape: l.dims().to_vec(), strides: l.stride().to_vec(), offset: l.start_offset() };
    // Safety: forwarded to the caller.
    unsafe { DmTensor::from_raw_parts(ptr, len, dtype, layout, dev, owner) }.map_err(err)
}

/// A candle tensor the op holds (mask, bias) as a dmattn view that keeps it alive.
fn view_tensor(t: &Tensor, dev: &CudaDevice) -> Result<DmTensor> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(s) = &*storage else { bail!("dmattn: the mask and bias must be on q's CUDA device") };
    // Safety: the view owns a clone of the tensor, which holds its storage.
    unsafe { view(s, layout, dev, Some(Arc::new(t.clone()))) }
}

/// Uninitialised candle storage of `n` elements of `dtype` on `dev`, for dmattn to fill.
fn alloc(dev: &candle_core::CudaDevice, dtype: candle_core::DType, n: usize) -> Result<CudaStorage> {
    // Safety: dmattn writes every element before candle reads any.
    Ok(match dtype {
        candle_core::DType::BF16 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(n)? }, dev.clone()),
        candle_core::DType::F16 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::f16>(n)? }, dev.clone()),
        candle_core::DType::F32 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<f32>(n)? }, dev.clone()),
        other => bail!("dmattn: no {other:?} outputs"),
    })
}

/// One attention call, shared by its ops.
struct Call {
    options: Options,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The forward, kept for the backward (it holds what the backward reads).
    forward: Option<Forward>,
    /// O while `Finish` has not returned it.
    out: Option<CudaStorage>,
    /// dq, dk, dv from `Finish`'s backward, for `Attn`'s.
    qkv_grads: Option<(Tensor, Tensor, Tensor)>,
}

impl Call {
    /// dmattn's forward into candle storage, kept for the backward.
    fn forward(&self, q: (&CudaStorage, &CLayout), k: (&CudaStorage, &CLayout), v: (&CudaStorage, &CLayout)) -> Result<CudaStorage> {
        let cdev = &q.0.device;
        let dev = device(cdev)?;
        // Safety: candle's graph keeps q, k and v alive with this op, whose forward the
        // backward reads; the mask and bias views own their tensors.
        let (qv, kv, vv) = unsafe { (view(q.0, q.1, &dev, None)?, view(k.0, k.1, &dev, None)?, view(v.0, v.1, &dev, None)?) };
        let mask = self.options.mask.as_ref().map(|m| view_tensor(m, &dev)).transpose()?;
        let bias = self.options.bias.as_ref().map(|b| view_tensor(b, &dev)).transpose()?;
        let out = alloc(cdev, q.0.dtype(), q.1.shape().elem_count())?;
        // Safety: `out` is returned to candle, which holds it as long as the view is used (the
        // forward's own O, read by the backward, lives with this op's result).
        let out_view = unsafe { view(&out, &CLayout::contiguous(q.1.shape()), &dev, None)? };
        let o = &self.options;
        let mut call = crate::attention(&qv, &kv, &vv).causal(o.causal).softcap(o.softcap).deterministic(o.deterministic).out(&out_view);
        if let Some(s) = o.scale {
            call = call.scale(s);
        }
        if let Some(m) = &mask {
            call = call.mask(m);
        }
        if let Some(b) = &bias {
            call = call.bias(b);
        }
        self.state.lock().unwrap().forward = Some(call.forward().map_err(err)?);
        Ok(out)
    }

    /// dq, dk, dv and (with a bias) dbias for `dout`, written by dmattn into candle storage.
    fn backward(&self, dout: &Tensor) -> Result<(Tensor, Tensor, Tensor, Option<Tensor>)> {
        let state = self.state.lock().unwrap();
        let Some(fwd) = state.forward.as_ref() else { bail!("dmattn: backward before forward") };
        let dout = dout.contiguous()?;
        let (storage, layout) = dout.storage_and_layout();
        let Storage::Cuda(ds) = &*storage else { bail!("dmattn: the output gradient is not on the CUDA device") };
        let cdev = ds.device.clone();
        let dev = device(&cdev)?;
        // Safety: `dout` outlives the backward call below.
        let dout_view = unsafe { view(ds, layout, &dev, None)? };
        let grad = |like: &DmTensor| -> Result<(CudaStorage, DmTensor, Vec<usize>)> {
            let shape = like.shape().to_vec();
            let dtype = match like.dtype() {
                DType::BF16 => candle_core::DType::BF16,
                DType::F16 => candle_core::DType::F16,
                _ => candle_core::DType::F32,
            };
            let s = alloc(&cdev, dtype, shape.iter().product())?;
            // Safety: `s` becomes the returned gradient tensor's storage.
            let v = unsafe { view(&s, &CLayout::contiguous(shape.as_slice()), &dev, None)? };
            Ok((s, v, shape))
        };
        let saved = &fwd.saved;
        let (dq, dk, dv) = (grad(&saved.q)?, grad(&saved.k)?, grad(&saved.v)?);
        let dbias = saved.bias.as_ref().map(grad).transpose()?;
        let into = GradientBuffers { dq: Some(&dq.1), dk: Some(&dk.1), dv: Some(&dv.1), dbias: dbias.as_ref().map(|d| &d.1) };
        fwd.backward_into(&dout_view, into).map_err(err)?;
        let tensor = |(s, _, shape): (CudaStorage, DmTensor, Vec<usize>)| Tensor::from_storage(Storage::Cuda(s), shape, BackpropOp::none(), false);
        Ok((tensor(dq), tensor(dk), tensor(dv), dbias.map(tensor)))
    }
}

/// The forward of a call, as a `CustomOp3` on q, k, v: O, or a token for [`Finish`].
struct Attn {
    call: Arc<Call>,
    /// Return a one-element f32 token and leave O to `Finish`.
    token: bool,
}

impl CustomOp3 for Attn {
    fn name(&self) -> &'static str {
        "dmattn-attention"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &CLayout, _: &CpuStorage, _: &CLayout, _: &CpuStorage, _: &CLayout) -> Result<(CpuStorage, Shape)> {
        bail!("dmattn's candle op runs on candle's CUDA devices; on the CPU, dmattn's own API takes the same call")
    }

    fn cuda_fwd(&self, q: &CudaStorage, ql: &CLayout, k: &CudaStorage, kl: &CLayout, v: &CudaStorage, vl: &CLayout) -> Result<(CudaStorage, Shape)> {
        let out = self.call.forward((q, ql), (k, kl), (v, vl))?;
        if !self.token {
            return Ok((out, ql.shape().clone()));
        }
        self.call.state.lock().unwrap().out = Some(out);
        let token = CudaStorage::wrap_cuda_slice(q.device.alloc_zeros::<f32>(1)?, q.device.clone());
        Ok((token, Shape::from_dims(&[1])))
    }

    fn bwd(&self, _q: &Tensor, _k: &Tensor, _v: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dq, dk, dv) = if self.token {
            let Some(grads) = self.call.state.lock().unwrap().qkv_grads.take() else { bail!("dmattn: the bias op's backward did not run first") };
            grads
        } else {
            let (dq, dk, dv, _) = self.call.backward(grad)?;
            (dq, dk, dv)
        };
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// O of a call whose bias needs a gradient, as a `CustomOp2` on the token and the bias.
struct Finish(Arc<Call>);

impl CustomOp2 for Finish {
    fn name(&self) -> &'static str {
        "dmattn-attention-bias"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &CLayout, _: &CpuStorage, _: &CLayout) -> Result<(CpuStorage, Shape)> {
        bail!("dmattn's candle op runs on candle's CUDA devices")
    }

    fn cuda_fwd(&self, _token: &CudaStorage, _: &CLayout, _bias: &CudaStorage, _: &CLayout) -> Result<(CudaStorage, Shape)> {
        let mut state = self.0.state.lock().unwrap();
        let Some(out) = state.out.take() else { bail!("dmattn: the attention op did not run first") };
        let shape = Shape::from_dims(state.forward.as_ref().expect("the forward ran").out.shape());
        Ok((out, shape))
    }

    fn bwd(&self, token: &Tensor, _bias: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dq, dk, dv, dbias) = self.0.backward(grad)?;
        self.0.state.lock().unwrap().qkv_grads = Some((dq, dk, dv));
        Ok((Some(token.zeros_like()?), dbias))
    }
}
