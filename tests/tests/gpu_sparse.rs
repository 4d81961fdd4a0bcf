//! The sparse-mask API on the GPU against the f64 CPU reference run with the equivalent dense
//! mask (built by `dmattn_tests::sparse` from the documented rules): property tests over random
//! masks of every form (windows from 0 to beyond every key, sinks, compressed causal with cf 1,
//! 2, 4 and 64, dense and bit-packed score masks, block bitsets, dense masks rounded to blocks,
//! BCSR with empty rows, and their combinations), their tensors on the GPU, with 16-bit dtypes,
//! every head dim, GQA, odd lengths, causal, softcap and bias of any broadcast shape: the forward
//! (O, LSE with its -inf rows), the backward (dq, dk, dv, dbias), the deterministic backward,
//! and the materialising path. Also: bit-identical deterministic gradients, one prepared mask
//! serving several calls (and a parametric one prepared on the CPU), the persistent lean forward
//! through a few CTAs, split-KV decoding with a
//! window and sinks, long sequences, `estimated_speedup` and `memory_bytes`, and the errors
//! only a GPU shows. `DMATTN_GPU_CASES` sets the property tests' case counts. Skips, saying why,
//! where there is no CUDA device.
use dmattn::{DType, Device, Error, PreparedMask, SparseMask, Tensor, attention};
use dmattn_tests::sparse::{
    BandCtor, DataPart, Kind, MaskSpec, SparseCase, check_gpu_prepared, check_gpu_sparse, gpu_band_cases, gpu_sparse_cases, random_bcsr, random_part, random_spec,
};
use dmattn_tests::*;
use proptest::test_runner::TestCaseError;
use rand::Rng;

/// Checks `property` on [`gpu_sparse_cases`]`(max_seqlen)` with a [`gpu_runner`]`(cases)`,
/// panicking with proptest's report (the minimal failing case) if it fails.
fn sparse_property(cases: u32, max_seqlen: usize, property: impl Fn(SparseCase) -> Result<(), TestCaseError>) {
    if let Err(e) = gpu_runner(cases).run(&gpu_sparse_cases(max_seqlen), property) {
        panic!("{e}");
    }
}

#[test]
fn sparse_forward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    sparse_property(1200, 300, |sc| check_gpu_sparse(&sc, &gpu, ForwardPath::Fused, false, false));
}

/// Lean calls (a band, compressed causal or no mask; no bias or softcap) at d64 and d128, up to
/// 600 queries and keys, through 1 to 5 CTAs: on Hopper at d128 the persistent lean forward, each
/// CTA taking many query tiles in turn (its Q slots and K/V ring turning over across them, tiles
/// that see no key among them), in the order a counter hands out; at d64 a CTA a query tile.
#[test]
fn persistent_lean_forward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let result = gpu_runner(2000).run(&gpu_band_cases(600), |sc| {
        let head_dim = if sc.seed % 2 == 0 { 64 } else { 128 };
        let sc = SparseCase { case: Case { head_dim, ..sc.case }, ..sc };
        dmattn::force_forward_persistent_ctas(Some(1 + (sc.seed >> 1) as u32 % 5));
        let checked = check_gpu_sparse(&sc, &gpu, ForwardPath::Fused, false, false);
        dmattn::force_forward_persistent_ctas(None);
        checked
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn sparse_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    sparse_property(800, 300, |sc| check_gpu_sparse(&sc, &gpu, ForwardPath::Fused, true, false));
}

/// Sparse masks over query tiles split among several CTAs per key tile (forced: 2-16 shares, at
/// the head dims that split, see `split_head_dim`): windows, compressed causal and block lists bound each key tile's
/// query tiles before they are shared.
#[test]
fn sparse_split_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    sparse_property(500, 300, |sc| {
        let sc = SparseCase { case: split_head_dim(sc.case, sc.seed), ..sc };
        with_backward_forced(Some(1 + (sc.seed % 4) as u32), None, || check_gpu_sparse(&sc, &gpu, ForwardPath::Fused, true, false))
    });
}

/// Every case placed wherever its variant may be (`force_backward_placement`): the lean variant
/// under a causal or compressed-causal band runs kv heads first (a swapped grid).
#[test]
fn sparse_placed_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    sparse_property(500, 300, |sc| {
        with_backward_forced(None, Some(true), || check_gpu_sparse(&sc, &gpu, ForwardPath::Fused, true, false))
    });
}

