//! dmattn over a caller's memory, context and stream: tensors wrapping cudarc buffers (strided,
//! with poisoned padding the kernels must neither read nor write), caller-provided outputs and
//! gradients, work ordered on the caller's stream without a host synchronisation, and forward +
//! backward captured into a CUDA graph and replayed. Every result is compared bit for bit with
//! dmattn's own tensors on its own stream (deterministic backward). Skips without a CUDA device.
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, sys};
use dmattn::{CudaDevice, DType, Device, Element, GradientBuffers, Tensor};
use dmattn_tests::*;
use half::{bf16, f16};
use proptest::prelude::*;
use rand::Rng;
use std::sync::Arc;

/// A caller as a framework is one: its own handle on the device's primary context (cudarc's
/// defaults: event tracking on), its own stream, dmattn on that stream.
struct Caller {
    stream: Arc<CudaStream>,
    dev: CudaDevice,
}

fn caller() -> Option<Caller> {
    gpu()?;
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let dev = CudaDevice::from_stream(stream.clone()).unwrap();
    Some(Caller { stream, dev })
}

/// A value whose bits the kernels never write and must never read: NaN (true for masks).
trait Junk: Element + DeviceRepr {
    const JUNK: Self;
}
impl Junk for bf16 {
    const JUNK: Self = bf16::NAN;
}
impl Junk for f16 {
    const JUNK: Self = f16::NAN;
}
impl Junk for f32 {
    const JUNK: Self = f32::NAN;
}
impl Junk for bool {
    const JUNK: Self = true;
}

/// How a caller's buffer holds a `[b, s, h, d]` tensor.
#[derive(Clone, Copy, PartialEq)]
enum Holding {
    Contiguous,
    /// One junk head before the `h` real ones in every row: head stride d, row stride (h+1)·d,
    /// offset d.
    PaddedHeads,
}

fn wrap<T: Junk>(c: &Caller, data: Vec<T>, shape: &[usize], holding: Holding) -> Tensor {
    if holding == Holding::Contiguous {
        return Tensor::from_cuda_slice(c.stream.clone_htod(&data).unwrap(), shape, &c.dev).unwrap();
    }
    let [b, s, h, d] = <[usize; 4]>::try_from(shape).unwrap();
    let padded: Vec<T> = data.chunks(h * d).flat_map(|row| std::iter::repeat_n(T::JUNK, d).chain(row.iter().copied())).collect();
    let slice: CudaSlice<T> = c.stream.clone_htod(&padded).unwrap();
    let full = Tensor::from_cuda_slice(slice, &[b, s, h + 1, d], &c.dev).unwrap();
    full.as_strided(shape, &[s * (h + 1) * d, (h + 1) * d, d, 1], d).unwrap()
}

/// `host` (a CPU tensor) copied into a caller's buffer held as `holding`.
fn caller_copy(c: &Caller, host: &Tensor, holding: Holding) -> Tensor {
    match host.dtype() {
        DType::BF16 => wrap::<bf16>(c, host.to_vec().unwrap(), host.shape(), holding),
        DType::F16 => wrap::<f16>(c, host.to_vec().unwrap(), host.shape(), holding),
        DType::F32 => wrap::<f32>(c, host.to_vec().unwrap(), host.shape(), holding),
        DType::Bool => wrap::<bool>(c, host.to_vec().unwrap(), host.shape(), holding),
        other => panic!("no GPU {other:?}"),
    }
}

