//! The materialising (unfused) forward, S = QKᵀ and O = PV on cuBLAS with the row softmax kernel
//! between them: against the f64 CPU reference (property tests over dtypes, head dims, causal,
//! mask/bias broadcasts, GQA/MQA, odd lengths, sq = 1, empty rows), against the fused forward
//! on a shape too large for the reference, the backward from its result, the head dims and
//! layouts only it takes, and an S too large for the device (strided q/k/v views and all-false
//! masks: `gpu_forward`, for both paths). Skips, saying why, where there is no CUDA device.
use dmattn::{DType, Device, Error, Tensor, attention};
use dmattn_tests::*;

#[test]
fn materialized_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gpu_property(400, 300, |(case, seed)| check_gpu_forward(&case, ForwardPath::Materialized, &gpu, &case.inputs(&mut seeded_rng(seed))));
}

/// The fused backward run from the materialising forward's O and LSE (it prepares the mask the
/// fused forward would have) against the reference's gradients.
#[test]
fn backward_from_materialized_forward() {
    let Some(gpu) = gpu() else { return };
    gpu_property(150, 200, |(case, seed)| check_gpu_backward(&case, ForwardPath::Materialized, &gpu, seed, false));
}

/// Head dims the fused kernels do not ship, and q/k/v rows with no 16-byte alignment: cuBLAS
/// takes them, so this path does.
#[test]
fn any_head_dim_and_unaligned_rows() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("any_head_dim_and_unaligned_rows");
    for &(dtype, d, sq, sk, h, hk) in &[(DType::BF16, 8, 33, 70, 2, 1), (DType::F16, 40, 64, 64, 3, 3), (DType::BF16, 100, 17, 129, 4, 2), (DType::F16, 3, 5, 9, 1, 1)] {
        let case = Case { dtype, mask: Some([1, hk, sq, sk]), bias: Some([1, 1, 1, sk]), causal: true, ..Case::new(2, sq, sk, h, hk, d) };
        check_gpu_forward(&case, ForwardPath::Materialized, &gpu, &case.inputs(&mut rng)).unwrap();
    }
}

/// A shape too large for the CPU reference: the fused and the materialising forward agree
/// element by element (b 1, h 4, hk 2, d 128, sq = sk = 4096, block mask and bias, bf16). Both
/// round P to bf16; the materialising path also rounds S, so a logit x moves by up to
/// 2^-8 |x| and each probability by that relatively. An O row is a convex combination of V
/// rows, so its error is bounded relative to V's scale (its own size shrinks where the weights
/// spread: a bound relative to the row's own rms failed on an H100 at 1.05 of it, 1.2e-2 on a
/// row of rms 0.2); that on LSE is 2^-8 of the largest |logit| plus the fused forward's LSE
/// tolerance.
#[test]
fn large_shape_matches_fused() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("large_shape_matches_fused");
    for causal in [false, true] {
        let (s, h, hk, d) = (4096, 4, 2, 128);
        let case = Case {
            mask: Some([1, hk, s, s]),
            mask_pattern: MaskPattern::Blocks(0.6),
            bias: Some([1, 1, s, s]),
            causal,
            dtype: DType::BF16,
            ..Case::new(1, s, s, h, hk, d)
        };
        let inputs = case.inputs(&mut rng).to(&gpu);
        dmattn::set_output_poisoning(true);
        let fused = case.forward_by(&inputs, ForwardPath::Fused).unwrap();
        let mat = case.forward_by(&inputs, ForwardPath::Materialized).unwrap();
        let (o, o_ref) = (mat.out.to_f64_vec().unwrap(), fused.out.to_f64_vec().unwrap());
        let (lse, lse_ref) = (mat.lse.to_f64_vec().unwrap(), fused.lse.to_f64_vec().unwrap());
        assert!(o.iter().all(|x| x.is_finite()), "non-finite output for {case:?}");
        let v = inputs.v.to_f64_vec().unwrap();
        let v_rms = (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
        let bound = 2.5e-2 * v_rms + 1e-3;
        // Each (b, i, h) row of d values against V's scale.
        let mut worst = 0.0f64;
        for (r, (a, b)) in o.chunks(d).zip(o_ref.chunks(d)).enumerate() {
            let err = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
            assert!(err <= bound, "causal {causal}: out row {r}: max err {err:.3e}, bound {bound:.3e}");
            worst = worst.max(err / bound);
        }
        let lse_err = max_abs_err_inf(&lse, &lse_ref);
        let err = rel_err(&o, &o_ref);
        eprintln!("large_shape_matches_fused: causal {causal}: out rel err {err:.3e}, worst row at {worst:.2} of its bound, lse max err {lse_err:.3e}");
        assert!(lse_err <= 5e-2, "causal {causal}: lse max err {lse_err:.3e}");
        assert!(err <= gpu_tolerance(DType::BF16), "causal {causal}: out rel err {err:.3e}");
    }
}

/// An S the device cannot hold (2 TiB) is a typed error, not a panic, and the device works on.
#[test]
fn scores_too_large_for_the_device() {
    let Some(gpu) = gpu() else { return };
    let s = 1 << 20;
    let zeros = |heads: usize| Tensor::from_fn(&[1, s, heads, 16], DType::BF16, &gpu, |_| 0.0).unwrap();
    let (q, kv) = (zeros(1), zeros(1));
    let result = attention(&q, &kv, &kv).forward_materialized();
    assert!(matches!(result, Err(Error::Driver(_))), "expected an out-of-memory error, got {:?}", result.err());
    let case = Case { dtype: DType::BF16, ..Case::new(1, 70, 90, 2, 1, 64) };
    check_gpu_forward(&case, ForwardPath::Materialized, &gpu, &case.inputs(&mut fresh_rng("after_oom"))).unwrap();
}

/// Layouts cuBLAS cannot read are refused with a typed error naming the argument.
#[test]
fn rejects_layouts_cublas_cannot_read() {
    let Some(gpu) = gpu() else { return };
    let case = Case { dtype: DType::BF16, ..Case::new(1, 8, 8, 1, 1, 64) };
    let i = case.inputs(&mut fresh_rng("materialized_rejects")).to(&gpu);
    let big = Tensor::from_fn(&[1, 8, 1, 128], DType::BF16, &Device::Cpu, |x| x as f64 * 0.01).unwrap().to_device(&gpu).unwrap();
    // Every other element along head_dim.
    let q = big.as_strided(&[1, 8, 1, 64], &[1024, 128, 128, 2], 0).unwrap();
    assert!(matches!(attention(&q, &i.k, &i.v).forward_materialized(), Err(Error::Layout { arg: "q", .. })));
    // Rows overlapping: sequence stride 32 < head_dim 64.
    let k = big.as_strided(&[1, 8, 1, 64], &[1024, 32, 64, 1], 0).unwrap();
    assert!(matches!(attention(&i.q, &k, &i.v).forward_materialized(), Err(Error::Layout { arg: "k", .. })));
}
