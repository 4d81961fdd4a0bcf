//! Packed variable-length batches on the GPU, each sequence checked against its own
//! fixed-length call on the f64 CPU reference (`dmattn_tests::varlen::check_varlen`): property
//! tests over random batches (1-6 sequences, lengths 0 to 300 drawn apart for queries and keys,
//! 16-bit dtypes, every head dim, GQA, causal, windows, softcap, biases and masks in either
//! layout), forward, backward and the deterministic backward; bit-identical deterministic
//! gradients; sparse masks with data prepared for a batch; unsplit batches without modifiers (the Hopper lean packed kernel); decoding-shaped batches (a few queries over long keys, split-KV, key-side masks). `DMATTN_GPU_CASES` sets the property tests' case
//! counts. Skips, saying why, where there is no CUDA device.
use dmattn::{DType, Device, Error, PageTable, SeqLens, Tensor, attention};
use dmattn_tests::sparse::BandCtor;
use dmattn_tests::varlen::{VarlenCase, VarlenMask, check_varlen, varlen_cases};
use dmattn_tests::*;
use proptest::strategy::Strategy;
use proptest::test_runner::TestCaseError;

fn varlen_property(
    cases: u32,
    max_seqlen: usize,
    property: impl Fn((VarlenCase, u64)) -> Result<(), TestCaseError>,
) {
    if let Err(e) = gpu_runner(cases).run(&varlen_cases(max_seqlen), property) {
        panic!("{e}");
    }
}

#[test]
fn varlen_forward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    varlen_property(1200, 300, |(c, seed)| {
        check_varlen(&c, &gpu, seed, false, false, gpu_tolerance(c.dtype))
    });
}

/// Packed batches with enough CTAs to run unsplit and no mask, bias or softcap at d64 and d128:
/// on a Hopper GPU the lean packed kernel (`dmattn_fwd_sm90_*_d{64,128}_packed`), which the property
/// test's small batches reach only now and then. Lengths 0 to 300 and one of 600 to 700;
/// causal, windows or neither.
#[test]
fn lean_packed_forward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    use rand::Rng;
    let mut rng = fresh_rng("lean_packed_forward_matches_reference");
    let bands = [None, Some(BandCtor::CausalWindow(200)), Some(BandCtor::Window(Some(100), Some(30)))];
    let count = std::env::var("DMATTN_GPU_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(24);
    for n in 0..count {
        let batch = rng.random_range(4..=6);
        // One sequence of at least 600 queries: 5 or more query tiles x 16 heads x the batch.
        let mut lens: Vec<(usize, usize)> = (0..batch).map(|_| (rng.random_range(0..=300), rng.random_range(0..=300))).collect();
        lens[rng.random_range(0..batch)] = (rng.random_range(600..=700), rng.random_range(600..=700));
        let c = VarlenCase {
            lens,
            heads: 16,
            kv_heads: 4,
            // Every pair of dtype and causal at each head dim of the Hopper kernel.
            head_dim: if n % 4 < 2 { 128 } else { 64 },
            causal: n % 2 == 0,
            band: bands[n % 3].clone(),
            softcap: 0.0,
            bias_heads: None,
            bias_per_query: false,
            mask: None,
            dtype: [DType::BF16, DType::F16][n % 2],
            page_size: None,
            sparse: None,
        };
        if let Err(e) = check_varlen(&c, &gpu, rng.random(), false, false, gpu_tolerance(c.dtype)) {
            panic!("lean packed case {n}: {e}; {c:?}");
        }
    }
}

#[test]
fn varlen_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    varlen_property(800, 300, |(c, seed)| {
        check_varlen(&c, &gpu, seed, true, false, gpu_tolerance(c.dtype))
    });
}

#[test]
fn varlen_deterministic_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    varlen_property(150, 200, |(c, seed)| check_varlen(&c, &gpu, seed, true, true, gpu_tolerance(c.dtype)));
}

