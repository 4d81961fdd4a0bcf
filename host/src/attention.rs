//! The public entry point: a builder that validates one attention call and runs it on the
//! inputs' device.
use crate::buffers::{self, Expected};
use crate::cpu::{lse_dtype, lse_shape};
use crate::cuda;
use crate::device::{CudaDevice, Device};
use crate::error::{Error, Result};
use crate::problem::{Inputs, Problem};
use crate::pages::PageTable;
use crate::seqlens::SeqLens;
use crate::sparse::{PreparedMask, SparseMask};
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
    Attention {
        inputs: Inputs { q, k, v, mask: None, indices: None, sparse: None, bias: None, causal: false, scale: None, softcap: 0.0, deterministic: false, seqs: None, pages: None },
        into: ForwardBuffers::default(),
    }
}

pub struct Attention<'a> {
    inputs: Inputs<'a>,
    into: ForwardBuffers<'a>,
}

/// Caller-provided buffers a forward writes instead of allocating its outputs.
#[derive(Clone, Copy, Default)]
pub(crate) struct ForwardBuffers<'a> {
    pub out: Option<&'a Tensor>,
    pub lse: Option<&'a Tensor>,
}

/// Caller-provided buffers a backward writes its gradients into instead of allocating them
/// ([`Forward::backward_into`]); each `None` is allocated as usual. dq and dbias must be
/// contiguous; dk and dv may have the strides k and v may have. None may overlap another buffer
/// or a tensor the call reads. CUDA tensors only.
#[derive(Clone, Copy, Default)]
pub struct GradientBuffers<'a> {
    pub dq: Option<&'a Tensor>,
    pub dk: Option<&'a Tensor>,
    pub dv: Option<&'a Tensor>,
    pub dbias: Option<&'a Tensor>,
}

impl<'a> Attention<'a> {
    /// Boolean mask broadcastable as `({1|batch}, {1|kv_heads|heads}, {1|seqlen_q}, {1|seqlen_k})`;
    /// false hides a score. Key tiles it hides entirely are skipped on the GPU. It is prepared
    /// (packed to bits on the GPU) by every call that takes it: a mask used by several calls is
    /// better prepared once ([`SparseMask::dense`], [`Attention::sparse_mask`]). A mask without a
    /// query dimension (`[.., .., 1, seqlen_k]`, a key-side mask) runs on the GPU as gather
    /// attention, O(seqlen_q x kept keys): its kept keys are compacted into lists, or on a
    /// decoding call the decoding kernel compacts them as it reads the keys (a kv group's heads
    /// times the queries at most 64, head dim at most 128, a mask over every key with one head
    /// or one per kv head, a bias, if any, without a query dimension, no sinks or compressed
    /// causal). With a packed batch ([`Attention::seqlens`]) the mask is key-side `[total_k,
    /// {1|kv_heads|heads}]` or query-based `[total_q, {1|kv_heads|heads}, max_seqlen_k]`, as its
    /// bias may be (columns past a sequence's keys are never read). A key-side mask that a
    /// decoding call takes is read where it is, not copied: by the decoding kernel as bytes,
    /// and again by each backward, which prepares it afresh (compacted or packed), so it must
    /// stay alive and unchanged until the [`Forward`]'s last backward is queued. ANDed with
    /// [`Attention::causal`] and with a parametric [`Attention::sparse_mask`] (a window,
    /// compressed causal, sinks).
    pub fn mask(mut self, mask: &'a Tensor) -> Self {
        self.inputs.mask = Some(mask);
        self
    }

    /// A prepared [`SparseMask`]: windows, compressed causal, sinks, block masks, dense or
    /// bit-packed score masks, and their combinations. It must have been prepared for this call's
    /// sequence lengths, on q's device (a parametric mask: any device). ANDed with
    /// [`Attention::causal`], and a parametric one with [`Attention::mask`] (one with data
    /// replaces it: combine the two with [`SparseMask::and`] instead).
    pub fn sparse_mask(mut self, mask: &'a PreparedMask) -> Self {
        self.inputs.sparse = Some(mask);
        self
    }

    /// Index lists (`attn_indices`) instead of a mask: I32 `[{1|batch}, {1|kv_heads|heads},
    /// {1|seqlen_q}, w]`, each row the keys its queries see, in any order, -1 as padding; a key
    /// listed twice is seen once; ANDed with [`Attention::causal`] on the original key positions
    /// (so lists pre-filtered for causality give the same result). Entries outside `-1..seqlen_k`
    /// are a typed error. Lists without a query dimension run as gather attention (work
    /// O(queries x w)), lists per query over each query's own keys where that pays
    /// ([`PreparedMask::per_query_lists`]); see [`SparseMask::indices`] to prepare them once for
    /// several calls.
    pub fn indices(mut self, indices: &'a Tensor) -> Self {
        self.inputs.indices = Some(indices);
        self
    }