#[test]
fn sparse_deterministic_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    sparse_property(150, 200, |sc| check_gpu_sparse(&sc, &gpu, ForwardPath::Fused, true, true));
}

/// The materialising forward with a sparse mask (and, on every other case, the fused backward
/// from its O and LSE).
#[test]
fn sparse_materialized_matches_reference() {
    let Some(gpu) = gpu() else { return };
    sparse_property(200, 300, |sc| {
        let backward = sc.seed % 2 == 0;
        check_gpu_sparse(&sc, &gpu, ForwardPath::Materialized, backward, false)
    });
}

/// `check_gpu_prepared` for a mask given here: `case` on inputs drawn from `seed`, the mask's
/// tensors on the GPU, forward and backward.
fn check_spec(case: &Case, spec: &MaskSpec, gpu: &Device, seed: u64) {
    let sc = SparseCase { case: case.clone(), kinds: Vec::new(), seed };
    let inputs = case.inputs(&mut seeded_rng(seed));
    let prepared = spec.prepare(gpu, case.seqlen_q, case.seqlen_k).unwrap_or_else(|e| panic!("prepare {spec:?}: {e}"));
    check_gpu_prepared(&sc, spec, &prepared, &inputs, gpu, ForwardPath::Fused, true, false).unwrap();
}

/// Gradients of `case` with `mask` on `inputs` (on the GPU) given `dout`.
fn sparse_gradients(case: &Case, inputs: &Inputs, mask: &PreparedMask, dout: &Tensor, deterministic: bool) -> Grads {
    let fwd = case.call(inputs).sparse_mask(mask).deterministic(deterministic).forward().unwrap();
    grads_vec(&fwd.backward(dout).unwrap())
}

/// Two deterministic runs with a sparse mask give bit-identical gradients, on problems where
/// many CTAs add to the same dQ rows and (broadcast) dbias elements; and they match the
/// reference.
#[test]
fn sparse_deterministic_runs_are_bit_identical() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("sparse_deterministic_runs_are_bit_identical");
    let cases: [(Case, &[Kind]); 3] = [
        (Case { bias: Some([1, 1, 300, 700]), dtype: DType::BF16, ..Case::new(2, 300, 700, 4, 2, 64) }, &[Kind::Band, Kind::Bcsr(64), Kind::Dense]),
        (
            Case { bias: Some([1, 4, 1, 500]), causal: true, dtype: DType::F16, ..Case::new(2, 500, 500, 4, 4, 128) },
            &[Kind::Band, Kind::DenseBlocks(128), Kind::Packed],
        ),
        (Case { bias: Some([2, 1, 256, 64]), softcap: 15.0, dtype: DType::BF16, ..Case::new(2, 256, 64, 6, 2, 256) }, &[Kind::Compress(4), Kind::Bitset(64)]),
    ];
    for (case, kinds) in cases {
        let seed: u64 = rng.random();
        let mut r = seeded_rng(seed);
        let inputs = case.inputs(&mut r);
        let spec = random_spec(&mut r, &case, kinds);
        let prepared = spec.prepare(&gpu, case.seqlen_q, case.seqlen_k).unwrap();
        let on_gpu = inputs.to(&gpu);
        let dout = gpu_dout(&case, seed).to_device(&gpu).unwrap();
        dmattn::set_output_poisoning(true);
        let first = sparse_gradients(&case, &on_gpu, &prepared, &dout, true);
        for _ in 0..3 {
            assert_same_bits(&first, &sparse_gradients(&case, &on_gpu, &prepared, &dout, true), &(&case, &spec));
        }
        let sc = SparseCase { case: case.clone(), kinds: kinds.to_vec(), seed };
        check_gpu_prepared(&sc, &spec, &prepared, &inputs, &gpu, ForwardPath::Fused, true, true).unwrap();
    }
}