/// Two deterministic runs give bit-identical gradients on a batch whose sequences have many
/// key tiles adding to each dQ tile, without a bias and with one of each layout that both kv
/// heads add to (their dbias turns).
#[test]
fn varlen_deterministic_runs_are_bit_identical() {
    let Some(gpu) = gpu() else { return };
    for (bias_heads, bias_per_query) in [(None, false), (Some(1), false), (Some(1), true)] {
        let c = VarlenCase {
            lens: vec![(700, 900), (0, 64), (333, 333), (1, 1000)],
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            causal: true,
            band: None,
            softcap: 0.0,
            bias_heads,
            bias_per_query,
            mask: None,
            dtype: DType::BF16,
            page_size: None,
            sparse: None,
        };
        let seqs = c.seqlens(&gpu);
        let inputs = c.inputs(&mut seeded_rng(7)).to(&gpu);
        let run = || {
            grads_vec(
                &c.forward(&inputs, &seqs, true)
                    .unwrap()
                    .backward(&inputs.dout)
                    .unwrap(),
            )
        };
        assert_same_bits(&run(), &run(), &c);
        check_varlen(&c, &gpu, 7, true, true, gpu_tolerance(c.dtype)).unwrap();
    }
}

/// Masks in both layouts with each head count, beside no bias and either layout of bias (the
/// mixed layouts), sparse and dense, causal or under a window: forward and backward against the
/// reference, and deterministic gradients bit-identical from run to run.
#[test]
fn varlen_masks_in_every_layout() {
    let Some(gpu) = gpu() else { return };
    let lens = vec![(200, 300), (0, 50), (65, 1), (130, 129), (1, 700), (77, 0)];
    let mut seed = 300;
    for per_query in [false, true] {
        for (heads, bias_heads, bias_per_query, density, band) in [
            (1, None, false, 0.5, None),
            (2, Some(2), !per_query, 0.02, None),
            (4, Some(1), per_query, 0.9, Some(BandCtor::CausalWindow(40))),
            (2, Some(4), true, 0.3, Some(BandCtor::Window(Some(100), Some(3)))),
        ] {
            seed += 1;
            let c = VarlenCase {
                lens: lens.clone(),
                heads: 4,
                kv_heads: 2,
                head_dim: if seed % 2 == 0 { 64 } else { 128 },
                causal: band.is_none() && seed % 3 != 0,
                band,
                softcap: if seed % 4 == 0 { 10.0 } else { 0.0 },
                bias_heads,
                bias_per_query,
                mask: Some(VarlenMask { heads, per_query, density }),
                dtype: if seed % 3 == 1 { DType::F16 } else { DType::BF16 },
                page_size: None,
                sparse: None,
            };
            check_varlen(&c, &gpu, seed, true, false, gpu_tolerance(c.dtype)).unwrap();
            check_varlen(&c, &gpu, seed, true, true, gpu_tolerance(c.dtype)).unwrap();
            let (seqs, inputs) = (c.seqlens(&gpu), c.inputs(&mut seeded_rng(seed)).to(&gpu));
            let run = || grads_vec(&c.forward(&inputs, &seqs, true).unwrap().backward(&inputs.dout).unwrap());
            assert_same_bits(&run(), &run(), &c);
        }
    }
    // Key-side masks of more heads than their pack takes in one round (eight): 12, the second
    // round partial; 16, two whole rounds; and 8 (every kv head's) over a decoding batch (the
    // decoding kernel reads the mask's bytes; the backward packs it).
    let decoding = vec![(1, 700), (8, 3000), (0, 64), (3, 1), (5, 129)];
    for (i, (lens, heads, kv_heads)) in [(lens.clone(), 12, 4), (lens, 16, 8), (decoding, 8, 8)].into_iter().enumerate() {
        let c = VarlenCase {
            lens,
            heads,
            kv_heads,
            head_dim: 64,
            causal: true,
            band: None,
            softcap: 0.0,
            bias_heads: Some(kv_heads),
            bias_per_query: false,
            mask: Some(VarlenMask { heads, per_query: false, density: 0.3 }),
            dtype: DType::BF16,
            page_size: None,
            sparse: None,
        };
        check_varlen(&c, &gpu, 400 + i as u64, true, false, gpu_tolerance(c.dtype)).unwrap();
    }
}