/// A caller's buffer of junk for an output of `shape` and `dtype`.
fn caller_junk(c: &Caller, shape: &[usize], dtype: DType, holding: Holding) -> Tensor {
    let n = shape.iter().product();
    match dtype {
        DType::BF16 => wrap(c, vec![bf16::NAN; n], shape, holding),
        DType::F16 => wrap(c, vec![f16::NAN; n], shape, holding),
        DType::F32 => wrap(c, vec![f32::NAN; n], shape, holding),
        other => panic!("no GPU output of {other:?}"),
    }
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

/// Every element of the storage behind a padded-heads view other than the view's own: still junk.
fn padding_untouched(view: &Tensor) -> bool {
    let [b, s, h, d] = <[usize; 4]>::try_from(view.shape()).unwrap();
    let full = view.as_strided(&[b, s, h + 1, d], &[s * (h + 1) * d, (h + 1) * d, d, 1], 0).unwrap();
    values(&full).chunks((h + 1) * d).all(|row| row[..d].iter().all(|x| x.is_nan()))
}

/// The inputs of a case as the caller holds them: q, k, v with padded heads, mask and bias as
/// their (broadcast) shapes.
fn caller_inputs(c: &Caller, host: &Inputs) -> Inputs {
    Inputs {
        q: caller_copy(c, &host.q, Holding::PaddedHeads),
        k: caller_copy(c, &host.k, Holding::PaddedHeads),
        v: caller_copy(c, &host.v, Holding::PaddedHeads),
        mask: host.mask.as_ref().map(|m| caller_copy(c, m, Holding::Contiguous)),
        bias: host.bias.as_ref().map(|b| caller_copy(c, b, Holding::Contiguous)),
    }
}

/// Outputs and gradients (out, lse, dq, dk, dv, dbias) as f64 values.
type Results = Vec<Vec<f64>>;

/// dmattn's own tensors on its own stream: the reference each caller-side run must equal.
fn own_results(case: &Case, host: &Inputs, dout: &Tensor, gpu: &Device) -> Results {
    let on = host.to(gpu);
    let fwd = case.call(&on).deterministic(true).forward().unwrap();
    let g = fwd.backward(&dout.to_device(gpu).unwrap()).unwrap();
    let mut r = vec![values(&fwd.out), values(&fwd.lse), values(&g.dq), values(&g.dk), values(&g.dv)];
    r.extend(g.dbias.as_ref().map(values));
    r
}

/// The caller's output and gradient buffers for `case`, all junk.
struct Buffers {
    out: Tensor,
    lse: Tensor,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    dbias: Option<Tensor>,
}

impl Buffers {
    fn new(c: &Caller, case: &Case) -> Self {
        let (q, kv) = (case.q_shape(), case.kv_shape());
        Buffers {
            out: caller_junk(c, &q, case.dtype, Holding::PaddedHeads),
            lse: caller_junk(c, &[case.batch, case.heads, case.seqlen_q], DType::F32, Holding::Contiguous),
            dq: caller_junk(c, &q, case.dtype, Holding::Contiguous),
            dk: caller_junk(c, &kv, case.dtype, Holding::PaddedHeads),
            dv: caller_junk(c, &kv, case.dtype, Holding::PaddedHeads),
            dbias: case.bias.map(|s| caller_junk(c, &s, case.dtype, Holding::Contiguous)),
        }
    }

    fn grads(&self) -> GradientBuffers<'_> {
        GradientBuffers { dq: Some(&self.dq), dk: Some(&self.dk), dv: Some(&self.dv), dbias: self.dbias.as_ref() }
    }

    /// Forward and backward of `case` over the caller's `inputs` into these buffers, queued on
    /// the caller's stream; nothing waits for it.
    fn run(&self, case: &Case, inputs: &Inputs, dout: &Tensor) -> dmattn::Result<()> {
        self.run_with(case, inputs, dout, true)
    }

    fn run_with(&self, case: &Case, inputs: &Inputs, dout: &Tensor, deterministic: bool) -> dmattn::Result<()> {
        let fwd = case.call(inputs).deterministic(deterministic).out(&self.out).lse(&self.lse).forward()?;
        fwd.backward_into(dout, self.grads())?;
        Ok(())
    }

    fn results(&self) -> Results {
        let mut r = vec![values(&self.out), values(&self.lse), values(&self.dq), values(&self.dk), values(&self.dv)];
        r.extend(self.dbias.as_ref().map(values));
        r
    }
}

const NAMES: [&str; 6] = ["out", "lse", "dq", "dk", "dv", "dbias"];

fn same_bits(got: &Results, want: &Results) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} results, expected {}", got.len(), want.len()));
    }
    for ((g, w), name) in got.iter().zip(want).zip(NAMES) {
        if let Some(i) = (0..w.len()).find(|&i| g[i] != w[i] && !(g[i].is_nan() && w[i].is_nan())) {
            return Err(format!("{name}[{i}] = {} where dmattn's own tensors give {}", g[i], w[i]));
        }
    }
    Ok(())
}