/// One prepared GPU mask serves calls with different q/k/v values, head counts (within its
/// planes), dtypes, head dims and options, before and after an earlier call's results are
/// dropped; a parametric mask prepared on the CPU serves GPU calls; and the same mask prepared
/// twice gives the same outputs.
#[test]
fn prepared_mask_serves_many_calls() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("gpu_prepared_mask_serves_many_calls");
    let (sq, sk) = (190, 260);
    let shape_case = Case::new(2, sq, sk, 4, 2, 64);
    let spec = MaskSpec::band(BandCtor::CausalWindow(70), 5).and(MaskSpec::data(random_bcsr(&mut rng, [1, 2], 64, sq, sk))).and(random_part(
        &mut rng,
        &shape_case,
        Kind::Dense,
        [2, 2],
    ));
    let prepared = spec.prepare(&gpu, sq, sk).unwrap();
    assert!(prepared.device().is_cuda());
    let cases = [
        Case { dtype: DType::BF16, ..Case::new(2, sq, sk, 4, 2, 64) },
        Case { dtype: DType::F16, bias: Some([2, 1, sq, sk]), softcap: 20.0, ..Case::new(2, sq, sk, 2, 2, 128) },
        Case { dtype: DType::BF16, causal: true, ..Case::new(2, sq, sk, 6, 2, 32) },
        Case { dtype: DType::F16, scale: Some(0.2), bias: Some([1, 1, 1, sk]), ..Case::new(2, sq, sk, 4, 2, 256) },
    ];
    for case in &cases {
        let seed: u64 = rng.random();
        let sc = SparseCase { case: case.clone(), kinds: Vec::new(), seed };
        let inputs = case.inputs(&mut seeded_rng(seed));
        check_gpu_prepared(&sc, &spec, &prepared, &inputs, &gpu, ForwardPath::Fused, true, false).unwrap();
    }
    // Two forwards alive at once over the same mask, then backwards in the other order.
    let case = &cases[0];
    let (i1, i2) = (case.inputs(&mut rng).to(&gpu), case.inputs(&mut rng).to(&gpu));
    let dout = gpu_dout(case, 3).to_device(&gpu).unwrap();
    let f1 = case.call(&i1).sparse_mask(&prepared).forward().unwrap();
    let f2 = case.call(&i2).sparse_mask(&prepared).forward().unwrap();
    let g2 = grads_vec(&f2.backward(&dout).unwrap());
    let g1 = grads_vec(&f1.backward(&dout).unwrap());
    let alone = |i: &Inputs| grads_vec(&case.call(i).sparse_mask(&prepared).deterministic(false).forward().unwrap().backward(&dout).unwrap());
    for (got, want) in [(g1, alone(&i1)), (g2, alone(&i2))] {
        // Atomic additions may round differently from run to run: only far smaller than a
        // mix-up between the calls.
        for (name, (g, w)) in ["dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
            let err = rel_err(g.as_ref().unwrap(), w.as_ref().unwrap());
            assert!(err <= 1e-2, "{name} of an interleaved call differs from the same call alone: {err:.3e}");
        }
    }
    // Prepared again: the same outputs, bit for bit.
    let again = spec.prepare(&gpu, sq, sk).unwrap();
    let a = case.call(&i1).sparse_mask(&prepared).forward().unwrap();
    let b = case.call(&i1).sparse_mask(&again).forward().unwrap();
    let bits = |t: &Tensor| t.to_f64_vec().unwrap().into_iter().map(f64::to_bits).collect::<Vec<_>>();
    assert!(bits(&a.out) == bits(&b.out) && bits(&a.lse) == bits(&b.lse), "a mask prepared twice gives different outputs");
    drop((a, b, f1, f2, again));

    // A parametric mask prepared on the CPU, used by GPU calls.
    for (ctor, sinks) in [(BandCtor::CausalWindow(40), 3), (BandCtor::Window(Some(10), Some(25)), 0), (BandCtor::CompressCausal(2), 0)] {
        let spec = MaskSpec::band(ctor, sinks);
        let on_cpu = spec.prepare(&Device::Cpu, sq, sk).unwrap();
        assert!(matches!(on_cpu.device(), Device::Cpu));
        let seed: u64 = rng.random();
        let sc = SparseCase { case: cases[1].clone(), kinds: Vec::new(), seed };
        let inputs = cases[1].inputs(&mut seeded_rng(seed));
        check_gpu_prepared(&sc, &spec, &on_cpu, &inputs, &gpu, ForwardPath::Fused, true, false).unwrap();
    }
}

