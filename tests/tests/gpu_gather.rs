//! Gather attention on the GPU (a key-side mask `[{1|b}, {1|hk|h}, 1, sk]` compacted to its kept
//! keys) against the f64 CPU reference run with the equivalent dense mask: property tests over
//! key-side masks from one key to every key (random, contiguous runs, none), bool and
//! bit-packed, with and without a band or compressed causal applied on the original key positions,
//! causal with `sq != sk`, every bias broadcast, GQA/MQA and per-query-head masks, head dims 32-256,
//! f16 and bf16, rows with no visible key; forward, backward, deterministic backward, the
//! materialising forward, and the unprepared `.mask()` call. Also: which masks take the gathered
//! path, bit-identical deterministic gradients, keys beyond one compaction pass, and index lists:
//! shared by every query (gathered) and per query (the forward over each query's own keys, and
//! which lists take it; lists that are a window prepared as that band).
//! `DMATTN_GPU_CASES` sets the property tests' case counts. Skips, saying why, where there is no
//! CUDA device.
use dmattn::{DType, SparseMask, Tensor};
use dmattn_tests::sparse::{
    BandCtor, DataPart, Kind, MaskSpec, SparseCase, check_gpu_prepared, check_gpu_sparse, gpu_gather_cases, random_indices_of, random_key_keep, random_part, random_side, window_lists, window_of,
};
use dmattn_tests::*;
use proptest::test_runner::TestCaseError;
use rand::Rng;

/// The GPU backward of `got` against the reference backward of `want` (both forwards of `case` on
/// `inputs`, held on the CPU), for an output gradient drawn from `seed`. Failures name `what`.
fn check_backward_of(
    what: &dyn std::fmt::Debug,
    case: &Case,
    inputs: &Inputs,
    got: &dmattn::Forward,
    want: &dmattn::Forward,
    gpu: &dmattn::Device,
    seed: u64,
) -> Result<(), TestCaseError> {
    let dout = gpu_dout(case, seed ^ 0x5EED);
    let g = got.backward(&dout.to_device(gpu).unwrap()).map_err(|e| TestCaseError::fail(format!("gpu backward: {e} for {what:?}")))?;
    let w = want.backward(&dout).unwrap();
    let (spec, data) = (naive::Spec::of(case), naive::Data::of(inputs));
    let mags = gradient_sizes(&spec, &data, &naive::forward(&spec, &data), &dout);
    compare_gradients(what, &grads_vec(&g), &grads_vec(&w), &mags, gpu_tolerance(case.dtype))
}

fn gather_property(cases: u32, max_seqlen: usize, property: impl Fn(SparseCase) -> Result<(), TestCaseError>) {
    if let Err(e) = gpu_runner(cases).run(&gpu_gather_cases(max_seqlen), property) {
        panic!("{e}");
    }
}

#[test]
fn gather_forward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gather_property(1000, 300, |sc| check_gpu_sparse(&sc, &gpu, ForwardPath::Fused, false, false));
}

/// The gathered backward, in two cases of three forced into 2 or 4 query chunks by heads or by
/// rows wherever the case folds so (small cases would otherwise run unfolded).
#[test]
fn gather_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gather_property(700, 300, |sc| {
        let _forced = ForcedChunks::on(sc.seed);
        check_gpu_sparse(&sc, &gpu, ForwardPath::Fused, true, false)
    });
}

#[test]
fn gather_deterministic_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gather_property(150, 200, |sc| {
        let _forced = ForcedChunks::on(sc.seed);
        check_gpu_sparse(&sc, &gpu, ForwardPath::Fused, true, true)
    });
}

/// The gathered backward's query chunks forced on this thread until dropped: from `seed`, 2 or 4
/// chunks by query heads or by rows, or the plan's own choice.
struct ForcedChunks;

impl ForcedChunks {
    fn on(seed: u64) -> Self {
        let n = 2 << (seed / 3 % 2);
        match seed % 3 {
            0 => dmattn::force_gather_query_chunks(Some(n), true),
            1 => dmattn::force_gather_query_chunks(Some(n), false),
            _ => dmattn::force_gather_query_chunks(None, false),
        }
        ForcedChunks
    }
}

impl Drop for ForcedChunks {
    fn drop(&mut self) {
        dmattn::force_gather_query_chunks(None, false);
    }
}

#[test]
fn gather_materialized_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gather_property(100, 300, |sc| check_gpu_sparse(&sc, &gpu, ForwardPath::Materialized, sc.seed % 2 == 0, false));
}