/// Random cases over every axis the kernels branch on: the caller's strided buffers and
/// provided outputs give dmattn's own results bit for bit, and the padding stays junk.
#[test]
fn callers_buffers_and_stream_give_own_results() {
    let (Some(gpu), Some(c)) = (gpu(), caller()) else { return };
    gpu_property(300, 300, |(case, seed)| {
        let host = case.inputs(&mut seeded_rng(seed));
        let dout = gpu_dout(&case, seed ^ 0x5EED);
        let want = own_results(&case, &host, &dout, &gpu);
        let inputs = caller_inputs(&c, &host);
        let bufs = Buffers::new(&c, &case);
        bufs.run(&case, &inputs, &caller_copy(&c, &dout, Holding::Contiguous)).map_err(|e| TestCaseError::fail(format!("{e} for {case:?}")))?;
        same_bits(&bufs.results(), &want).map_err(|e| TestCaseError::fail(format!("{e} for {case:?}")))?;
        for (name, t) in [("q", &inputs.q), ("out", &bufs.out), ("dk", &bufs.dk), ("dv", &bufs.dv)] {
            prop_assert!(padding_untouched(t), "{name}: the padding between heads changed for {case:?}");
        }
        Ok(())
    });
}

/// A case with every step of a call: mask preparation, the forward's and (default mode) the
/// backward's work-order passes and kv-heads-first placement (more CTAs than an H100 has SMs, a
/// bias shared by the heads), GQA, causal; a decode case that splits the keys and combines; and
/// a lean one (no modifiers), whose Hopper forward copies through tensor maps.
fn pipeline_cases() -> [Case; 3] {
    let train = Case {
        dtype: DType::BF16,
        mask: Some([2, 8, 2048, 2048]),
        mask_pattern: MaskPattern::Blocks(0.5),
        bias: Some([1, 1, 2048, 2048]),
        causal: true,
        ..Case::new(2, 2048, 2048, 16, 8, 64)
    };
    let decode = Case { dtype: DType::BF16, mask: Some([1, 1, 1, 16384]), bias: Some([1, 2, 1, 16384]), ..Case::new(1, 1, 16384, 4, 2, 128) };
    // No modifiers, fixed length, d128: on Hopper the lean forward, its producer on the bulk
    // tensor copy engine through tensor maps written by a kernel of the call (were the maps a copy
    // from host memory, a replay would read what the freed memory holds; the modifier kernel,
    // which the call took under capture until 2026-11-28, gives other bits at d128).
    let lean = Case { dtype: DType::BF16, causal: true, ..Case::new(2, 1024, 1024, 8, 2, 128) };
    [train, decode, lean]
}

/// Copies `src`'s buffer over `dst`'s (both caller buffers of one layout: contiguous, or
/// padded heads copied whole with their padding), queued on the caller's stream.
fn overwrite(c: &Caller, dst: &Tensor, src: &Tensor) {
    assert_eq!((dst.layout(), dst.dtype()), (src.layout(), src.dtype()), "overwrite copies between equal layouts");
    let l = src.layout();
    // From the first element to the end of the storage: the last row's padding comes first.
    let bytes = (l.strides[0] * l.shape[0] - l.offset) * src.dtype().size_in_bytes();
    let (d, s) = (dst.device_ptr().unwrap(), src.device_ptr().unwrap());
    // Safety: both are live buffers holding `bytes` bytes from their first element.
    unsafe { cudarc::driver::result::memcpy_dtod_async(d, s, bytes, c.stream.cu_stream()).unwrap() };
}