/// Decoding shapes (1 to 4 query rows, up to 4000 keys, few heads): the keys are split across
/// CTAs and the partial results combined, under a sliding window with sinks (alone, with a
/// block mask or a score mask), forward and backward.
#[test]
fn split_kv_decode_with_window_and_sinks() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("split_kv_decode_with_window_and_sinks");
    // (dtype, sq, sk, d, left, sinks, extra part)
    type Decode = (DType, usize, usize, usize, usize, usize, Option<Kind>);
    let cases: [Decode; 7] = [
        (DType::BF16, 1, 4000, 64, 512, 4, None),
        (DType::F16, 1, 3001, 128, 1000, 1, None),
        (DType::BF16, 2, 4000, 64, 0, 64, None),
        (DType::BF16, 3, 2500, 128, 300, 16, Some(Kind::Bitset(128))),
        (DType::F16, 4, 3900, 64, 2000, 7, Some(Kind::Packed)),
        (DType::BF16, 4, 4000, 256, 129, 200, Some(Kind::Bcsr(64))),
        (DType::F16, 1, 1537, 96, 100, 4000, Some(Kind::Dense)),
    ];
    for (dtype, sq, sk, d, left, sinks, extra) in cases {
        let case = Case { dtype, bias: Some([2, 1, 1, sk]), ..Case::new(2, sq, sk, 4, 2, d) };
        let mut spec = MaskSpec::band(BandCtor::CausalWindow(left), sinks);
        if let Some(kind) = extra {
            spec = spec.and(random_part(&mut rng, &case, kind, [2, 2]));
        }
        check_spec(&case, &spec, &gpu, rng.random());
        // A window with no right edge (not causal), a row sees keys after its diagonal too.
        let open = MaskSpec::band(BandCtor::Window(Some(left), None), sinks);
        check_spec(&case, &open, &gpu, rng.random());
    }
}

/// Longer sequences: many tiles skipped, full or partial (a causal window with sinks over 1500
/// queries and keys; compressed causal with cf 64 over 4096 queries; a sparse BCSR mask over
/// 2000 keys), forward and backward.
#[test]
fn long_sparse_sequences() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("long_sparse_sequences");
    let case = Case { dtype: DType::BF16, bias: Some([1, 1, 1, 1500]), ..Case::new(1, 1500, 1500, 2, 1, 64) };
    check_spec(&case, &MaskSpec::band(BandCtor::CausalWindow(200), 8), &gpu, rng.random());
    let case = Case { dtype: DType::F16, ..Case::new(1, 4096, 64, 2, 2, 128) };
    check_spec(&case, &MaskSpec::band(BandCtor::CompressCausal(64), 0), &gpu, rng.random());
    let windowed = MaskSpec::band(BandCtor::CompressCausal(64), 2).and(MaskSpec::band(BandCtor::Window(Some(10), None), 0));
    check_spec(&case, &windowed, &gpu, rng.random());
    let case = Case { dtype: DType::BF16, ..Case::new(1, 700, 2000, 4, 2, 64) };
    let spec = MaskSpec::data(random_bcsr(&mut rng, [1, 2], 128, 700, 2000)).and(MaskSpec::band(BandCtor::Window(Some(900), Some(300)), 0));
    check_spec(&case, &spec, &gpu, rng.random());
}