/// The unprepared call: a key-side mask passed to `.mask()` (prepared by the call itself),
/// forward and backward, against the reference on the same mask.
#[test]
fn gather_through_the_mask_argument_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gather_property(150, 300, |sc| {
        dmattn::set_output_poisoning(true);
        let case = &sc.case;
        let mut rng = seeded_rng(sc.seed);
        let pb = if rng.random_bool(0.5) { case.batch } else { 1 };
        let ph = [1, case.kv_heads, case.heads][rng.random_range(0..3)];
        let shape = [pb, ph, 1, case.seqlen_k];
        let keep = random_key_keep(&mut rng, shape);
        let case = Case { mask: Some(shape), ..case.clone() };
        let mut inputs = case.inputs(&mut rng);
        inputs.mask = Some(Tensor::from_vec(keep, &shape, &dmattn::Device::Cpu).unwrap());
        let want = case.forward(&inputs).map_err(|e| TestCaseError::fail(format!("reference: {e}")))?;
        let on_gpu = inputs.to(&gpu);
        let got = case.forward(&on_gpu).map_err(|e| TestCaseError::fail(format!("gpu: {e} for {case:?}")))?;
        compare_forward(&case, ForwardPath::Fused, case.dtype, &got, &want, 0.0)?;
        check_backward_of(&case, &case, &inputs, &got, &want, &gpu, sc.seed)
    });
}

/// A key-side mask alone keeping at most half the keys is gathered, to the longest plane's count
/// rounded up to 64; denser ones, masks varying along the queries and masks with block parts are
/// not.
#[test]
fn which_masks_are_gathered() {
    let Some(gpu) = gpu() else { return };
    let sk = 1000;
    let mask = |shape: [usize; 4], kept: &dyn Fn(usize) -> bool| {
        let n: usize = shape.iter().product();
        Tensor::from_vec((0..n).map(|x| kept(x % sk)).collect(), &shape, &gpu).unwrap()
    };
    let prepared = |m: SparseMask| m.prepare(200, sk).unwrap().gathered_keys().unwrap();
    // Planes keeping 100 and 130 keys: 130 rounds up to 192.
    let two = Tensor::from_vec((0..2 * sk).map(|x| if x < sk { x % 10 == 0 } else { x - sk < 130 }).collect(), &[1, 2, 1, sk], &gpu).unwrap();
    assert_eq!(prepared(SparseMask::dense(&two)), Some(192));
    assert_eq!(prepared(SparseMask::dense(&mask([1, 1, 1, sk], &|j| j == 999))), Some(64));
    assert_eq!(prepared(SparseMask::dense(&mask([1, 1, 1, sk], &|_| false))), Some(64));
    assert_eq!(prepared(SparseMask::dense(&mask([1, 1, 1, sk], &|j| j < 448)).and(SparseMask::causal())), Some(448));
    assert_eq!(prepared(SparseMask::dense(&mask([1, 1, 1, sk], &|j| j < 600))), None);
    assert_eq!(prepared(SparseMask::dense(&mask([1, 1, 200, sk], &|j| j < 10))), None);
    let bitset = Tensor::from_vec(vec![true; 4 * 16], &[1, 1, 4, 16], &gpu).unwrap();
    assert_eq!(prepared(SparseMask::dense(&mask([1, 1, 1, sk], &|j| j < 10)).and(SparseMask::block_bitset(&bitset, 64))), None);
}

