//! The materialising (unfused) forward: what a framework without a fused attention kernel runs,
//! kept as a benchmark baseline and as a GPU cross-check for shapes too large for the CPU
//! reference. S = QKᵀ on cuBLAS (f32 accumulation, stored in q's dtype, `[b, h, sq, sk]`
//! contiguous), the row softmax kernel (`dmattn_softmax_rows_<elem>`: scale, softcap, bias,
//! mask, causal, LSE; P overwrites S in place), then O = PV on cuBLAS into `[b, sq, h, d]`.
//! K and V are never copied for GQA (see [`HeadBatches`]).
//!
//! q, k and v are read in place through their strides. cuBLAS needs each `s x d` matrix to have
//! unit stride along head_dim and rows that do not overlap (a sequence stride of at least
//! head_dim); a layout without them is a typed [`Error::Layout`], nothing is copied to make it
//! contiguous. Unlike the fused kernels, this path takes any head_dim and needs no 16-byte
//! alignment (the backward from its result still does).
//!
//! cuBLAS is column-major and every matrix here row-major. A row-major `r x c` matrix with row
//! stride `ld` is, read column-major, its transpose, `c x r` with leading dimension `ld`. Per
//! (batch, query head), with Q `sq x d` (row stride `ldq`), K and V `sk x d` (`ldk`, `ldv`), S and
//! P `sq x sk` (row stride `sk`) and O `sq x d` (row stride `h·d`):
//!
//! - `S = Q Kᵀ` is computed as `Sᵀ = K Qᵀ`, column-major `sk x sq` with ldc = sk: `m = sk`,
//!   `n = sq`, `k = d`; A is K read as `d x sk` (lda = ldk), transposed (`OP_T`) to `sk x d`;
//!   B is Q read as `d x sq` (ldb = ldq), as is (`OP_N`). Element (j, i) of C lands at
//!   `i·sk + j`: S[i][j].
//! - `O = P V` is computed as `Oᵀ = Vᵀ Pᵀ`, column-major `d x sq` with ldc = h·d: `m = d`,
//!   `n = sq`, `k = sk`; A is V read as `d x sk` (lda = ldv, `OP_N`), B is P read as `sk x sq`
//!   (ldb = sk, `OP_N`). Element (c, i) of C lands at `i·h·d + c`: O[i][h][c].
//!
//! cuBLAS wants each leading dimension at least the row count of the column-major matrix it
//! describes (d, d and sk; d, sk and d), hence the sequence-stride check; a sequence of length 1
//! is never stepped over and is given ld = d.
use super::launch::{Launch, launch};
use super::{BACKEND, broadcast_operand, check_limits, check_operands};
use crate::attention::{Forward, Saved};
use crate::cpu::lse_shape;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::problem::{Dims, Problem};
use crate::tensor::Tensor;
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use dmattn_abi::{DeviceElem, SOFTMAX_ROWS_SMEM_BYTES, SOFTMAX_ROWS_THREADS, SoftmaxRowsParams};
use half::{bf16, f16};
use std::marker::PhantomData;
use std::sync::Arc;

