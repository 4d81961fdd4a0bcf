//! Property tests over random problems: shapes (b 1-2, sq and sk 1-70, h in {1, 2, 4} with
//! kv_heads dividing h, d 1-16), mask and bias broadcast shapes, mask patterns (including all
//! false), causal, scale and softcap.
//!
//! The whole run is reproducible: the proptest generator is seeded from `fresh_rng` (set
//! `DMATTN_SEED` to the printed seed to replay it), and each case's data from a seed it draws.
//! Failures are not persisted to files (replay with the seed instead).
use dmattn::{DType, set_output_poisoning};
use dmattn_tests::{Case, MaskPattern, broadcast_shape, check_backward, check_forward, fresh_rng, naive, random_dout, rel_err, seeded_rng};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use rand::Rng;

fn config(test: &str, cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(fresh_rng(test).random()),
        failure_persistence: None,
        max_shrink_iters: 256,
        ..ProptestConfig::default()
    }
}

fn pattern() -> impl Strategy<Value = MaskPattern> {
    let p = || prop_oneof![1 => Just(0.0), 1 => Just(1.0), 4 => 0.02..0.98f64];
    prop_oneof![p().prop_map(MaskPattern::Random), p().prop_map(MaskPattern::Blocks), p().prop_map(MaskPattern::EmptyRows)]
}

/// A random f64 case and the seed of its data.
fn cases() -> impl Strategy<Value = (Case, u64)> {
    let heads = prop::sample::select(vec![(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)]);
    (1..=2usize, 1..=70usize, 1..=70usize, heads, 1..=16usize)
        .prop_flat_map(|(b, sq, sk, (h, hk), d)| {
            (
                Just(Case { dtype: DType::F64, ..Case::new(b, sq, sk, h, hk, d) }),
                prop::option::weighted(0.7, broadcast_shape(b, h, hk, sq, sk)),
                pattern(),
                prop::option::weighted(0.5, broadcast_shape(b, h, hk, sq, sk)),
                any::<bool>(),
                prop::option::weighted(0.3, 0.05..3.0f64),
                prop_oneof![2 => Just(0.0), 1 => 0.2..30.0f64],
                any::<u64>(),
            )
        })
        .prop_map(|(c, mask, mask_pattern, bias, causal, scale, softcap, seed)| (Case { mask, mask_pattern, bias, causal, scale, softcap, ..c }, seed))
}

/// Tolerance of O computed from inputs in `dt`, against f64 on the same (rounded) input values.
/// On the CPU those differ only by O's rounding to `dt` (unit roundoff 3.9e-3 for bf16, 4.9e-4
/// for f16, 6e-8 for f32). Against the f64 result on the unrounded inputs the input rounding adds
/// to it: measured worst cases over 2000 random problems (default scale) were 6.3e-3 (bf16),
/// 1.2e-3 (f16) and 1.1e-7 (f32), and the error grows with the scale, so only f32 is also held
/// to its tolerance against the unrounded inputs.
fn tolerance(dt: DType) -> f64 {
    match dt {
        DType::BF16 => 1e-2,
        DType::F16 => 5e-3,
        DType::F32 => 1e-5,
        _ => unreachable!(),
    }
}

proptest! {
    #![proptest_config(config("forward_matches_naive", 128))]
    /// O and LSE against the naive implementation; O finite; LSE -inf exactly on rows with no
    /// visible key (mask and causal alone decide which).
    #[test]
    fn forward_matches_naive((case, seed) in cases()) {
        set_output_poisoning(true);
        let inputs = case.inputs(&mut seeded_rng(seed));
        check_forward(&case, &inputs, 1e-12).map_err(TestCaseError::fail)?;
        let fwd = case.forward(&inputs).unwrap();
        let lse = fwd.lse.to_f64_vec().unwrap();
        let has_key = naive::row_has_key(&naive::Spec::of(&case), &naive::Data::of(&inputs));
        prop_assert_eq!(lse.len(), has_key.len());
        for (r, (&l, &k)) in lse.iter().zip(&has_key).enumerate() {
            prop_assert!(if k { l.is_finite() } else { l == f64::NEG_INFINITY }, "{:?}: row {} sees a key: {}, LSE {}", case, r, k, l);
        }
        prop_assert!(fwd.out.to_f64_vec().unwrap().iter().all(|x| x.is_finite()), "{:?}: O not finite", case);
    }
}

proptest! {
    #![proptest_config(config("dtype_round_trips", 128))]
    /// F32 / F16 / BF16 inputs: O (in the input dtype, finite) within the dtype's tolerance of
    /// the f64 result on the same input values, LSE (f32) within f32 rounding and -inf on the
    /// same rows.
    #[test]
    fn dtype_round_trips((case, seed) in cases()) {
        set_output_poisoning(true);
        let inputs = case.inputs(&mut seeded_rng(seed));
        for dt in [DType::F32, DType::F16, DType::BF16] {
            let low = inputs.cast(dt);
            let exact = low.cast(DType::F64);
            let want = case.forward(&exact).unwrap();
            let got = Case { dtype: dt, ..case.clone() }.forward(&low).unwrap();
            prop_assert_eq!(got.out.dtype(), dt);
            prop_assert_eq!(got.lse.dtype(), DType::F32);
            let (o, wo) = (got.out.to_f64_vec().unwrap(), want.out.to_f64_vec().unwrap());
            prop_assert!(o.iter().all(|x| x.is_finite()), "{:?} {:?}: O not finite", case, dt);
            let e = rel_err(&o, &wo);
            prop_assert!(e <= tolerance(dt), "{:?} {:?}: O rel err {:e} > {:e}", case, dt, e, tolerance(dt));
            let (l, wl) = (got.lse.to_f64_vec().unwrap(), want.lse.to_f64_vec().unwrap());
            for (r, (&a, &b)) in l.iter().zip(&wl).enumerate() {
                let ok = if b == f64::NEG_INFINITY { a == b } else { (a - b).abs() <= 1e-6 * b.abs().max(1.0) };
                prop_assert!(ok, "{:?} {:?}: LSE row {} = {}, f64 gives {}", case, dt, r, a, b);
            }
            if dt == DType::F32 {
                let unrounded = case.forward(&inputs).unwrap().out.to_f64_vec().unwrap();
                let e = rel_err(&o, &unrounded);
                prop_assert!(e <= tolerance(dt), "{:?} F32: O rel err {:e} > {:e} against f64 on the unrounded inputs", case, e, tolerance(dt));
            }
            // And the same against the naive implementation on the rounded values.
            check_forward(&Case { dtype: dt, ..case.clone() }, &low, tolerance(dt)).map_err(TestCaseError::fail)?;
        }
    }
}

proptest! {
    #![proptest_config(config("backward_matches_naive", 128))]
    /// dq, dk, dv and dbias against the naive backward pass.
    #[test]
    fn backward_matches_naive((case, seed) in cases()) {
        set_output_poisoning(true);
        let mut rng = seeded_rng(seed);
        let inputs = case.inputs(&mut rng);
        let dout = random_dout(&case, &mut rng);
        check_backward(&case, &inputs, &dout, 1e-12).map_err(TestCaseError::fail)?;
    }
}