/// Two deterministic runs through the gathered path give bit-identical gradients (dK, dV and
/// dbias summed over query heads and batches by the scatter), and match the reference.
#[test]
fn gather_deterministic_runs_are_bit_identical() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("gather_deterministic_runs_are_bit_identical");
    let cases = [
        Case { bias: Some([1, 1, 1, 700]), causal: true, dtype: DType::BF16, ..Case::new(2, 300, 700, 4, 2, 64) },
        Case { bias: Some([2, 4, 300, 500]), dtype: DType::F16, ..Case::new(2, 300, 500, 4, 1, 128) },
    ];
    for case in cases {
        let seed: u64 = rng.random();
        let mut r = seeded_rng(seed);
        let inputs = case.inputs(&mut r);
        let shape = [case.batch, case.heads, 1, case.seqlen_k];
        let keep: Vec<bool> = (0..shape.iter().product()).map(|_| r.random_bool(0.1)).collect();
        let spec = MaskSpec::data(DataPart::Dense { shape, keep });
        let prepared = spec.prepare(&gpu, case.seqlen_q, case.seqlen_k).unwrap();
        assert!(prepared.gathered_keys().unwrap().is_some(), "a 10 % key-side mask is gathered");
        let on_gpu = inputs.to(&gpu);
        let dout = gpu_dout(&case, seed).to_device(&gpu).unwrap();
        dmattn::set_output_poisoning(true);
        let run = || grads_vec(&case.call(&on_gpu).sparse_mask(&prepared).deterministic(true).forward().unwrap().backward(&dout).unwrap());
        let first = run();
        for _ in 0..3 {
            assert_same_bits(&first, &run(), &case);
        }
        let sc = SparseCase { case: case.clone(), kinds: Vec::new(), seed };
        check_gpu_prepared(&sc, &spec, &prepared, &inputs, &gpu, ForwardPath::Fused, true, true).unwrap();
    }
}

/// The workload's shape in small: long keys (three compaction passes), a top-k-like key mask, a
/// key-side bias, causal with fewer queries than keys; forward and backward.
#[test]
fn long_keys_with_key_side_bias_match_reference() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("long_keys_with_key_side_bias_match_reference");
    let sk = 40_000;
    let case = Case { bias: Some([1, 1, 1, sk]), causal: true, dtype: DType::BF16, ..Case::new(1, 200, sk, 2, 1, 64) };
    let seed: u64 = rng.random();
    let mut r = seeded_rng(seed);
    let inputs = case.inputs(&mut r);
    let shape = [1, 1, 1, sk];
    let keep: Vec<bool> = (0..sk).map(|j| r.random_bool(0.025) || j >= sk - 100).collect();
    let spec = MaskSpec::data(DataPart::Dense { shape, keep });
    let prepared = spec.prepare(&gpu, case.seqlen_q, sk).unwrap();
    assert!(prepared.gathered_keys().unwrap().is_some_and(|w| w < 2000), "gathered: {:?}", prepared.gathered_keys());
    let sc = SparseCase { case, kinds: Vec::new(), seed };
    check_gpu_prepared(&sc, &spec, &prepared, &inputs, &gpu, ForwardPath::Fused, true, false).unwrap();
}

/// Long queries in batch 1: the gathered backward splits its query tiles (d64, not deterministic:
/// the shares add into one f32 dK/dV) or runs in query chunks, by rows or by query heads (d128,
/// and deterministic runs: each chunk its own batch entry over the same gathered keys, dK and dV
/// summed over the chunks by the scatter); against the reference, and deterministic runs
/// bit-identical. The last case's forward
/// grid is several waves (`flags::HEADS_FIRST`).
#[test]
fn chunked_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("chunked_backward_matches_reference");
    let sk = 3000;
    let cases = [
        (Case { bias: Some([1, 1, 1, sk]), causal: true, dtype: DType::BF16, ..Case::new(1, 2048, sk, 4, 2, 64) }, 2),
        (Case { bias: Some([1, 4, 1, sk]), dtype: DType::F16, ..Case::new(1, 2048, sk, 4, 1, 128) }, 4),
        // More query tiles than an H100 has SMs, unsplit: the forward takes them heads first.
        (Case { bias: Some([1, 4, 1, sk]), causal: true, dtype: DType::BF16, ..Case::new(1, 2048, sk, 16, 4, 64) }, 4),
        // Groups of 4 query heads, a bias and a mask per kv head: 4 chunks by heads (the
        // key-side workload's shape); a bias with a query dimension: 2, by heads alone.
        (Case { bias: Some([1, 2, 1, sk]), causal: true, dtype: DType::BF16, ..Case::new(1, 2048, sk, 8, 2, 128) }, 2),
        (Case { bias: Some([1, 1, 2048, sk]), causal: true, dtype: DType::F16, ..Case::new(1, 2048, sk, 4, 2, 128) }, 2),
    ];
    for (case, mask_heads) in cases {
        let seed: u64 = rng.random();
        let mut r = seeded_rng(seed);
        let inputs = case.inputs(&mut r);
        let shape = [1, mask_heads, 1, sk];
        let keep: Vec<bool> = (0..shape.iter().product()).map(|_| r.random_bool(0.05)).collect();
        let spec = MaskSpec::data(DataPart::Dense { shape, keep });
        let prepared = spec.prepare(&gpu, case.seqlen_q, sk).unwrap();
        assert!(prepared.gathered_keys().unwrap().is_some());
        let sc = SparseCase { case: case.clone(), kinds: Vec::new(), seed };
        check_gpu_prepared(&sc, &spec, &prepared, &inputs, &gpu, ForwardPath::Fused, true, false).unwrap();
        check_gpu_prepared(&sc, &spec, &prepared, &inputs, &gpu, ForwardPath::Fused, true, true).unwrap();
        let on_gpu = inputs.to(&gpu);
        let dout = gpu_dout(&case, seed).to_device(&gpu).unwrap();
        let run = || grads_vec(&case.call(&on_gpu).sparse_mask(&prepared).deterministic(true).forward().unwrap().backward(&dout).unwrap());
        assert_same_bits(&run(), &run(), &case);
    }
}