/// Packed batches with sparse masks with data (`SparseMask::prepare_packed`): score masks,
/// block masks (bitset, dense blocks, BCSR; blocks of 64 and 128) and index lists, a plane per
/// sequence or one for all, with the batches' other options; forward and backward (every third
/// case deterministic, its gradients bit-identical from run to run).
#[test]
fn varlen_sparse_masks_match_reference() {
    let Some(gpu) = gpu() else { return };
    let cases = (varlen_cases(300), dmattn_tests::varlen::varlen_sparse()).prop_map(|((c, seed), sparse)| (VarlenCase { mask: None, sparse: Some(sparse), ..c }, seed));
    let property = |(c, seed): (VarlenCase, u64)| {
        let deterministic = seed % 3 == 0;
        check_varlen(&c, &gpu, seed, true, deterministic, gpu_tolerance(c.dtype))?;
        if deterministic {
            let cpu_inputs = c.inputs(&mut seeded_rng(seed));
            let (seqs, inputs) = (c.seqlens(&gpu), cpu_inputs.to(&gpu));
            let run = || grads_vec(&c.forward(&inputs, &seqs, true).unwrap().backward(&inputs.dout).unwrap());
            assert_same_bits(&run(), &run(), &c);
            // The estimate read from the GPU's block classes is at most the CPU's from the
            // sequences' own flags: edge tiles may also count scores the data keeps past a
            // sequence's end (`estimated_speedup`'s doc), never fewer.
            if let Some(spec) = cpu_inputs.sparse.as_ref().and_then(|d| d.spec.as_ref()) {
                let estimate = |dev: &Device| spec.build(dev).unwrap().prepare_packed(&c.seqlens(dev)).unwrap().estimated_speedup().unwrap();
                let (on_gpu, on_cpu) = (estimate(&gpu), estimate(&Device::Cpu));
                proptest::prop_assert!(on_gpu <= on_cpu * (1.0 + 1e-9), "estimated speedup {on_gpu} on the GPU, {on_cpu} on the CPU, for {c:?}");
            }
        }
        Ok(())
    };
    if let Err(e) = gpu_runner(1000).run(&cases, property) {
        panic!("{e}");
    }
}

/// Batches without any query, or without any key.
#[test]
fn varlen_empty_sides() {
    let Some(gpu) = gpu() else { return };
    for lens in [&[(0, 4)][..], &[(0, 0), (2, 0)], &[(3, 0)], &[(0, 300), (0, 1)]] {
        let c = VarlenCase { lens: lens.to_vec(), heads: 2, kv_heads: 1, head_dim: 64, causal: true, band: None, softcap: 0.0, bias_heads: None, bias_per_query: false, mask: None, dtype: DType::BF16, page_size: None, sparse: None };
        check_varlen(&c, &gpu, 3, true, false, gpu_tolerance(c.dtype)).unwrap();
    }
}

/// Decoding-shaped batches: 1-8 queries per sequence over up to 20K keys, where the forward
/// splits the keys (few CTAs otherwise), with and without causal; and one long prefill beside
/// short ones.
#[test]
fn varlen_decoding_batches() {
    let Some(gpu) = gpu() else { return };
    let batches: [&[(usize, usize)]; 3] = [
        &[(1, 20000), (8, 3000), (3, 1), (0, 500), (5, 12345)],
        &[(1, 1), (2, 4096)],
        &[(2000, 2000), (1, 64), (7, 8000)],
    ];
    for (i, lens) in batches.into_iter().enumerate() {
        for (causal, head_dim, dtype) in [(true, 128, DType::BF16), (false, 64, DType::F16)] {
            let c = VarlenCase {
                lens: lens.to_vec(),
                heads: 8,
                kv_heads: 2,
                head_dim,
                causal,
                band: None,
                softcap: 0.0,
                bias_heads: None,
                bias_per_query: false,
                // A key-side mask keeping a tenth of the keys, one per kv head.
                mask: (!causal).then_some(VarlenMask { heads: 2, per_query: false, density: 0.1 }),
                dtype,
                page_size: None,
                sparse: None,
            };
            check_varlen(
                &c,
                &gpu,
                100 + i as u64,
                i == 1,
                false,
                gpu_tolerance(dtype),
            )
            .unwrap();
        }
    }
}

