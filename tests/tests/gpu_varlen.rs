//! Packed variable-length batches on the GPU, each sequence checked against its own
//! fixed-length call on the f64 CPU reference (`dmattn_tests::varlen::check_varlen`): property
//! tests over random batches (1-6 sequences, lengths 0 to 300 drawn apart for queries and keys,
//! 16-bit dtypes, every head dim, GQA, causal, windows, softcap), forward, backward and the
//! deterministic backward; bit-identical deterministic gradients; decoding-shaped batches (a
//! few queries over long keys, split-KV). `DMATTN_GPU_CASES` sets the property tests' case
//! counts. Skips, saying why, where there is no CUDA device.
use dmattn::{DType, Device, Error, SeqLens, Tensor, attention};
use dmattn_tests::varlen::{VarlenCase, check_varlen, varlen_cases};
use dmattn_tests::*;
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
    // (A packed batch's bias is not taken in deterministic mode.)
    varlen_property(150, 200, |(c, seed)| {
        check_varlen(&VarlenCase { bias_heads: None, ..c }, &gpu, seed, true, true, gpu_tolerance(c.dtype))
    });
}

/// Two deterministic runs give bit-identical gradients on a batch whose sequences have many
/// key tiles adding to each dQ tile.
#[test]
fn varlen_deterministic_runs_are_bit_identical() {
    let Some(gpu) = gpu() else { return };
    let c = VarlenCase {
        lens: vec![(700, 900), (0, 64), (333, 333), (1, 1000)],
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        causal: true,
        band: None,
        softcap: 0.0,
        bias_heads: None,
        dtype: DType::BF16,
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

/// Batches without any query, or without any key.
#[test]
fn varlen_empty_sides() {
    let Some(gpu) = gpu() else { return };
    for lens in [&[(0, 4)][..], &[(0, 0), (2, 0)], &[(3, 0)], &[(0, 300), (0, 1)]] {
        let c = VarlenCase { lens: lens.to_vec(), heads: 2, kv_heads: 1, head_dim: 64, causal: true, band: None, softcap: 0.0, bias_heads: None, dtype: DType::BF16 };
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
                dtype,
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
/// one `SeqLens` serves several calls, and one on another device is a typed error.
#[test]
fn varlen_seqlens_from_device_tensors() {
    let Some(gpu) = gpu() else { return };
    let c = VarlenCase { lens: vec![(129, 200), (0, 5), (64, 64)], heads: 4, kv_heads: 2, head_dim: 64, causal: true, band: None, softcap: 0.0, bias_heads: None, dtype: DType::BF16 };
    let inputs = c.inputs(&mut seeded_rng(11)).to(&gpu);
    let i32s = |v: &[i32]| Tensor::from_vec(v.to_vec(), &[v.len()], &gpu).unwrap();
    let from_device = SeqLens::from_tensors(&i32s(&[0, 129, 129, 193]), &i32s(&[0, 200, 205, 269])).unwrap();
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