/// Index lists (`attn_indices`) on the GPU against the reference with the dense mask they describe:
/// lists with and without a query dimension (the latter gathered), random keys, windows around
/// the diagonal, padding, repeats, `w` past `seqlen_k`, all padding; forward and backward.
#[test]
fn index_lists_match_reference() {
    let Some(gpu) = gpu() else { return };
    gather_property(400, 300, |sc| {
        dmattn::set_output_poisoning(true);
        let mut rng = seeded_rng(sc.seed);
        let (shape, idx, keep) = dmattn_tests::sparse::random_indices(&mut rng, &sc.case);
        let dense_shape = [shape[0], shape[1], shape[2], sc.case.seqlen_k];
        let case = Case { mask: Some(dense_shape), ..sc.case.clone() };
        let mut inputs = case.inputs(&mut rng);
        inputs.mask = Some(Tensor::from_vec(keep, &dense_shape, &dmattn::Device::Cpu).unwrap());
        let want = case.forward(&inputs).map_err(|e| TestCaseError::fail(format!("reference: {e}")))?;
        let mut on_gpu = inputs.to(&gpu);
        on_gpu.mask = None;
        let lists = Tensor::from_vec(idx, &shape, &gpu).unwrap();
        let call = Case { mask: None, ..case.clone() };
        let got = call.call(&on_gpu).indices(&lists).forward().map_err(|e| TestCaseError::fail(format!("gpu: {e} for {case:?} lists {shape:?}")))?;
        compare_forward(&(&case, shape), ForwardPath::Fused, case.dtype, &got, &want, 0.0)?;
        check_backward_of(&(&case, shape), &case, &inputs, &got, &want, &gpu, sc.seed)
    });
}

/// Per-query lists forced to run over each query's own keys on this thread until dropped
/// (however a case ends).
struct ForcedLists;

impl ForcedLists {
    fn on() -> Self {
        dmattn::force_per_query_lists(Some(true));
        ForcedLists
    }
}

impl Drop for ForcedLists {
    fn drop(&mut self) {
        dmattn::force_per_query_lists(None);
    }
}

/// Per-query index lists run over each query's own keys (forced: small cases would otherwise run
/// on dense tiles) against the reference with the dense mask they describe, half the time ANDed
/// with a band (windows from 0 past `seqlen_k`, sinks, compressed causal): random,
/// window-shaped, padded, repeated and all-padding lists, `w` from 1 past `seqlen_k`, lists per
/// batch entry or not and per kv head, query head or neither, every bias broadcast, softcap,
/// GQA/MQA, causal with `sq != sk`, f16/bf16; the forward in every case (poisoned outputs, rows
/// with no visible key), the backward (dense tiles, from this forward's O and LSE) in one of four.
#[test]
fn per_query_lists_match_reference() {
    let Some(gpu) = gpu() else { return };
    gather_property(2000, 300, |sc| {
        let _forced = ForcedLists::on();
        let (inputs, _) = sc.draw();
        let case = &sc.case;
        let mut rng = seeded_rng(sc.seed ^ 0x1157);
        let (shape, idx, keep) = random_indices_of(&mut rng, case, true);
        let cf = [1, 2, 4][rng.random_range(0..3)];
        let band = match rng.random_range(0..4) {
            0 | 1 => MaskSpec { bands: Vec::new(), data: Vec::new() },
            2 => random_part(&mut rng, case, Kind::Band, [1, 1]),
            _ if case.causal => random_part(&mut rng, case, Kind::Band, [1, 1]),
            _ => random_part(&mut rng, case, Kind::Compress(cf), [1, 1]),
        };
        let lists = Tensor::from_vec(idx, &shape, &gpu).unwrap();
        let mask = band.build(&gpu).unwrap().and(SparseMask::indices(&lists));
        let spec = band.and(MaskSpec::data(DataPart::Dense { shape: [shape[0], shape[1], shape[2], case.seqlen_k], keep }));
        let prepared = mask.prepare(case.seqlen_q, case.seqlen_k).map_err(|e| TestCaseError::fail(format!("prepare: {e} for {sc:?} lists {shape:?}")))?;
        // One query: the lists have no query dimension (gather attention).
        proptest::prop_assert_eq!(prepared.per_query_lists(), case.seqlen_q > 1, "{:?} lists {:?}", sc, shape);
        check_gpu_prepared(&sc, &spec, &prepared, &inputs, &gpu, ForwardPath::Fused, sc.seed % 4 == 0, false)
    });
}