    /// Additive bias with the mask's broadcast shapes, added after scale and softcap.
    pub fn bias(mut self, bias: &'a Tensor) -> Self {
        self.inputs.bias = Some(bias);
        self
    }

    /// A packed variable-length batch: q is `[total_q, heads, head_dim]` and k, v
    /// `[total_k, kv_heads, head_dim]`, sequence `b` owning the rows `seqs` gives it, each
    /// sequence attending only to its own keys. Every option applies to each sequence as to a
    /// fixed-length call of its lengths (causal and windows aligned to its own bottom-right
    /// corner); O has q's shape and LSE is `[heads, total_q]`. A bias is key-side `[total_k,
    /// {1|kv_heads|heads}]` (each query sees its keys' values; its
    /// gradient sums over the sequence's queries) or query-based `[total_q, {1|kv_heads|heads},
    /// max_seqlen_k]` (query row `i`'s values for its sequence's keys `0..len_k`; the columns past
    /// a sequence's keys are never read, and their gradient is 0). A bool mask takes the same
    /// two layouts ([`Attention::mask`]), either with either layout of bias. Parametric sparse
    /// masks are taken, prepared for at least the longest sequences' lengths
    /// ([`SeqLens::max_seqlen_q`] and `_k`); index lists and sparse masks with data are not yet
    /// (a typed error).
    pub fn seqlens(mut self, seqs: &'a SeqLens) -> Self {
        self.inputs.seqs = Some(seqs);
        self
    }

    /// K and V as the pages of a paged KV cache, `[num_pages, page_size, kv_heads, head_dim]`
    /// (page_size a power of two, at most 2^31), sequence `b`'s keys where its row of `table`
    /// says; with a packed batch ([`Attention::seqlens`], whose key lengths say how many of a
    /// sequence's keys there are), for the forward (the backward of a paged call is a typed
    /// error). A key-side bias stays in the packed `[total_k, ..]` order of `cu_seqlens_k`.
    /// The outputs are those of the same call with each sequence's keys packed.
    pub fn kv_pages(mut self, table: &'a PageTable) -> Self {
        self.inputs.pages = Some(table);
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

    /// Writes O into `out` (q's shape and dtype, on q's device; the strides q may have) instead of
    /// allocating it. It may not overlap an input. CUDA tensors only.
    pub fn out(mut self, out: &'a Tensor) -> Self {
        self.into.out = Some(out);
        self
    }

    /// Writes LSE into `lse` (contiguous `[batch, heads, seqlen_q]` f32 on q's device) instead of
    /// allocating it. CUDA tensors only.
    pub fn lse(mut self, lse: &'a Tensor) -> Self {
        self.into.lse = Some(lse);
        self
    }

    /// Runs the forward pass. O has q's shape and dtype; LSE is `[batch, heads, seqlen_q]`
    /// (natural log, f32; f64 for f64 inputs). A query row with no visible key gets O = 0 and
    /// LSE = -inf.
    pub fn forward(self) -> Result<Forward> {
        self.run(cuda::forward)
    }

    /// The tensors the call reads, by argument name.
    fn reads(&self) -> Vec<(&'static str, &'a Tensor)> {
        let i = &self.inputs;
        let optional = [("mask", i.mask), ("indices", i.indices), ("bias", i.bias)].into_iter().filter_map(|(a, t)| t.map(|t| (a, t)));
        let seqs = i.seqs.into_iter().flat_map(|s| {
            let (q, k) = s.device_tensors();
            [("cu_seqlens_q", q), ("cu_seqlens_k", k)]
        });
        let table = i.pages.map(|t| ("block_table", t.device_tensor()));
        [("q", i.q), ("k", i.k), ("v", i.v)].into_iter().chain(optional).chain(seqs).chain(table).collect()
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
        if self.into.out.is_some() || self.into.lse.is_some() {
            return Err(Error::Unsupported { what: "caller-provided output buffers for forward_materialized".into(), backend: "CUDA" });
        }
        self.run(|dev, p, saved, _| cuda::forward_materialized(dev, p, saved))
    }

    /// Validates the call and runs it on the inputs' device: the CPU backend, or `on_cuda`.
    fn run(self, on_cuda: fn(&CudaDevice, Problem, Saved, ForwardBuffers) -> Result<Forward>) -> Result<Forward> {
        let problem = Problem::new(&self.inputs)?;
        let i = &self.inputs;
        let d = problem.dims;
        let lse_shape = lse_shape(&problem);
        let dests: Vec<_> = [
            self.into.out.map(|t| ("out", t, Expected { shape: i.q.shape(), dtype: problem.dtype, contiguous: false })),
            self.into.lse.map(|t| ("lse", t, Expected { shape: &lse_shape, dtype: lse_dtype(problem.dtype), contiguous: true })),
        ]
        .into_iter()
        .flatten()
        .collect();
        buffers::check(&i.q.device(), &dests, &self.reads())?;
        let mask = match (i.mask, i.indices, i.sparse) {
            (Some(m), _, _) => Some(match (&problem.seqs, problem.packed_mask) {
                (Some(seqs), Some(layout)) => PreparedMask::packed(m, layout, seqs)?,
                // A decoding call's key-side mask: read where it is (no launch before the call).
                _ if m.device().is_cuda() && cuda::reads_key_bytes(&problem, m) => PreparedMask::key_bytes(m, d.seqlen_q, d.seqlen_k),
                _ => SparseMask::dense(m).prepare(d.seqlen_q, d.seqlen_k)?,
            }),
            (None, Some(t), _) => Some(match &problem.seqs {
                Some(seqs) => SparseMask::indices(t).prepare_packed(seqs)?,
                None => SparseMask::indices(t).prepare(d.seqlen_q, d.seqlen_k)?,
            }),
            (None, None, sparse) => sparse.cloned(),
        };
        // Index lists that are a window were prepared as that band alone (no data): the call runs
        // on it, as on a sparse mask's band (neither has sinks or a compressed diagonal).
        let mut problem = problem;
        if let (Some(m), Some(_)) = (&mask, i.indices)
            && m.data.is_none()
        {
            problem.mask = None;
            problem.band.left = problem.band.left.min(m.band.left);
            problem.band.right = problem.band.right.min(m.band.right);
        }
        let saved = Saved { q: i.q.clone(), k: i.k.clone(), v: i.v.clone(), mask, bias: i.bias.cloned() };
        match i.q.device() {
            Device::Cpu => {
                let (out, lse) = cpu::forward(&problem, &saved)?;
                Ok(Forward { out, lse, problem, saved })
            }
            Device::Cuda(dev) => on_cuda(&dev, problem, saved, self.into),
        }
    }
}

/// What the backward pass needs from the forward: the inputs (shared, not copied) and the
/// prepared mask.
#[derive(Clone)]
pub(crate) struct Saved {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub mask: Option<PreparedMask>,
    pub bias: Option<Tensor>,
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
        self.backward_into(dout, GradientBuffers::default())
    }

