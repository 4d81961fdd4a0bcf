//! The public entry point: a builder that validates one attention call and runs it on the
//! inputs' device.
use crate::cuda;
use crate::device::{CudaDevice, Device};
use crate::error::{Error, Result};
use crate::problem::{Inputs, Problem};
use crate::tensor::Tensor;
use crate::cpu;

/// Attention of `q` `[batch, seqlen_q, heads, head_dim]` over `k`, `v`
/// `[batch, seqlen_k, kv_heads, head_dim]`; configure, then call [`Attention::forward`].
///
/// ```
/// use dmattn::{attention, Device, Tensor};
/// # fn main() -> dmattn::Result<()> {
/// let dev = Device::Cpu;
/// let q = Tensor::from_fn(&[1, 5, 2, 8], dmattn::DType::F32, &dev, |i| (i as f64 * 0.37).sin())?;
/// let k = Tensor::from_fn(&[1, 7, 1, 8], dmattn::DType::F32, &dev, |i| (i as f64 * 0.11).cos())?;
/// let v = k.clone();
/// let mask = Tensor::from_fn(&[1, 1, 5, 7], dmattn::DType::Bool, &dev, |i| (i % 3 != 0) as u8 as f64)?;
/// let fwd = attention(&q, &k, &v).mask(&mask).causal(true).forward()?;
/// assert_eq!(fwd.out.shape(), &[1, 5, 2, 8]);
/// # Ok(()) }
/// ```
pub fn attention<'a>(q: &'a Tensor, k: &'a Tensor, v: &'a Tensor) -> Attention<'a> {
    Attention { inputs: Inputs { q, k, v, mask: None, bias: None, causal: false, scale: None, softcap: 0.0, deterministic: false } }
}

pub struct Attention<'a> {
    inputs: Inputs<'a>,
}

impl<'a> Attention<'a> {
    /// Boolean mask broadcastable as `({1|batch}, {1|kv_heads|heads}, {1|seqlen_q}, {1|seqlen_k})`;
    /// false hides a score. Key tiles it hides entirely are skipped on the GPU.
    pub fn mask(mut self, mask: &'a Tensor) -> Self {
        self.inputs.mask = Some(mask);
        self
    }

    /// Additive bias with the mask's broadcast shapes, added after scale and softcap.
    pub fn bias(mut self, bias: &'a Tensor) -> Self {
        self.inputs.bias = Some(bias);
        self
    }

    /// Causal masking aligned to the bottom-right corner: key `j` is visible to query `i` iff
    /// `j <= i + seqlen_k - seqlen_q`.
    pub fn causal(mut self, causal: bool) -> Self {
        self.inputs.causal = causal;
        self
    }

    /// Softmax scale (default `1 / sqrt(head_dim)`).
    pub fn scale(mut self, scale: f64) -> Self {
        self.inputs.scale = Some(scale);
        self
    }

    /// Softcap `c`: scores become `c * tanh(s / c)` before the bias. 0 (the default) is off.
    pub fn softcap(mut self, cap: f64) -> Self {
        self.inputs.softcap = cap;
        self
    }

    /// Makes the backward pass bit-identical from run to run: on the GPU the dQ and dBias
    /// additions then happen in a fixed order instead of atomically (slower). The CPU backend is
    /// always deterministic.
    pub fn deterministic(mut self, on: bool) -> Self {
        self.inputs.deterministic = on;
        self
    }

    /// Runs the forward pass. O has q's shape and dtype; LSE is `[batch, heads, seqlen_q]`
    /// (natural log, f32; f64 for f64 inputs). A query row with no visible key gets O = 0 and
    /// LSE = -inf.
    pub fn forward(self) -> Result<Forward> {
        self.run(cuda::forward)
    }

    /// The unfused path: materialises S and P, O(batch·heads·sq·sk) memory; for baselines and
    /// large-shape cross-checks. On the GPU, S = QKᵀ and O = PV are cuBLAS products and the
    /// softmax (scale, softcap, bias, mask, causal) runs as its own kernel in between, with S and
    /// P stored in q's dtype as a framework without a fused kernel stores them: each logit is
    /// then rounded to that dtype (half an ulp of `scale · q·k`, 2^-8 relative for bf16), where
    /// [`Attention::forward`] keeps it in f32. The results have `forward`'s shapes and meaning
    /// (LSE included) and `.backward()` works on them (it runs the fused backward). Any head_dim
    /// and any q/k/v layout with unit head_dim stride and non-overlapping rows is taken. An S too
    /// large for the device's memory is a typed error. On the CPU this is the CPU forward, which
    /// materialises already.
    pub fn forward_materialized(self) -> Result<Forward> {
        self.run(cuda::forward_materialized)
    }

    /// Validates the call and runs it on the inputs' device: the CPU backend, or `on_cuda`.
    fn run(self, on_cuda: fn(&CudaDevice, Problem, Saved) -> Result<Forward>) -> Result<Forward> {
        let problem = Problem::new(&self.inputs)?;
        let i = &self.inputs;
        let saved = Saved {
            q: i.q.clone(),
            k: i.k.clone(),
            v: i.v.clone(),
            mask: i.mask.cloned(),
            bias: i.bias.cloned(),
            gpu: None,
        };
        match i.q.device() {
            Device::Cpu => {
                let (out, lse) = cpu::forward(&problem, &saved)?;
                Ok(Forward { out, lse, problem, saved })
            }
            Device::Cuda(dev) => on_cuda(&dev, problem, saved),
        }
    }
}

/// What the backward pass needs from the forward: the inputs (shared, not copied) and, on the
/// GPU, the prepared mask (the fused forward prepares it; after the materialising forward the
/// backward prepares it itself).
#[derive(Clone)]
pub(crate) struct Saved {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub mask: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub gpu: Option<cuda::PreparedMask>,
}

/// The result of a forward pass, holding what its backward pass needs.
pub struct Forward {
    /// `[batch, seqlen_q, heads, head_dim]`, the dtype of q.
    pub out: Tensor,
    /// `[batch, heads, seqlen_q]`.
    pub lse: Tensor,
    pub(crate) problem: Problem,
    pub(crate) saved: Saved,
}

/// Gradients of a loss with respect to the inputs, in their shapes and dtypes.
pub struct Gradients {
    pub dq: Tensor,
    pub dk: Tensor,
    pub dv: Tensor,
    /// Summed over every broadcast dimension of the bias; `None` without a bias.
    pub dbias: Option<Tensor>,
}

impl Forward {
    /// Gradients given `dout`, the gradient of the loss with respect to `out`.
    pub fn backward(&self, dout: &Tensor) -> Result<Gradients> {
        if dout.shape() != self.out.shape() {
            return Err(Error::Shape { arg: "dout", expected: format!("{:?} (the shape of out)", self.out.shape()), got: dout.shape().to_vec() });
        }
        if dout.dtype() != self.out.dtype() {
            return Err(Error::DType { arg: "dout", expected: format!("{:?} (the dtype of out)", self.out.dtype()), got: dout.dtype() });
        }
        if !dout.device().same(&self.out.device()) {
            return Err(Error::Device { arg: "dout", expected: self.out.device().to_string(), got: dout.device().to_string() });
        }
        match self.out.device() {
            Device::Cpu => cpu::backward(&self.problem, &self.saved, &self.out, &self.lse, dout),
            Device::Cuda(dev) => cuda::backward(&dev, self, dout, self.problem.deterministic),
        }
    }
}