/// Which per-query lists run over each query's own keys unforced: random keys, whose dense
/// tiles would be all the tiles, do; windows around the diagonal do not (they are prepared as
/// the window, no memory). Both match the reference, and two forwards are bit-identical.
#[test]
fn which_lists_run_per_query() {
    let Some(gpu) = gpu() else { return };
    let case = Case { dtype: DType::BF16, causal: true, ..Case::new(1, 2048, 2048, 4, 2, 64) };
    let mut rng = seeded_rng(11);
    let inputs = case.inputs(&mut rng);
    let w = 48;
    let random: Vec<i32> = (0..2048 * w).map(|_| rng.random_range(0..2048)).collect();
    let window: Vec<i32> = (0..2048 * w).map(|e| ((e / w) as i32 - (e % w) as i32).max(-1)).collect();
    for (name, idx, per_query) in [("random", random, true), ("window", window, false)] {
        let mut keep = vec![false; 2048 * 2048];
        for (e, &k) in idx.iter().enumerate() {
            if k >= 0 {
                keep[(e / w) * 2048 + k as usize] = true;
            }
        }
        let lists = Tensor::from_vec(idx, &[1, 1, 2048, w], &gpu).unwrap();
        let prepared = SparseMask::indices(&lists).prepare(2048, 2048).unwrap();
        assert_eq!(prepared.per_query_lists(), per_query, "{name} lists");
        assert_eq!(prepared.memory_bytes() == 0, !per_query, "{name} lists");
        let sc = SparseCase { case: case.clone(), kinds: Vec::new(), seed: 5 };
        let spec = MaskSpec::data(DataPart::Dense { shape: [1, 1, 2048, 2048], keep });
        check_gpu_prepared(&sc, &spec, &prepared, &inputs, &gpu, ForwardPath::Fused, true, false).unwrap_or_else(|e| panic!("{name} lists: {e}"));
        let on_gpu = inputs.to(&gpu);
        let run = || {
            let f = case.call(&on_gpu).sparse_mask(&prepared).forward().unwrap();
            [f.out.to_f64_vec().unwrap(), f.lse.to_f64_vec().unwrap()]
        };
        let (a, b) = (run(), run());
        assert!(a.iter().zip(&b).all(|(x, y)| x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits())), "{name} lists: two forwards differ");
    }
}