/// `cu_seqlens` already on the GPU (as a framework holds them) serve as well as host slices,
/// one `SeqLens` serves several calls, and one on another device is a typed error. The `SeqLens`
/// keeps its own copy: the caller's tensors refilled in place after it was made (other valid
/// lengths, as a framework's next step would write) change nothing it computes.
#[test]
fn varlen_seqlens_from_device_tensors() {
    let Some(gpu) = gpu() else { return };
    let c = VarlenCase { lens: vec![(129, 200), (0, 5), (64, 64)], heads: 4, kv_heads: 2, head_dim: 64, causal: true, band: None, softcap: 0.0, bias_heads: None, bias_per_query: false, mask: None, dtype: DType::BF16, page_size: None, sparse: None };
    let inputs = c.inputs(&mut seeded_rng(11)).to(&gpu);
    let i32s = |v: &[i32]| Tensor::from_vec(v.to_vec(), &[v.len()], &gpu).unwrap();
    let (cu_q, cu_k) = (i32s(&[0, 129, 129, 193]), i32s(&[0, 200, 205, 269]));
    let from_device = SeqLens::from_tensors(&cu_q, &cu_k).unwrap();
    for (dst, next) in [(&cu_q, [0, 1, 2, 3]), (&cu_k, [0, 1, 2, 3])] {
        let src = i32s(&next);
        // Read back: its upload on dmattn's stream is done before the plain copy below.
        assert_eq!(src.to_vec::<i32>().unwrap(), next);
        let (d, s) = (dst.device_ptr().unwrap(), src.device_ptr().unwrap());
        // Safety: both are live device buffers of four int32s; the context is idle again (the
        // copy done) before `src` is freed or anything reads `dst`.
        unsafe { dmattn::cudarc::driver::result::memcpy_dtod_sync(d, s, 16).unwrap() };
        dmattn::cudarc::driver::result::ctx::synchronize().unwrap();
        assert_eq!(dst.to_vec::<i32>().unwrap(), next, "the caller's tensor was refilled");
    }
    let from_host = c.seqlens(&gpu);
    let run = |seqs: &SeqLens| {
        let fwd = c.forward(&inputs, seqs, true).unwrap();
        (fwd.out.to_f64_vec().unwrap(), grads_vec(&fwd.backward(&inputs.dout).unwrap()))
    };
    let (out, grads) = run(&from_host);
    for _ in 0..2 {
        let (again, grads_again) = run(&from_device);
        assert!(out.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()), "outputs differ between SeqLens built on the host and on the device");
        assert_same_bits(&grads, &grads_again, &c);
    }
    let on_cpu = c.seqlens(&Device::Cpu);
    match attention(&inputs.q, &inputs.k, &inputs.v).seqlens(&on_cpu).forward() {
        Err(Error::Device { arg, .. }) => assert_eq!(arg, "seqlens"),
        Err(e) => panic!("expected a device error naming seqlens, got {e}"),
        Ok(_) => panic!("expected a device error naming seqlens"),
    }
}

