//! The fused backward kernel against the f64 CPU reference: every gradient (dq, dk, dv, dbias
//! under every bias broadcast shape), GQA/MQA, causal, softcap, masks with empty tiles and rows;
//! and the deterministic mode's bit-identical runs. Skips, saying why, without a CUDA device.
use dmattn::{DType, Device, Tensor};
use dmattn_tests::*;
use proptest::prelude::*;

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 5e-3,
        other => panic!("no GPU tolerance for {other:?}"),
    }
}

/// A random output gradient in `dtype`, on the CPU.
fn dout(case: &Case, seed: u64) -> Tensor {
    let mut rng = seeded_rng(seed);
    use rand::Rng;
    let shape = case.q_shape();
    let vals: Vec<f64> = (0..shape.iter().product()).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
    Tensor::from_fn(&shape, case.dtype, &Device::Cpu, |i| vals[i]).unwrap()
}

/// (dq, dk, dv, dbias) of `case` on `device`.
fn gradients(case: &Case, inputs: &Inputs, dout: &Tensor, deterministic: bool) -> [Option<Vec<f64>>; 4] {
    let fwd = case.call(inputs).deterministic(deterministic).forward().unwrap();
    let g = fwd.backward(&dout.to_device(&inputs.q.device()).unwrap()).unwrap();
    [Some(g.dq), Some(g.dk), Some(g.dv), g.dbias].map(|t| t.map(|t| t.to_f64_vec().unwrap()))
}

fn check(case: &Case, gpu: &Device, seed: u64, deterministic: bool) -> Result<(), TestCaseError> {
    dmattn::set_output_poisoning(true);
    let inputs = case.inputs(&mut seeded_rng(seed));
    let dout = dout(case, seed ^ 0x5EED);
    let want = gradients(case, &inputs, &dout, false);
    let got = gradients(case, &inputs.to(gpu), &dout, deterministic);
    // Errors are measured against the size of the sums each gradient is made of (see
    // `naive::backward_magnitudes`): cancellation can make a gradient far smaller than the
    // rounding a 16-bit backward (dS and P rounded, delta from the rounded O) necessarily makes.
    let (spec, data) = (naive::Spec::of(case), naive::Data::of(&inputs));
    let mags = naive::backward_magnitudes(&spec, &data, &naive::forward(&spec, &data), &dout.to_f64_vec().unwrap());
    let mags = [Some(mags.dq), Some(mags.dk), Some(mags.dv), mags.dbias];
    for (name, ((g, w), m)) in ["dq", "dk", "dv", "dbias"].iter().zip(got.iter().zip(&want).zip(&mags)) {
        let (Some(g), Some(w), Some(m)) = (g, w, m) else {
            prop_assert!(g.is_none() && w.is_none(), "{name}: present on one side only for {case:?}");
            continue;
        };
        prop_assert!(g.iter().all(|x| x.is_finite()), "{name}: non-finite (unwritten or NaN) for {case:?}");
        let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
        let (err, size) = (norm(&mut g.iter().zip(w).map(|(a, b)| a - b)), norm(&mut m.iter().copied()));
        prop_assert!(err <= tolerance(case.dtype) * size, "{name}: error {:.3e} of magnitude {size:.3e} ({:.3e}) for {case:?}", err, err / size);
    }
    Ok(())
}


#[test]
fn backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    if let Err(e) = gpu_runner(2000).run(&gpu_cases(200), |(case, seed)| check(&case, &gpu, seed, false)) {
        panic!("{e}");
    }
}

#[test]
fn deterministic_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    if let Err(e) = gpu_runner(300).run(&gpu_cases(200), |(case, seed)| check(&case, &gpu, seed, true)) {
        panic!("{e}");
    }
}

/// Two deterministic runs give bit-identical gradients, on problems large enough that many CTAs
/// add to the same dQ rows and (broadcast) dbias elements.
#[test]
fn deterministic_runs_are_bit_identical() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("deterministic_runs_are_bit_identical");
    for case in [
        Case { bias: Some([1, 1, 300, 700]), mask: Some([2, 1, 300, 700]), mask_pattern: MaskPattern::Blocks(0.7), dtype: DType::BF16, ..Case::new(2, 300, 700, 4, 2, 64) },
        Case { bias: Some([1, 4, 1, 500]), causal: true, dtype: DType::F16, ..Case::new(2, 500, 500, 4, 4, 128) },
        Case { bias: Some([2, 1, 200, 200]), softcap: 15.0, dtype: DType::BF16, ..Case::new(2, 200, 200, 6, 2, 256) },
    ] {
        let seed = rand::Rng::random(&mut rng);
        let inputs = case.inputs(&mut seeded_rng(seed)).to(&gpu);
        let dout = dout(&case, seed);
        let first = gradients(&case, &inputs, &dout, true);
        for _ in 0..3 {
            let again = gradients(&case, &inputs, &dout, true);
            for (name, (a, b)) in ["dq", "dk", "dv", "dbias"].iter().zip(first.iter().zip(&again)) {
                let same = match (a, b) {
                    (Some(a), Some(b)) => a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    (a, b) => a.is_none() && b.is_none(),
                };
                assert!(same, "{name} differs between deterministic runs for {case:?}");
            }
        }
    }
}

/// A mask hiding everything gives exactly zero gradients, no NaN.
#[test]
fn all_false_mask_gives_zero_gradients() {
    let Some(gpu) = gpu() else { return };
    let case = Case {
        mask: Some([1, 1, 130, 200]),
        mask_pattern: MaskPattern::Random(0.0),
        bias: Some([2, 2, 130, 200]),
        dtype: DType::BF16,
        ..Case::new(2, 130, 200, 4, 2, 64)
    };
    let inputs = case.inputs(&mut fresh_rng("all_false_mask_gives_zero_gradients")).to(&gpu);
    dmattn::set_output_poisoning(true);
    for g in gradients(&case, &inputs, &dout(&case, 7), false).into_iter().flatten() {
        assert!(g.iter().all(|&x| x == 0.0), "nonzero gradient under an all-false mask");
    }
}