/// Per-query lists that are a window about the diagonal (each row's keys exactly the window's,
/// in any order, repeated, padded; every plane the same; sides from 0 past the lengths) are
/// prepared as that window: no memory, the band kernels. Lists one change away from one (a key
/// dropped or added, a row emptied, a plane's window moved) are not, unless the change leaves a
/// window (brute force decides). Both match the reference, ANDed half the time with a band: a
/// window or causal, which the lists' window joins, or one with sink keys or compressed causal,
/// which keep the lists as lists. The forward (poisoned outputs, rows with no visible key) in
/// every case, the backward in one of four; the lists alone given to the call (`.indices`) run
/// bit for bit as the prepared mask. One query: the lists have no query dimension (gather
/// attention).
#[test]
fn window_lists_prepare_as_their_band() {
    let Some(gpu) = gpu() else { return };
    gather_property(2000, 300, |sc| {
        let (inputs, _) = sc.draw();
        let case = &sc.case;
        let mut rng = seeded_rng(sc.seed ^ 0xBA9D);
        let (shape, idx, keep) = window_lists(&mut rng, case);
        let window = window_of(&keep, shape[0] * shape[1], case.seqlen_q, case.seqlen_k);
        let (sq, sk) = (case.seqlen_q, case.seqlen_k);
        let (ctor, sinks) = match rng.random_range(0..10) {
            0..=4 => (None, 0),
            5 | 6 => (Some(BandCtor::Causal), 0),
            7 | 8 => (Some(BandCtor::Window(random_side(&mut rng, sq, sk), random_side(&mut rng, sq, sk))), 0),
            _ if case.causal => (Some(BandCtor::CausalWindow(random_side(&mut rng, sq, sk).unwrap_or(sq + sk))), rng.random_range(1..=8)),
            _ => (Some(BandCtor::CompressCausal([1, 2, 4][rng.random_range(0..3)])), 0),
        };
        let takes_a_window = sinks == 0 && !matches!(ctor, Some(BandCtor::CompressCausal(_)));
        let band = MaskSpec { bands: ctor.into_iter().map(|c| (c, sinks)).collect(), data: Vec::new() };
        let lists = Tensor::from_vec(idx, &shape, &gpu).unwrap();
        let mask = band.build(&gpu).unwrap().and(SparseMask::indices(&lists));
        let spec = band.and(MaskSpec::data(DataPart::Dense { shape: [shape[0], shape[1], shape[2], case.seqlen_k], keep }));
        let prepared = mask.prepare(case.seqlen_q, case.seqlen_k).map_err(|e| TestCaseError::fail(format!("prepare: {e} for {sc:?} lists {shape:?}")))?;
        if case.seqlen_q > 1 {
            proptest::prop_assert_eq!(prepared.memory_bytes() == 0, window.is_some() && takes_a_window, "{:?} lists {:?} window {:?} band {:?} sinks {}", sc, shape, window, ctor, sinks);
        }
        check_gpu_prepared(&sc, &spec, &prepared, &inputs, &gpu, ForwardPath::Fused, sc.seed % 4 == 0, false)?;
        // The lists given to the call (`.indices`, prepared by it) run as the prepared mask does.
        if ctor.is_none() {
            let mut on_gpu = inputs.to(&gpu);
            on_gpu.mask = None;
            let bits = |f: dmattn::Forward| [f.out.to_f64_vec().unwrap(), f.lse.to_f64_vec().unwrap()].map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            let given = case.call(&on_gpu).indices(&lists).forward().map_err(|e| TestCaseError::fail(format!("indices: {e} for {sc:?}")))?;
            let prepared = case.call(&on_gpu).sparse_mask(&prepared).forward().map_err(|e| TestCaseError::fail(format!("prepared: {e} for {sc:?}")))?;
            proptest::prop_assert!(bits(given) == bits(prepared), "{:?} lists {:?} window {:?}: .indices and the prepared mask differ", sc, shape, window);
        }
        Ok(())
    });
}