/// A BCSR mask with no entries (nnz 0) and an all-false bitset hide everything: O = 0, LSE =
/// -inf, zero gradients, nothing NaN.
#[test]
fn masks_hiding_everything() {
    let Some(gpu) = gpu() else { return };
    let case = Case { bias: Some([2, 2, 130, 200]), dtype: DType::BF16, ..Case::new(2, 130, 200, 4, 2, 64) };
    let empty_bcsr = MaskSpec::data(DataPart::Bcsr { planes: [1, 1], block: 64, row_ptr: vec![0; 4], col_idx: vec![], nnz: 0 });
    let empty_bitset = MaskSpec::data(DataPart::Bitset { shape: [1, 2, 2, 2], kept: vec![false; 8], block: 128 });
    let no_keys = MaskSpec::band(BandCtor::Window(Some(0), Some(0)), 0).and(MaskSpec::data(DataPart::Bitset {
        shape: [1, 1, 3, 4],
        kept: (0..12).map(|x| x % 5 != 0).collect(),
        block: 64,
    }));
    let inputs = case.inputs(&mut fresh_rng("masks_hiding_everything")).to(&gpu);
    dmattn::set_output_poisoning(true);
    for spec in [empty_bcsr, empty_bitset] {
        let mask = spec.prepare(&gpu, 130, 200).unwrap();
        for path in [ForwardPath::Fused, ForwardPath::Materialized] {
            let fwd = path.run(case.call(&inputs).sparse_mask(&mask)).unwrap();
            assert!(fwd.out.to_f64_vec().unwrap().iter().all(|&x| x == 0.0), "{path:?}: O is not all 0 for {spec:?}");
            assert!(fwd.lse.to_f64_vec().unwrap().iter().all(|&x| x == f64::NEG_INFINITY), "{path:?}: LSE is not all -inf for {spec:?}");
            let g = grads_vec(&fwd.backward(&gpu_dout(&case, 1).to_device(&gpu).unwrap()).unwrap());
            assert!(g.iter().flatten().all(|v| v.iter().all(|&x| x == 0.0)), "{path:?}: nonzero gradient for {spec:?}");
        }
    }
    // And a mask hiding some rows, against the reference.
    check_spec(&case, &no_keys, &gpu, 11);
}

/// On the GPU, `memory_bytes` is 0 for a parametric mask and positive with data, and
/// `estimated_speedup` reads back the block classes the kernels use: the same number the CPU's
/// preparation and the documented definition give.
#[test]
fn gpu_memory_and_estimated_speedup() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("gpu_memory_and_estimated_speedup");
    let window = SparseMask::causal_window(128).with_sinks(4).prepare(4096, 4096).unwrap();
    assert_eq!(window.memory_bytes(), 0);
    assert!(window.estimated_speedup().unwrap() > 10.0);
    let kinds: [&[Kind]; 7] = [
        &[Kind::Dense],
        &[Kind::Packed, Kind::Band],
        &[Kind::Bitset(128)],
        &[Kind::Bcsr(64), Kind::Bitset(64)],
        &[Kind::DenseBlocks(64)],
        &[Kind::DenseBlocks(128), Kind::Dense],
        &[Kind::Compress(2), Kind::Bcsr(128)],
    ];
    for kinds in kinds {
        for (b, sq, sk, h, hk) in [(2, 1, 1, 2, 1), (1, 300, 700, 4, 2), (2, 129, 65, 4, 4), (2, 200, 257, 3, 1)] {
            let case = Case::new(b, sq, sk, h, hk, 64);
            let spec = random_spec(&mut rng, &case, kinds);
            let on_gpu = spec.prepare(&gpu, sq, sk).unwrap();
            let on_cpu = spec.prepare(&Device::Cpu, sq, sk).unwrap();
            assert!(on_gpu.memory_bytes() > 0, "{spec:?}");
            let (g, c, want) = (on_gpu.estimated_speedup().unwrap(), on_cpu.estimated_speedup().unwrap(), spec.estimated_speedup(sq, sk));
            // The GPU runs a query-broadcast mask keeping few keys as gather attention, whose
            // estimate counts the gathered tiles.
            let want_gpu = if on_gpu.gathered_keys().unwrap().is_some() { spec.gathered_speedup(sq, sk) } else { want };
            assert!((g - want_gpu).abs() <= 1e-9 * want_gpu && c == want, "estimated_speedup of {spec:?} at {sq}x{sk}: GPU {g} (expected {want_gpu}), CPU {c}, expected {want}");
        }
    }
}