    /// [`Forward::backward`], writing the gradients into the caller's buffers where given (the
    /// returned tensors then share their memory).
    pub fn backward_into(&self, dout: &Tensor, into: GradientBuffers) -> Result<Gradients> {
        if dout.shape() != self.out.shape() {
            return Err(Error::Shape { arg: "dout", expected: format!("{:?} (the shape of out)", self.out.shape()), got: dout.shape().to_vec() });
        }
        if dout.dtype() != self.out.dtype() {
            return Err(Error::DType { arg: "dout", expected: format!("{:?} (the dtype of out)", self.out.dtype()), got: dout.dtype() });
        }
        if !dout.device().same(&self.out.device()) {
            return Err(Error::Device { arg: "dout", expected: self.out.device().to_string(), got: dout.device().to_string() });
        }
        let s = &self.saved;
        if self.problem.pages.is_some() {
            return Err(Error::Unsupported { what: "the backward of a call with paged K/V".into(), backend: "CPU or CUDA" });
        }
        if into.dbias.is_some() && s.bias.is_none() {
            return Err(Error::Param { arg: "dbias", reason: "the call has no bias".into() });
        }
        fn like(t: &Tensor, contiguous: bool) -> Expected<'_> {
            Expected { shape: t.shape(), dtype: t.dtype(), contiguous }
        }
        let bias_like = s.bias.as_ref().map(|b| like(b, true));
        let dests: Vec<_> = [
            into.dq.map(|t| ("dq", t, like(&s.q, true))),
            into.dk.map(|t| ("dk", t, like(&s.k, false))),
            into.dv.map(|t| ("dv", t, like(&s.v, false))),
            into.dbias.zip(bias_like).map(|(t, want)| ("dbias", t, want)),
        ]
        .into_iter()
        .flatten()
        .collect();
        // The mask was read into its prepared form (dmattn's own memory) before the forward,
        // but for a key-side mask that a decoding forward read as it is: the backward prepares
        // it, so it is read here.
        let unpacked = s.mask.as_ref().and_then(|m| m.unpacked_source()).map(|t| ("mask", t));
        let optional = s.bias.as_ref().map(|t| ("bias", t)).into_iter().chain(unpacked);
        let reads: Vec<_> = [("q", &s.q), ("k", &s.k), ("v", &s.v), ("out", &self.out), ("lse", &self.lse), ("dout", dout)].into_iter().chain(optional).collect();
        buffers::check(&self.out.device(), &dests, &reads)?;
        match self.out.device() {
            Device::Cpu => cpu::backward(&self.problem, &self.saved, &self.out, &self.lse, dout),
            Device::Cuda(dev) => cuda::backward(&dev, self, dout, into),
        }
    }
}