/// Window lists prepared as their band are still checked as the lists they came from: a call of
/// other heads than their planes, a call with a bool mask beside them and a packed call (lists
/// prepared for fixed lengths) are the typed errors non-window lists get. And long rows (9,000
/// keys: each thread of the row kernel sums several words up): a window and the same lists with
/// one key dropped, against the reference, forward and backward.
#[test]
fn window_lists_keep_the_checks_of_lists() {
    let Some(gpu) = gpu() else { return };
    let (sq, sk, w) = (200, 9000, 301);
    let case = Case { dtype: DType::BF16, causal: true, bias: Some([1, 2, 1, sk]), ..Case::new(1, sq, sk, 4, 2, 64) };
    let inputs = case.inputs(&mut seeded_rng(91));
    // Per kv head (planes [1, 2]): row i lists keys D(i) - 250 ..= D(i) + 50 clipped, D(i) = i + sk - sq.
    let window = |drop: bool| -> (Vec<i32>, Vec<bool>) {
        let mut keep = vec![false; 2 * sq * sk];
        let mut idx = Vec::with_capacity(2 * sq * w);
        for n in 0..2 * sq {
            let diag = (n % sq + sk - sq) as i64;
            let keys: Vec<i64> = ((diag - 250).max(0)..=(diag + 50).min(sk as i64 - 1)).filter(|&k| !(drop && n == 77 && k == diag - 3)).collect();
            for &k in &keys {
                keep[n * sk + k as usize] = true;
            }
            idx.extend(keys.iter().rev().map(|&k| k as i32).chain(std::iter::repeat(-1)).take(w));
        }
        (idx, keep)
    };
    for drop in [false, true] {
        let (idx, keep) = window(drop);
        let lists = Tensor::from_vec(idx, &[1, 2, sq, w], &gpu).unwrap();
        let prepared = SparseMask::indices(&lists).prepare(sq, sk).unwrap();
        assert_eq!(prepared.memory_bytes() == 0, !drop, "drop {drop}");
        let sc = SparseCase { case: case.clone(), kinds: Vec::new(), seed: 91 };
        let spec = MaskSpec::data(DataPart::Dense { shape: [1, 2, sq, sk], keep });
        check_gpu_prepared(&sc, &spec, &prepared, &inputs, &gpu, ForwardPath::Fused, true, false).unwrap_or_else(|e| panic!("drop {drop}: {e}"));
        let on_gpu = inputs.to(&gpu);
        // Other heads: 6 query heads over 3 kv heads, where the lists have 2 planes.
        let other = Case { bias: None, ..Case::new(1, sq, sk, 6, 3, 64) };
        let other_inputs = other.inputs(&mut seeded_rng(92)).to(&gpu);
        match other.call(&other_inputs).sparse_mask(&prepared).forward() {
            Err(dmattn::Error::Shape { arg: "sparse_mask", .. }) => {}
            r => panic!("drop {drop}: lists of 2 planes on 3 kv heads: {:?}", r.err()),
        }
        let bools = Tensor::from_vec(vec![true; sk], &[1, 1, 1, sk], &gpu).unwrap();
        match case.call(&on_gpu).mask(&bools).sparse_mask(&prepared).forward() {
            Err(dmattn::Error::Param { arg: "mask", .. }) => {}
            r => panic!("drop {drop}: a bool mask beside the lists: {:?}", r.err()),
        }
        let lens = dmattn::SeqLens::from_lengths(&[sq], &[sk], &gpu).unwrap();
        let packed = |rows: usize, heads: usize| Tensor::from_fn(&[rows, heads, 64], DType::BF16, &gpu, |i| (i as f64 * 0.37).sin()).unwrap();
        let (q, k, v) = (packed(sq, 4), packed(sk, 2), packed(sk, 2));
        match dmattn::attention(&q, &k, &v).seqlens(&lens).causal(true).sparse_mask(&prepared).forward() {
            Err(dmattn::Error::Param { arg: "sparse_mask", .. }) => {}
            r => panic!("drop {drop}: fixed-length lists on a packed call: {:?}", r.err()),
        }
    }
}

/// Per-query lists on shapes the property cases do not reach, forced to run per query: MQA with
/// 40 query heads (warps of 16, 16 and 8 heads) over 9000 keys (the layout's rows in two rounds
/// of words), lists per kv head under h32 hk8 at d128, and lists per query head shared by a batch
/// of two under GQA; random keys with padding and repeats, causal, a per-query bias.
#[test]
fn per_query_lists_on_wide_groups_and_long_rows() {
    let Some(gpu) = gpu() else { return };
    let _forced = ForcedLists::on();
    // (batch, heads, kv heads, sq, sk, head dim, list planes [pb, ph], width, backward)
    let shapes = [(1, 40, 1, 70, 9000, 64, [1, 1], 300, false), (1, 32, 8, 65, 300, 128, [1, 8], 40, true), (2, 4, 2, 90, 200, 32, [1, 4], 60, true)];
    for (n, &(b, h, hk, sq, sk, d, [pb, ph], w, backward)) in shapes.iter().enumerate() {
        let case = Case { dtype: DType::BF16, causal: true, bias: Some([b, h, sq, sk]), ..Case::new(b, sq, sk, h, hk, d) };
        let mut rng = seeded_rng(40 + n as u64);
        let inputs = case.inputs(&mut rng);
        let mut keep = vec![false; pb * ph * sq * sk];
        let idx: Vec<i32> = (0..pb * ph * sq * w)
            .map(|e| {
                let key = if rng.random_bool(0.1) { -1 } else { rng.random_range(0..sk) as i32 };
                if key >= 0 {
                    keep[(e / w) * sk + key as usize] = true;
                }
                key
            })
            .collect();
        let lists = Tensor::from_vec(idx, &[pb, ph, sq, w], &gpu).unwrap();
        let prepared = SparseMask::indices(&lists).prepare(sq, sk).unwrap();
        assert!(prepared.per_query_lists(), "case {n}");
        let sc = SparseCase { case, kinds: Vec::new(), seed: n as u64 };
        let spec = MaskSpec::data(DataPart::Dense { shape: [pb, ph, sq, sk], keep });
        check_gpu_prepared(&sc, &spec, &prepared, &inputs, &gpu, ForwardPath::Fused, backward, false).unwrap_or_else(|e| panic!("case {n}: {e}"));
    }
}