/// The paged call's O and LSE equal the packed call's bit for bit (the same kernel products on
/// rows read from the pages).
fn assert_paged_equals_packed(c: &VarlenCase, gpu: &Device, seed: u64) -> Result<(), TestCaseError> {
    let inputs = c.inputs(&mut seeded_rng(seed)).to(gpu);
    let seqs = c.seqlens(gpu);
    let paged = c.forward(&inputs, &seqs, false).map_err(|e| TestCaseError::fail(format!("paged forward: {e}")))?;
    let packed = VarlenCase { page_size: None, ..c.clone() }.forward(&inputs, &seqs, false).unwrap();
    for (name, a, b) in [("out", &paged.out, &packed.out), ("lse", &paged.lse, &packed.lse)] {
        let (a, b) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
        proptest::prop_assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "paged {name} differs from packed for {c:?}");
    }
    Ok(())
}

/// Paged K/V (page sizes 1, 4, 16, 64, 128 and 256; pages in random order, rows no key owns NaN): the
/// forward matches the reference and equals the packed call bit for bit.
#[test]
fn paged_forward_matches_reference_and_packed() {
    let Some(gpu) = gpu() else { return };
    varlen_property(2000, 300, |(c, seed)| {
        // (A paged call takes no mask yet.)
        let c = VarlenCase { page_size: Some([1, 4, 16, 64, 128, 256][seed as usize % 6]), mask: None, sparse: None, ..c };
        check_varlen(&c, &gpu, seed, false, false, gpu_tolerance(c.dtype))?;
        assert_paged_equals_packed(&c, &gpu, seed)
    });
}

/// Decoding over pages: 1-8 queries per sequence over up to 20K keys (split-KV), bit-identical
/// to the packed call, and against the reference.
#[test]
fn paged_decoding_batches() {
    let Some(gpu) = gpu() else { return };
    let lens = [(1, 20000), (8, 3000), (3, 1), (0, 500), (5, 12345), (1, 64)];
    for (i, (page_size, head_dim, dtype)) in [(64, 128, DType::BF16), (256, 64, DType::F16), (128, 256, DType::BF16)].into_iter().enumerate() {
        let c = VarlenCase {
            lens: lens.to_vec(),
            heads: 8,
            kv_heads: 2,
            head_dim,
            causal: i != 1,
            band: None,
            softcap: 0.0,
            bias_heads: Some(2),
            bias_per_query: false,
            mask: None,
            dtype,
            page_size: Some(page_size),
            sparse: None,
        };
        check_varlen(&c, &gpu, 200 + i as u64, false, false, gpu_tolerance(dtype)).unwrap();
        assert_paged_equals_packed(&c, &gpu, 200 + i as u64).unwrap();
    }
}

/// A block table from a device tensor serves as one from host entries; one on another device
/// is a typed error.
#[test]
fn paged_table_from_device_tensor() {
    let Some(gpu) = gpu() else { return };
    let c = VarlenCase { lens: vec![(3, 200), (1, 70)], heads: 4, kv_heads: 2, head_dim: 64, causal: true, band: None, softcap: 0.0, bias_heads: None, bias_per_query: false, mask: None, dtype: DType::BF16, page_size: Some(64), sparse: None };
    let inputs = c.inputs(&mut seeded_rng(5)).to(&gpu);
    let pages = inputs.pages.as_ref().unwrap();
    let seqs = c.seqlens(&gpu);
    let table = PageTable::from_tensor(&Tensor::from_vec(pages.table.clone(), &[2, pages.table.len() / 2], &gpu).unwrap()).unwrap();
    let a = attention(&inputs.q, &pages.k(), &pages.v()).seqlens(&seqs).kv_pages(&table).causal(true).forward().unwrap();
    let b = c.forward(&inputs, &seqs, false).unwrap();
    assert_eq!(a.out.to_f64_vec().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.out.to_f64_vec().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    let on_cpu = PageTable::new(&pages.table, 2, &Device::Cpu).unwrap();
    match attention(&inputs.q, &pages.k(), &pages.v()).seqlens(&seqs).kv_pages(&on_cpu).forward() {
        Err(Error::Device { arg, .. }) => assert_eq!(arg, "block_table"),
        Err(e) => panic!("expected a device error naming block_table, got {e}"),
        Ok(_) => panic!("expected a device error naming block_table"),
    }
}