pub(crate) fn forward(dev: &CudaDevice, p: Problem, saved: Saved) -> Result<Forward> {
    let d = p.dims;
    let elem = check_operands(&p, &saved)?;
    check_limits(&d, 0)?;
    let (q, k, v) = (Rows::of(&saved.q, "q")?, Rows::of(&saved.k, "k")?, Rows::of(&saved.v, "v")?);
    let device = saved.q.device();
    let scores_shape = [d.batch, d.heads, d.seqlen_q, d.seqlen_k];
    if scores_shape.iter().try_fold(p.dtype.size_in_bytes(), |bytes, &n| bytes.checked_mul(n)).is_none() {
        return Err(Error::Unsupported { what: format!("a score matrix of {scores_shape:?} (more bytes than an address reaches)"), backend: BACKEND });
    }
    // An S the device cannot hold fails here, as a typed driver error (out of memory).
    let scores = Tensor::empty(&scores_shape, p.dtype, &device)?;
    let out = Tensor::empty(saved.q.shape(), p.dtype, &device)?;
    let lse = Tensor::empty(&lse_shape(&p), DType::F32, &device)?;
    let o = Rows::of(&out, "out")?;
    // cuBLAS runs on the calling thread's current context.
    dev.context().bind_to_thread()?;
    let blas = dev.blas()?;
    let heads = HeadBatches::new(&d);
    let (q_step, kv_step) = heads.step();
    let (s_head, count) = (d.seqlen_q * d.seqlen_k, heads.count());
    // The scores of one call: its first query head's `sq x sk` block, then one block per step.
    let s_at = |batch: usize, h0: usize| Operand { tensor: &scores, offset: (batch * d.heads + h0) * s_head, ld: d.seqlen_k, step: q_step * s_head };

    // Sᵀ = K Qᵀ (see the module doc).
    for (batch, h0, kvh0) in heads.calls(&d) {
        let (a, b, c) = (k.at(batch, kvh0, kv_step), q.at(batch, h0, q_step), s_at(batch, h0));
        gemm(dev, blas, elem, Product { transa: true, m: d.seqlen_k, n: d.seqlen_q, k: d.head_dim, a, b, c, count })?;
    }

    let mut params = SoftmaxRowsParams {
        s: scores.device_ptr().expect("CUDA tensor"),
        lse: lse.device_ptr().expect("CUDA tensor"),
        heads: d.heads as u32,
        mask_head_div: 1,
        bias_head_div: 1,
        seqlen_q: d.seqlen_q as u32,
        seqlen_k: d.seqlen_k as u32,
        scale: p.scale as f32,
        softcap: p.softcap as f32,
        band: p.band,
        ..SoftmaxRowsParams::default()
    };
    if let Some(m) = super::device_mask(&saved) {
        (params.block_map, params.mask_bits, params.mask_head_div) = (m.classes, m.bits, super::head_div(&d, m.planes[1]));
    }
    if let Some(bias) = &saved.bias {
        (params.bias, params.bias_head_div) = broadcast_operand(&d, bias);
    }
    let name = format!("{}{}", dmattn_abi::names::SOFTMAX_ROWS_PREFIX, elem.name());
    let grid = (d.seqlen_q as u32, d.heads as u32, d.batch as u32);
    launch(dev, &Launch::kernel(&name, grid, SOFTMAX_ROWS_THREADS, SOFTMAX_ROWS_SMEM_BYTES), params)?;

    // Oᵀ = Vᵀ Pᵀ, P in place of S.
    for (batch, h0, kvh0) in heads.calls(&d) {
        let (a, b, c) = (v.at(batch, kvh0, kv_step), s_at(batch, h0), o.at(batch, h0, q_step));
        gemm(dev, blas, elem, Product { transa: false, m: d.head_dim, n: d.seqlen_q, k: d.seqlen_k, a, b, c, count })?;
    }
    // `scores` is freed in stream order, after the product that reads it.
    Ok(Forward { out, lse, problem: p, saved })
}

/// How one batch's query heads are covered by strided-batched products without copying K or V
/// (query head `kvh · group + g` reads kv head `kvh`): one call per kv head over its `group`
/// query heads, K/V batch stride 0 (`by_group`), or one call per `g` over the `kv_heads` query
/// heads `g, g + group, …`, K/V batch stride one kv head; whichever makes fewer calls (one call
/// per batch for MHA and for MQA).
struct HeadBatches {
    by_group: bool,
    group: usize,
    kv_heads: usize,
}

impl HeadBatches {
    fn new(d: &Dims) -> Self {
        HeadBatches { by_group: d.kv_group() >= d.kv_heads, group: d.kv_group(), kv_heads: d.kv_heads }
    }

    /// `(batch, first query head, first kv head)` of every call.
    fn calls(&self, d: &Dims) -> impl Iterator<Item = (usize, usize, usize)> {
        let (by_group, group, n) = (self.by_group, self.group, if self.by_group { self.kv_heads } else { self.group });
        (0..d.batch).flat_map(move |b| (0..n).map(move |c| if by_group { (b, c * group, c) } else { (b, c, 0) }))
    }

    /// Batch entries per call.
    fn count(&self) -> usize {
        if self.by_group { self.group } else { self.kv_heads }
    }

    /// (query heads, kv heads) from one batch entry of a call to the next.
    fn step(&self) -> (usize, usize) {
        if self.by_group { (1, 0) } else { (self.group, 1) }
    }
}

/// A `[b, s, heads, d]` tensor as one row-major `s x d` matrix per (batch, head).
struct Rows<'a> {
    tensor: &'a Tensor,
    /// Element strides of batch and head (0 where that dimension has size 1).
    batch_stride: usize,
    head_stride: usize,
    /// Row stride, as cuBLAS's leading dimension.
    ld: usize,
}