/// Lists over rows of keys at the shared-memory row kernel's limit (393,216 keys: 48 KiB of bits)
/// and past it (the entry-a-thread kernel), against the reference, forward and backward; an entry
/// out of range on the long rows is a typed error.
#[test]
fn index_lists_on_rows_past_shared_memory() {
    let Some(gpu) = gpu() else { return };
    let (sq, w) = (3, 50);
    for (n, sk) in [393_216usize, 400_000].into_iter().enumerate() {
        let case = Case { dtype: DType::BF16, ..Case::new(1, sq, sk, 2, 1, 64) };
        let mut rng = seeded_rng(60 + n as u64);
        let inputs = case.inputs(&mut rng);
        let mut keep = vec![false; sq * sk];
        let idx: Vec<i32> = (0..sq * w)
            .map(|e| {
                // Keys near the row's end too, where the last words are.
                let key = match rng.random_range(0..10) {
                    0 => -1,
                    1 => (sk - 1 - rng.random_range(0..40)) as i32,
                    _ => rng.random_range(0..sk) as i32,
                };
                if key >= 0 {
                    keep[(e / w) * sk + key as usize] = true;
                }
                key
            })
            .collect();
        let lists = Tensor::from_vec(idx.clone(), &[1, 1, sq, w], &gpu).unwrap();
        let prepared = SparseMask::indices(&lists).prepare(sq, sk).unwrap();
        let sc = SparseCase { case, kinds: Vec::new(), seed: n as u64 };
        let spec = MaskSpec::data(DataPart::Dense { shape: [1, 1, sq, sk], keep });
        check_gpu_prepared(&sc, &spec, &prepared, &inputs, &gpu, ForwardPath::Fused, true, false).unwrap_or_else(|e| panic!("sk {sk}: {e}"));
        let mut bad = idx;
        bad[w + 7] = sk as i32;
        let lists = Tensor::from_vec(bad, &[1, 1, sq, w], &gpu).unwrap();
        match SparseMask::indices(&lists).prepare(sq, sk) {
            Err(dmattn::Error::Param { arg: "indices", .. }) => {}
            other => panic!("sk {sk}, entry {sk}: {:?}", other.err()),
        }
    }
}

/// An entry outside `-1..seqlen_k` found on the device is a typed error naming `indices`, as is a
/// bias of the wrong dtype on a gathered call, and nothing is written to the caller's output
/// buffer.
#[test]
fn out_of_range_indices_on_the_gpu_are_typed_errors() {
    let Some(gpu) = gpu() else { return };
    let case = Case { dtype: DType::BF16, ..Case::new(1, 70, 90, 2, 1, 64) };
    let inputs = case.inputs(&mut seeded_rng(7)).to(&gpu);
    let out = Tensor::from_fn(&case.q_shape(), DType::BF16, &gpu, |_| 3.0).unwrap();
    for bad in [90, -2, i32::MAX] {
        let lists = Tensor::from_vec(vec![0, 5, bad, -1], &[1, 1, 1, 4], &gpu).unwrap();
        match case.call(&inputs).indices(&lists).out(&out).forward() {
            Err(dmattn::Error::Param { arg: "indices", .. }) => {}
            other => panic!("index {bad}: {:?}", other.err()),
        }
    }
    assert!(out.to_f64_vec().unwrap().iter().all(|&x| x == 3.0), "the output buffer was written");
    // A gathered call checks the bias dtype before gathering it.
    let keys = Tensor::from_vec((0..90).map(|j| j % 9 == 0).collect::<Vec<bool>>(), &[1, 1, 1, 90], &gpu).unwrap();
    let bias = Tensor::from_fn(&[1, 1, 1, 90], DType::F32, &gpu, |j| j as f64 * 0.01).unwrap();
    match case.call(&inputs).mask(&keys).bias(&bias).out(&out).forward() {
        Err(dmattn::Error::DType { arg: "bias", .. }) => {}
        other => panic!("f32 bias with bf16 q: {:?}", other.err()),
    }
    assert!(out.to_f64_vec().unwrap().iter().all(|&x| x == 3.0), "the output buffer was written");
}