/// Work is queued on the caller's stream, after what the caller queued there, and the call
/// returns without waiting for it: with a few hundred milliseconds of copies queued ahead and q overwritten
/// behind them, the stream is still busy when forward and backward return, and the results are
/// those of the new q.
#[test]
fn calls_queue_on_the_callers_stream_without_waiting() {
    let (Some(gpu), Some(c)) = (gpu(), caller()) else { return };
    let case = &pipeline_cases()[0];
    let mut rng = fresh_rng("gpu_interop_order");
    let (first, second) = (case.inputs(&mut rng), case.inputs(&mut rng));
    let dout = gpu_dout(case, 7);
    let want = own_results(case, &Inputs { q: second.q.clone(), ..first.to(&Device::Cpu) }, &dout, &gpu);
    let inputs = caller_inputs(&c, &first);
    let new_q = caller_copy(&c, &second.q, Holding::PaddedHeads);
    let dout = caller_copy(&c, &dout, Holding::Contiguous);
    let bufs = Buffers::new(&c, case);
    c.stream.synchronize().unwrap();

    // A few hundred milliseconds of copies on the caller's stream, then the new q.
    let (a, mut b) = (c.stream.alloc_zeros::<u8>(1 << 30).unwrap(), c.stream.alloc_zeros::<u8>(1 << 30).unwrap());
    for _ in 0..300 {
        c.stream.memcpy_dtod(&a, &mut b).unwrap();
    }
    overwrite(&c, &inputs.q, &new_q);
    bufs.run(case, &inputs, &dout).unwrap();
    // Safety: a live stream of the bound context.
    let status = unsafe { sys::cuStreamQuery(c.stream.cu_stream()) };
    assert_eq!(status, sys::CUresult::CUDA_ERROR_NOT_READY, "the stream was idle when the calls returned: something waited");
    same_bits(&bufs.results(), &want).unwrap();
}

/// Outputs bit for bit; gradients, whose additions a default-mode backward makes in any order,
/// within the GPU tolerance of bf16 (a replay over stale inputs or missing work errs by O(1)).
/// Measured on the result, not on the size of its sums as `check_gpu_backward` does, so the
/// bound leaves room for cancellation: the decode case's dq (16K keys summed) erred by 4e-3.
fn same_up_to_addition_order(got: &Results, want: &Results) -> Result<(), String> {
    same_bits(&got[..2].to_vec(), &want[..2].to_vec())?;
    for ((g, w), name) in got[2..].iter().zip(&want[2..]).zip(&NAMES[2..]) {
        let err = rel_err(g, w);
        if !(g.iter().all(|x| x.is_finite()) && err <= gpu_tolerance(DType::BF16)) {
            return Err(format!("{name}: rel err {err:.2e} against dmattn's own deterministic run"));
        }
    }
    Ok(())
}

/// Forward and backward captured into a CUDA graph on the caller's stream (mask preparation and
/// work-order passes included, the Forward dropped inside the capture so that its temporary
/// buffers are freed by the graph), then replayed on fresh inputs written into the same
/// buffers: each replay equals dmattn's own eager results on those inputs, bit for bit in
/// deterministic mode (the default mode's backward adds in any order, and places its CTAs by a
/// work-order pass of its own).
#[test]
fn graph_replays_equal_eager_calls() {
    let (Some(gpu), Some(c)) = (gpu(), caller()) else { return };
    let mut rng = fresh_rng("gpu_interop_graph");
    for (case, deterministic) in pipeline_cases().into_iter().flat_map(|c| [(c.clone(), true), (c, false)]) {
        let host = case.inputs(&mut rng);
        let inputs = caller_inputs(&c, &host);
        let dout_host = gpu_dout(&case, 11);
        let dout = caller_copy(&c, &dout_host, Holding::Contiguous);
        let bufs = Buffers::new(&c, &case);
        // Eager first: the functions are loaded and cleared for their shared memory outside
        // the capture.
        let check = if deterministic { same_bits } else { same_up_to_addition_order };
        bufs.run_with(&case, &inputs, &dout, deterministic).unwrap();
        check(&bufs.results(), &own_results(&case, &host, &dout_host, &gpu)).unwrap();

        c.stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        let captured = bufs.run_with(&case, &inputs, &dout, deterministic);
        let graph = c.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        captured.unwrap();
        let graph = graph.unwrap().expect("the capture recorded work");
        for replay in 0..3 {
            let fresh = case.inputs(&mut rng);
            let fresh_dout = gpu_dout(&case, 100 + replay);
            let staged = caller_inputs(&c, &fresh);
            for (dst, src) in [(&inputs.q, &staged.q), (&inputs.k, &staged.k), (&inputs.v, &staged.v)] {
                overwrite(&c, dst, src);
            }
            for (dst, src) in [(&inputs.mask, &staged.mask), (&inputs.bias, &staged.bias)] {
                if let (Some(dst), Some(src)) = (dst, src) {
                    overwrite(&c, dst, src);
                }
            }
            overwrite(&c, &dout, &caller_copy(&c, &fresh_dout, Holding::Contiguous));
            graph.launch().unwrap();
            let want = own_results(&case, &fresh, &fresh_dout, &gpu);
            check(&bufs.results(), &want).unwrap_or_else(|e| panic!("replay {replay} of {case:?} (deterministic: {deterministic}): {e}"));
        }
    }
}