impl<'a> Rows<'a> {
    fn of(tensor: &'a Tensor, arg: &'static str) -> Result<Self> {
        let (shape, strides) = (tensor.shape(), tensor.strides());
        let (seqlen, head_dim) = (shape[1], shape[3]);
        let layout_err = |reason: String| Error::Layout { arg, backend: "cuBLAS", reason };
        if head_dim > 1 && strides[3] != 1 {
            return Err(layout_err(format!("head_dim stride is {}, must be 1", strides[3])));
        }
        let ld = if seqlen > 1 { strides[1] } else { head_dim };
        if ld < head_dim || i32::try_from(ld).is_err() {
            return Err(layout_err(format!("sequence stride {ld} is not in head_dim {head_dim} ..= 2^31 - 1 (rows must not overlap)")));
        }
        // Size-1 dimensions are never stepped over, so their strides do not matter.
        let stride = |dim: usize| if shape[dim] == 1 { 0 } else { strides[dim] };
        Ok(Rows { tensor, batch_stride: stride(0), head_stride: stride(2), ld })
    }

    /// The matrix of (`batch`, `head`), then one every `head_step` heads.
    fn at(&self, batch: usize, head: usize, head_step: usize) -> Operand<'a> {
        let offset = batch * self.batch_stride + head * self.head_stride;
        Operand { tensor: self.tensor, offset, ld: self.ld, step: head_step * self.head_stride }
    }
}

/// One matrix operand of a strided-batched product: `tensor`'s elements from `offset` on (the
/// first batch entry), leading dimension `ld`, `step` elements from one entry to the next.
struct Operand<'a> {
    tensor: &'a Tensor,
    offset: usize,
    ld: usize,
    step: usize,
}

/// `C = op(A) B` for `count` batch entries, all operands column-major as cuBLAS reads them;
/// `op` transposes A when `transa`.
struct Product<'a> {
    transa: bool,
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'a>,
    b: Operand<'a>,
    c: Operand<'a>,
    count: usize,
}

fn gemm(dev: &CudaDevice, blas: &CudaBlas, elem: DeviceElem, x: Product) -> Result<()> {
    match elem {
        DeviceElem::F16 => gemm_typed(dev, blas, x, f16::ONE, f16::ZERO),
        DeviceElem::Bf16 => gemm_typed(dev, blas, x, bf16::ONE, bf16::ZERO),
    }
}

/// cudarc's half-type `Gemm`: `T` inputs and output, f32 accumulation.
fn gemm_typed<T>(dev: &CudaDevice, blas: &CudaBlas, x: Product, one: T, zero: T) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    let int = |n: usize, what: &str| {
        i32::try_from(n).map_err(|_| Error::Unsupported { what: format!("{what} {n} (cuBLAS takes 32-bit sizes)"), backend: BACKEND })
    };
    let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
    let cfg = StridedBatchedConfig {
        gemm: GemmConfig {
            transa: op(x.transa),
            transb: op(false),
            m: int(x.m, "a matrix dimension")?,
            n: int(x.n, "a matrix dimension")?,
            k: int(x.k, "a matrix dimension")?,
            alpha: one,
            lda: int(x.a.ld, "a leading dimension")?,
            ldb: int(x.b.ld, "a leading dimension")?,
            beta: zero,
            ldc: int(x.c.ld, "a leading dimension")?,
        },
        batch_size: int(x.count, "a batch count")?,
        stride_a: x.a.step as i64,
        stride_b: x.b.step as i64,
        stride_c: x.c.step as i64,
    };
    let stream = dev.stream();
    let (a, b, mut c) = (Address::<T>::of(&x.a, stream), Address::of(&x.b, stream), Address::of(&x.c, stream));
    // Safety: the operands are live tensors (q/k/v, and S/P and O allocated for this call) whose
    // shapes and strides bound every element the product reads or writes (see the module doc);
    // the work is queued on the stream every other use of them is ordered on.
    unsafe { blas.gemm_strided_batched(cfg, &a, &b, &mut c)? };
    Ok(())
}

/// A device address as cudarc's `Gemm` takes its operands. Tensors are byte storage read at an
/// offset, so this carries the address and the elements left in the storage from there. Nothing
/// is recorded or waited on: all work is on the device's one stream and event tracking is off.
struct Address<T> {
    ptr: CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _elem: PhantomData<T>,
}

impl<T> Address<T> {
    fn of(x: &Operand, stream: &Arc<CudaStream>) -> Self {
        let elem_bytes = x.tensor.dtype().size_in_bytes();
        let ptr = x.tensor.device_ptr().expect("CUDA tensor") + (x.offset * elem_bytes) as u64;
        let len = x.tensor.storage_len() - x.tensor.layout().offset - x.offset;
        Address { ptr, len, stream: stream.clone(), _elem: PhantomData }
    }
}

impl<T> DeviceSlice<T> for Address<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for Address<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for Address<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}