/// What only the GPU shows: masks on another device than q, parts on different devices, two
/// score masks in one mask, packed bytes not contiguous along the keys; and the checks every
/// device makes (BCSR, block sizes) on GPU tensors.
#[test]
fn gpu_rejects_bad_sparse_masks() {
    let Some(gpu) = gpu() else { return };
    let (sq, sk) = (70, 150);
    let case = Case { dtype: DType::BF16, ..Case::new(2, sq, sk, 4, 2, 64) };
    let i = case.inputs(&mut seeded_rng(5)).to(&gpu);
    let on = |dev: &Device, s: &[usize], dt: DType| Tensor::from_fn(s, dt, dev, |x| (x % 3 != 0) as u8 as f64).unwrap();
    let cpu = Device::Cpu;
    let dense_gpu = on(&gpu, &[1, 1, sq, sk], DType::Bool);
    let dense_cpu = on(&cpu, &[1, 1, sq, sk], DType::Bool);

    // A mask with data prepared on the CPU, used with GPU tensors, and the reverse.
    let p_cpu = SparseMask::dense(&dense_cpu).prepare(sq, sk).unwrap();
    let r = attention(&i.q, &i.k, &i.v).sparse_mask(&p_cpu).forward();
    assert!(matches!(r, Err(Error::Device { arg: "sparse_mask", .. })), "CPU mask, GPU q: {:?}", r.err());
    let p_gpu = SparseMask::dense(&dense_gpu).prepare(sq, sk).unwrap();
    let ci = case.inputs(&mut seeded_rng(5));
    let r = attention(&ci.q, &ci.k, &ci.v).sparse_mask(&p_gpu).forward();
    assert!(matches!(r, Err(Error::Device { arg: "sparse_mask", .. })), "GPU mask, CPU q: {:?}", r.err());
    // Parts on two devices.
    let r = SparseMask::dense(&dense_gpu).and(SparseMask::block_bitset(&on(&cpu, &[1, 1, 2, 3], DType::Bool), 64)).prepare(sq, sk);
    assert!(matches!(r, Err(Error::Device { arg: "block_bitset", .. })), "parts on two devices: {:?}", r.err());
    // Two score masks.
    let packed = on(&gpu, &[1, 1, sq, sk.div_ceil(8)], DType::U8);
    let r = SparseMask::dense(&dense_gpu).and(SparseMask::packed_bits(&packed)).prepare(sq, sk);
    assert!(matches!(r, Err(Error::Unsupported { .. })), "two score masks: {:?}", r.err());
    // Packed bytes with a stride of 2 along the keys.
    let n = sk.div_ceil(8);
    let wide = on(&gpu, &[1, 1, sq, 2 * n], DType::U8);
    let strided = wide.as_strided(&[1, 1, sq, n], &[sq * 2 * n, sq * 2 * n, 2 * n, 2], 0).unwrap();
    let r = SparseMask::packed_bits(&strided).prepare(sq, sk);
    assert!(matches!(r, Err(Error::Layout { arg: "packed_bits", .. })), "strided packed bytes: {:?}", r.err());
    // BCSR and block sizes, on GPU tensors.
    let i32s = |v: Vec<i32>, s: &[usize]| Tensor::from_vec(v, s, &gpu).unwrap();
    let bcsr = |rp: Vec<i32>, ci: Vec<i32>| {
        let n = ci.len();
        SparseMask::bcsr(&i32s(rp, &[1, 1, 3]), &i32s(ci, &[1, 1, n]), 64).prepare(sq, sk)
    };
    assert!(bcsr(vec![0, 2, 3], vec![2, 0, 1]).is_ok());
    assert!(matches!(bcsr(vec![0, 2, 1], vec![0, 1]), Err(Error::Param { arg: "row_ptr", .. })));
    assert!(matches!(bcsr(vec![1, 1, 2], vec![0, 1]), Err(Error::Param { arg: "row_ptr", .. })));
    assert!(matches!(bcsr(vec![0, 1, 3], vec![0, 1]), Err(Error::Param { arg: "row_ptr", .. })));
    assert!(matches!(bcsr(vec![0, 1, 2], vec![0, 3]), Err(Error::Param { arg: "col_idx", .. })));
    for block in [32, 256] {
        let r = SparseMask::block_bitset(&on(&gpu, &[1, 1, 3, 5], DType::Bool), block).prepare(sq, sk);
        assert!(matches!(r, Err(Error::Param { arg: "block", .. })), "block {block}: {:?}", r.err());
        let r = SparseMask::dense_blocks(&dense_gpu, block).prepare(sq, sk);
        assert!(matches!(r, Err(Error::Param { arg: "block", .. })), "block {block}: {:?}", r.err());
    }
    let r = SparseMask::packed_bits(&on(&gpu, &[1, 1, sq, n + 1], DType::U8)).prepare(sq, sk);
    assert!(matches!(r, Err(Error::Shape { arg: "packed_bits", .. })), "packed, last dim {}: {:?}", n + 1, r.err());
    // The device works on after the errors.
    let spec = MaskSpec::band(BandCtor::CausalWindow(9), 2);
    check_spec(&case, &spec, &gpu, 1);
}