/// Bad caller buffers get a typed error naming the argument, before anything is queued: every
/// buffer of the call is still junk afterwards. On the CPU, caller buffers are not taken.
#[test]
fn bad_buffers_are_rejected_before_any_work() {
    let cpu = Case { dtype: DType::F32, bias: Some([1, 2, 1, 40]), ..Case::new(1, 20, 40, 2, 1, 32) };
    let host = cpu.inputs(&mut fresh_rng("gpu_interop_bad_cpu"));
    let out = Tensor::from_fn(&cpu.q_shape(), DType::F32, &Device::Cpu, |_| 0.0).unwrap();
    let r = cpu.call(&host).out(&out).forward();
    assert!(matches!(r, Err(dmattn::Error::Unsupported { .. })), "a CPU out buffer: {:?}", r.err());

    let Some(c) = caller() else { return };
    let case = Case { dtype: DType::BF16, bias: Some([1, 2, 1, 256]), ..Case::new(1, 128, 256, 4, 2, 64) };
    let host = case.inputs(&mut fresh_rng("gpu_interop_bad"));
    let inputs = caller_inputs(&c, &host);
    let bufs = Buffers::new(&c, &case);
    let arg = |r: dmattn::Result<dmattn::Forward>| match r {
        Err(e @ (dmattn::Error::Shape { .. } | dmattn::Error::DType { .. } | dmattn::Error::Layout { .. } | dmattn::Error::Param { .. })) => e.to_string(),
        other => panic!("expected a typed error, got {:?}", other.map(|_| "a result")),
    };
    let wrong_shape = caller_junk(&c, &[1, 128, 4, 32], DType::BF16, Holding::Contiguous);
    assert!(arg(case.call(&inputs).out(&wrong_shape).forward()).contains("`out`"));
    let wrong_dtype = caller_junk(&c, &case.q_shape(), DType::F32, Holding::Contiguous);
    assert!(arg(case.call(&inputs).out(&wrong_dtype).forward()).contains("`out`"));
    let strided_lse = caller_junk(&c, &[1, 4, 128, 2], DType::F32, Holding::Contiguous).as_strided(&[1, 4, 128], &[1024, 256, 2], 0).unwrap();
    assert!(arg(case.call(&inputs).lse(&strided_lse).forward()).contains("`lse`"));
    // Writing O over q: the overlap is found through q's padded view.
    let over_q = inputs.q.clone();
    assert!(arg(case.call(&inputs).out(&over_q).forward()).contains("overlaps `q`"));
    let fwd = case.call(&inputs).forward().unwrap();
    let dout = caller_copy(&c, &gpu_dout(&case, 3), Holding::Contiguous);
    let over_dout = GradientBuffers { dq: Some(&dout), ..bufs.grads() };
    let e = fwd.backward_into(&dout, over_dout).err().expect("dq over dout is rejected").to_string();
    assert!(e.contains("`dq`") && e.contains("overlaps `dout`"), "{e}");
    let no_bias = case.call(&Inputs { bias: None, ..caller_inputs(&c, &host) }).forward().unwrap();
    let e = no_bias.backward_into(&dout, bufs.grads()).err().expect("dbias without a bias is rejected").to_string();
    assert!(e.contains("`dbias`"), "{e}");
    // A tensor of dmattn's own stream does not meet the caller's stream in one call.
    let own_k = host.k.to_device(&gpu().unwrap()).unwrap();
    let r = dmattn::attention(&inputs.q, &own_k, &inputs.v).forward();
    assert!(matches!(&r, Err(dmattn::Error::Device { arg: "k", .. })), "k on another stream: {:?}", r.err());
    for (name, t) in [("out", &bufs.out), ("lse", &bufs.lse), ("dq", &bufs.dq), ("dk", &bufs.dk), ("dv", &bufs.dv)] {
        assert!(values(t).iter().all(|x| x.is_nan()), "{name} was written by a rejected call");
    }
}

/// A packed batch's forward (softcap: the modifier kernel, which runs a batch of more than a wave
/// in the order its lengths give) captured on `SeqLens` whose work order is not built yet, then
/// replayed on fresh inputs: each replay equals dmattn's eager call on its own stream bit for bit.
/// Under capture the order is not built (a graph would copy it from host memory the call frees,
/// and the `SeqLens` would keep an allocation the graph owns): the grid's order runs instead.
#[test]
fn graph_replays_of_a_packed_batch() {
    let (Some(gpu), Some(c)) = (gpu(), caller()) else { return };
    let mut rng = fresh_rng("gpu_interop_packed_graph");
    let (lens_q, lens_k) = ([100, 3000, 0, 517], [100, 3000, 7, 2000]);
    let (heads, kv_heads, head_dim) = (8, 2, 64);
    let (total_q, total_k) = (lens_q.iter().sum::<usize>(), lens_k.iter().sum::<usize>());
    let shapes = [[total_q, heads, head_dim], [total_k, kv_heads, head_dim], [total_k, kv_heads, head_dim]];
    let mut draw = || -> Vec<Tensor> {
        let mut tensor = |s: &[usize; 3]| {
            let vals: Vec<f64> = (0..s.iter().product()).map(|_| 4.0 * (rng.random::<f64>() - 0.5)).collect();
            Tensor::from_fn(s, DType::BF16, &Device::Cpu, |i| vals[i]).unwrap()
        };
        shapes.iter().map(&mut tensor).collect()
    };
    let eager = |host: &[Tensor]| {
        let on: Vec<Tensor> = host.iter().map(|t| t.to_device(&gpu).unwrap()).collect();
        let seqs = dmattn::SeqLens::from_lengths(&lens_q, &lens_k, &gpu).unwrap();
        let fwd = dmattn::attention(&on[0], &on[1], &on[2]).seqlens(&seqs).causal(true).softcap(30.0).forward().unwrap();
        vec![values(&fwd.out), values(&fwd.lse)]
    };

    let host = draw();
    let inputs: Vec<Tensor> = host.iter().map(|t| caller_copy(&c, t, Holding::Contiguous)).collect();
    let out = caller_junk(&c, &shapes[0], DType::BF16, Holding::Contiguous);
    let lse = caller_junk(&c, &[heads, total_q], DType::F32, Holding::Contiguous);
    let seqs = dmattn::SeqLens::from_lengths(&lens_q, &lens_k, &Device::Cuda(c.dev.clone())).unwrap();
    let forward = || dmattn::attention(&inputs[0], &inputs[1], &inputs[2]).seqlens(&seqs).causal(true).softcap(30.0).out(&out).lse(&lse).forward().map(drop);
    // Captured before any eager call on `seqs` (no order yet), then again after one (the graph
    // reads the order `seqs` keeps).
    for pass in ["before an eager call", "after an eager call"] {
        c.stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        let captured = forward();
        let graph = c.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        captured.unwrap();
        let graph = graph.unwrap().expect("the capture recorded work");
        for replay in 0..3 {
            let fresh = if replay == 0 { host.clone() } else { draw() };
            for (dst, src) in inputs.iter().zip(&fresh) {
                overwrite(&c, dst, &caller_copy(&c, src, Holding::Contiguous));
            }
            graph.launch().unwrap();
            same_bits(&vec![values(&out), values(&lse)], &eager(&fresh)).unwrap_or_else(|e| panic!("replay {replay} of the capture {pass}: {e}"));
        }
        forward().unwrap();
    }
}
