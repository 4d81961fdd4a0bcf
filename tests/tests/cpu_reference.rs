//! The CPU forward (O, LSE) and backward of the public API against the independent naive
//! implementation of `dmattn_tests::naive` (full `[b, h, sq, sk]` matrices, every broadcast
//! expanded explicitly), in f64, plus a few closed-form cases that need no reference at all.
//!
//! Tolerances: both sides compute in f64 from the same f64 inputs, only in different orders, so
//! they agree to a few ulps of the result (~1e-15 relative); 1e-12 leaves a wide margin for
//! summation order while any semantic error (a wrong broadcast, causal offset, softcap or scale)
//! is O(1e-2) or more.
use dmattn::{DType, Device, Tensor, attention, set_output_poisoning};
use dmattn_tests::{Case, ForwardPath, Inputs, MaskPattern, check_backward, check_forward, fresh_rng, naive, random_dout, rel_err};
use rand::Rng;
use rand::rngs::StdRng;

const TOL: f64 = 1e-12;

fn case(b: usize, sq: usize, sk: usize, h: usize, hk: usize, d: usize) -> Case {
    Case { dtype: DType::F64, ..Case::new(b, sq, sk, h, hk, d) }
}

/// Forward and backward of `case` on fresh inputs against the naive implementation.
fn run(case: &Case, rng: &mut StdRng) -> Result<(), String> {
    let inputs = case.inputs(rng);
    check_forward(case, &inputs, TOL)?;
    let dout = random_dout(case, rng);
    check_backward(case, &inputs, &dout, TOL)
}

/// Runs every case, then fails listing each one that failed.
fn run_all(cases: &[Case], rng: &mut StdRng) {
    assert!(!cases.is_empty());
    let failures: Vec<String> = cases.iter().filter_map(|c| run(c, rng).err()).collect();
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// Every broadcast shape `[{1|b}, {1|hk|h}, {1|sq}, {1|sk}]` (duplicates removed).
fn all_broadcast_shapes(b: usize, h: usize, hk: usize, sq: usize, sk: usize) -> Vec<[usize; 4]> {
    let mut out = Vec::new();
    for bb in [1, b] {
        for hh in [1, hk, h] {
            for qq in [1, sq] {
                for kk in [1, sk] {
                    let s = [bb, hh, qq, kk];
                    if !out.contains(&s) {
                        out.push(s);
                    }
                }
            }
        }
    }
    out
}

fn cpu_f64(vals: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(vals.to_vec(), shape, &Device::Cpu).unwrap()
}

#[test]
fn mha_gqa_mqa() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("mha_gqa_mqa");
    let mut cases = Vec::new();
    for (h, hk) in [(1, 1), (2, 2), (4, 2), (4, 1), (6, 3), (6, 2), (8, 1)] {
        for (b, sq, sk, d) in [(1, 1, 1, 1), (2, 5, 9, 8), (1, 13, 6, 3), (2, 17, 17, 16)] {
            for causal in [false, true] {
                cases.push(Case { causal, ..case(b, sq, sk, h, hk, d) });
            }
        }
    }
    run_all(&cases, &mut rng);
}

#[test]
fn mask_every_broadcast_shape() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("mask_every_broadcast_shape");
    let (b, h, hk, sq, sk) = (2, 4, 2, 6, 7);
    let shapes = all_broadcast_shapes(b, h, hk, sq, sk);
    assert_eq!(shapes.len(), 24);
    let mut cases = Vec::new();
    for s in shapes {
        for pattern in [MaskPattern::Random(0.6), MaskPattern::EmptyRows(0.7), MaskPattern::Blocks(0.5)] {
            for causal in [false, true] {
                cases.push(Case { mask: Some(s), mask_pattern: pattern, causal, ..case(b, sq, sk, h, hk, 5) });
            }
        }
    }
    // MQA, where a head dim of kv_heads is a head dim of 1.
    for s in all_broadcast_shapes(2, 3, 1, 4, 5) {
        cases.push(Case { mask: Some(s), ..case(2, 4, 5, 3, 1, 4) });
    }
    run_all(&cases, &mut rng);
}

#[test]
fn bias_every_broadcast_shape() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("bias_every_broadcast_shape");
    let (b, h, hk, sq, sk) = (2, 4, 2, 6, 7);
    let mut cases = Vec::new();
    for s in all_broadcast_shapes(b, h, hk, sq, sk) {
        cases.push(Case { bias: Some(s), ..case(b, sq, sk, h, hk, 5) });
        cases.push(Case { bias: Some(s), causal: true, softcap: 3.0, ..case(b, sq, sk, h, hk, 5) });
        // With a full mask holding empty rows: hidden scores must not leak their bias.
        cases.push(Case { bias: Some(s), mask: Some([b, h, sq, sk]), mask_pattern: MaskPattern::EmptyRows(0.6), ..case(b, sq, sk, h, hk, 5) });
    }
    run_all(&cases, &mut rng);
}

#[test]
fn mask_and_bias_of_different_shapes() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("mask_and_bias_of_different_shapes");
    let (b, h, hk, sq, sk) = (2, 6, 3, 5, 8);
    let shapes = all_broadcast_shapes(b, h, hk, sq, sk);
    let mut cases = Vec::new();
    for (n, &m) in shapes.iter().enumerate() {
        let bias = shapes[(n * 7 + 5) % shapes.len()];
        cases.push(Case { mask: Some(m), bias: Some(bias), causal: n % 2 == 0, softcap: if n % 3 == 0 { 2.0 } else { 0.0 }, ..case(b, sq, sk, h, hk, 4) });
    }
    run_all(&cases, &mut rng);
}

#[test]
fn causal_alignment() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("causal_alignment");
    let mut cases = Vec::new();
    for (sq, sk) in [(1, 1), (1, 9), (9, 1), (3, 11), (8, 8), (11, 3), (64, 70), (70, 64)] {
        cases.push(Case { causal: true, ..case(2, sq, sk, 2, 1, 4) });
        cases.push(Case { causal: true, mask: Some([2, 1, sq, sk]), mask_pattern: MaskPattern::Random(0.8), ..case(2, sq, sk, 2, 1, 4) });
        cases.push(Case { causal: true, bias: Some([1, 2, sq, sk]), ..case(2, sq, sk, 2, 1, 4) });
    }
    run_all(&cases, &mut rng);

    // Causal is exactly an explicit bottom-right mask (j <= i + sk - sq), and rows above the
    // diagonal's start (i < sq - sk) see nothing: O = 0, LSE = -inf.
    for (sq, sk) in [(4, 9), (6, 6), (9, 4), (12, 2)] {
        let c = Case { causal: true, bias: Some([1, 1, sq, sk]), ..case(1, sq, sk, 2, 2, 8) };
        let inputs = c.inputs(&mut rng);
        let causal = c.forward(&inputs).unwrap();
        let explicit = Tensor::from_fn(&[1, 1, sq, sk], DType::Bool, &Device::Cpu, |x| ((x % sk) + sq <= x / sk + sk) as u8 as f64).unwrap();
        let masked = attention(&inputs.q, &inputs.k, &inputs.v).mask(&explicit).bias(inputs.bias.as_ref().unwrap()).forward().unwrap();
        let (o1, o2) = (causal.out.to_f64_vec().unwrap(), masked.out.to_f64_vec().unwrap());
        assert!(rel_err(&o1, &o2) <= TOL, "{c:?}: causal and the explicit bottom-right mask differ in O");
        let (l1, l2) = (causal.lse.to_f64_vec().unwrap(), masked.lse.to_f64_vec().unwrap());
        for h in 0..2 {
            for i in 0..sq {
                let (a, e) = (l1[h * sq + i], l2[h * sq + i]);
                assert!(a == e || (a - e).abs() <= TOL * e.abs().max(1.0), "{c:?}: LSE (h {h}, i {i}) {a} vs {e}");
                let empty = i + sk < sq;
                assert_eq!(a == f64::NEG_INFINITY, empty, "{c:?}: LSE (h {h}, i {i}) = {a}; the row sees {} keys", (i + sk + 1).saturating_sub(sq));
                let row = &o1[(i * 2 + h) * 8..][..8];
                if empty {
                    assert!(row.iter().all(|&x| x == 0.0), "{c:?}: row (h {h}, i {i}) sees no key but O = {row:?}");
                } else {
                    assert!(row.iter().any(|&x| x != 0.0), "{c:?}: row (h {h}, i {i}) sees keys but O = 0");
                }
            }
        }
    }
}

#[test]
fn softcap_and_scale() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("softcap_and_scale");
    let mut cases = Vec::new();
    for softcap in [0.0, 0.3, 1.0, 5.0, 30.0] {
        for scale in [None, Some(0.05), Some(0.5), Some(3.0)] {
            cases.push(Case { softcap, scale, bias: Some([2, 2, 1, 9]), ..case(2, 7, 9, 4, 2, 6) });
            cases.push(Case { softcap, scale, causal: true, mask: Some([1, 4, 7, 9]), ..case(2, 7, 9, 4, 2, 6) });
        }
    }
    run_all(&cases, &mut rng);

    // Closed forms: a huge cap is (to 1e-9) no cap; the default scale is 1/sqrt(d).
    let c = Case { bias: Some([1, 1, 5, 6]), ..case(1, 5, 6, 2, 1, 16) };
    let inputs = c.inputs(&mut rng);
    let plain = c.forward(&inputs).unwrap().out.to_f64_vec().unwrap();
    let capped = Case { softcap: 1e7, ..c.clone() }.forward(&inputs).unwrap().out.to_f64_vec().unwrap();
    assert!(rel_err(&capped, &plain) < 1e-9, "{c:?}: softcap 1e7 differs from no softcap by {:e}", rel_err(&capped, &plain));
    let explicit = Case { scale: Some(0.25), ..c.clone() }.forward(&inputs).unwrap().out.to_f64_vec().unwrap();
    assert!(rel_err(&explicit, &plain) <= TOL, "{c:?}: scale 0.25 differs from the default 1/sqrt(16)");
    let other = Case { scale: Some(0.3), ..c.clone() }.forward(&inputs).unwrap().out.to_f64_vec().unwrap();
    assert!(rel_err(&other, &plain) > 1e-4, "{c:?}: scale 0.3 gives the same O as 0.25");
}

#[test]
fn empty_rows_and_all_false_masks() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("empty_rows_and_all_false_masks");
    let mut cases = Vec::new();
    for s in [[2, 4, 6, 7], [1, 2, 6, 7], [2, 1, 6, 1], [1, 1, 6, 7]] {
        cases.push(Case { mask: Some(s), mask_pattern: MaskPattern::EmptyRows(0.8), bias: Some([2, 4, 6, 7]), ..case(2, 6, 7, 4, 2, 3) });
        cases.push(Case { mask: Some(s), mask_pattern: MaskPattern::EmptyRows(0.8), causal: true, softcap: 1.5, ..case(2, 6, 7, 4, 2, 3) });
    }
    run_all(&cases, &mut rng);

    // A mask with every element false: O = 0, LSE = -inf and every gradient exactly 0.
    for s in [[1, 1, 1, 1], [2, 4, 6, 7], [1, 2, 1, 7]] {
        let c = Case { mask: Some(s), mask_pattern: MaskPattern::Random(0.0), bias: Some([2, 4, 6, 7]), ..case(2, 6, 7, 4, 2, 3) };
        let inputs = c.inputs(&mut rng);
        assert!(inputs.mask.as_ref().unwrap().to_f64_vec().unwrap().iter().all(|&x| x == 0.0));
        let fwd = c.forward(&inputs).unwrap();
        assert!(fwd.out.to_f64_vec().unwrap().iter().all(|&x| x == 0.0), "{c:?}: all-false mask but O != 0");
        assert!(fwd.lse.to_f64_vec().unwrap().iter().all(|&x| x == f64::NEG_INFINITY), "{c:?}: all-false mask but LSE != -inf");
        let dout = random_dout(&c, &mut rng);
        let g = fwd.backward(&cpu_f64(&dout, &c.q_shape())).unwrap();
        for (name, t) in [("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv), ("dbias", g.dbias.as_ref().unwrap())] {
            assert!(t.to_f64_vec().unwrap().iter().all(|&x| x == 0.0), "{c:?}: all-false mask but {name} != 0");
        }
    }
}

/// Closed forms that need no reference: one key, and keys that all score alike.
#[test]
fn closed_forms() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("closed_forms");
    // One key: O is that key's value row, LSE its score softcap(scale q·k) + bias.
    let c = Case { bias: Some([2, 3, 4, 1]), softcap: 2.0, scale: Some(0.7), ..case(2, 4, 1, 3, 1, 5) };
    let inputs = c.inputs(&mut rng);
    let fwd = c.forward(&inputs).unwrap();
    let (q, k, v, bias) = (inputs.q.to_f64_vec().unwrap(), inputs.k.to_f64_vec().unwrap(), inputs.v.to_f64_vec().unwrap(), inputs.bias.as_ref().unwrap().to_f64_vec().unwrap());
    let (out, lse) = (fwd.out.to_f64_vec().unwrap(), fwd.lse.to_f64_vec().unwrap());
    for b in 0..2 {
        for h in 0..3 {
            for i in 0..4 {
                let qr = &q[((b * 4 + i) * 3 + h) * 5..][..5];
                let kr = &k[b * 5..][..5];
                let s = 2.0 * (0.7 * qr.iter().zip(kr).map(|(x, y)| x * y).sum::<f64>() / 2.0).tanh() + bias[(b * 3 + h) * 4 + i];
                let l = lse[(b * 3 + h) * 4 + i];
                assert!((l - s).abs() <= TOL * s.abs().max(1.0), "{c:?}: one key, LSE (b {b}, h {h}, i {i}) = {l}, expected {s}");
                let o = &out[((b * 4 + i) * 3 + h) * 5..][..5];
                assert!(rel_err(o, &v[b * 5..][..5]) <= TOL, "{c:?}: one key, O (b {b}, h {h}, i {i}) = {o:?}, expected {:?}", &v[b * 5..][..5]);
            }
        }
    }

    // Every key alike: the visible ones share the probability evenly, so O is the mean of their
    // value rows and LSE = s + ln(count).
    let (sq, sk, d) = (5, 9, 4);
    let c = Case { mask: Some([1, 1, sq, sk]), mask_pattern: MaskPattern::EmptyRows(0.6), causal: true, ..case(1, sq, sk, 1, 1, d) };
    let mut inputs = c.inputs(&mut rng);
    let krow: Vec<f64> = (0..d).map(|_| rng.random::<f64>() - 0.5).collect();
    inputs.k = cpu_f64(&(0..sk * d).map(|x| krow[x % d]).collect::<Vec<_>>(), &c.kv_shape());
    let fwd = c.forward(&inputs).unwrap();
    let (q, v, mask) = (inputs.q.to_f64_vec().unwrap(), inputs.v.to_f64_vec().unwrap(), inputs.mask.as_ref().unwrap().to_f64_vec().unwrap());
    let (out, lse) = (fwd.out.to_f64_vec().unwrap(), fwd.lse.to_f64_vec().unwrap());
    for i in 0..sq {
        let seen: Vec<usize> = (0..sk).filter(|&j| mask[i * sk + j] != 0.0 && j + sq <= i + sk).collect();
        let o = &out[i * d..][..d];
        if seen.is_empty() {
            assert_eq!(lse[i], f64::NEG_INFINITY, "{c:?}: row {i} sees no key");
            assert!(o.iter().all(|&x| x == 0.0), "{c:?}: row {i} sees no key but O = {o:?}");
            continue;
        }
        let s = 0.5 * q[i * d..][..d].iter().zip(&krow).map(|(x, y)| x * y).sum::<f64>();
        let want_lse = s + (seen.len() as f64).ln();
        assert!((lse[i] - want_lse).abs() <= TOL * want_lse.abs().max(1.0), "{c:?}: row {i} LSE {} expected {want_lse}", lse[i]);
        let mean: Vec<f64> = (0..d).map(|x| seen.iter().map(|&j| v[j * d + x]).sum::<f64>() / seen.len() as f64).collect();
        assert!(rel_err(o, &mean) <= TOL, "{c:?}: row {i} (keys {seen:?}) O = {o:?}, expected the mean {mean:?}");
    }
}

/// Strided views (a permuted q, padded k/v rows, a mask expanded with stride 0) give what their
/// contiguous copies give.
#[test]
fn strided_inputs() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("strided_inputs");
    let (b, sq, sk, h, hk, d) = (2, 5, 7, 4, 2, 6);
    let mut r = |n: usize| (0..n).map(|_| rng.random::<f64>() * 4.0 - 2.0).collect::<Vec<f64>>();
    // q stored as [b, h, sq, d], viewed as [b, sq, h, d].
    let q = cpu_f64(&r(b * h * sq * d), &[b, h, sq, d]).as_strided(&[b, sq, h, d], &[h * sq * d, d, sq * d, 1], 0).unwrap();
    // k, v rows padded to 2d + 3 elements, starting 3 elements in.
    let pad = |vals: Vec<f64>| cpu_f64(&vals, &[b * sk * hk * (2 * d) + 3]).as_strided(&[b, sk, hk, d], &[sk * hk * 2 * d, hk * 2 * d, 2 * d, 1], 3).unwrap();
    let k = pad(r(b * sk * hk * 2 * d + 3));
    let v = pad(r(b * sk * hk * 2 * d + 3));
    // One key-mask row [sk] expanded to [b, h, sq, sk] with zero strides.
    let mut keep: Vec<bool> = (0..sk).map(|j| j % 3 != 1).collect();
    keep[0] = false;
    let mask = Tensor::from_vec(keep, &[sk], &Device::Cpu).unwrap().as_strided(&[b, h, sq, sk], &[0, 0, 0, 1], 0).unwrap();
    let bias = cpu_f64(&r(h * sq * 2), &[h, sq, 2]).as_strided(&[1, h, sq, sk], &[0, sq * 2, 2, 0], 1).unwrap();
    assert!(!q.layout().is_contiguous() && !k.layout().is_contiguous() && !mask.layout().is_contiguous());

    let strided = attention(&q, &k, &v).mask(&mask).bias(&bias).causal(true).forward().unwrap();
    let cont = |t: &Tensor| t.to_device(&Device::Cpu).unwrap();
    let (qc, kc, vc, mc, bc) = (cont(&q), cont(&k), cont(&v), cont(&mask), cont(&bias));
    assert!(qc.layout().is_contiguous() && mc.layout().is_contiguous());
    let contiguous = attention(&qc, &kc, &vc).mask(&mc).bias(&bc).causal(true).forward().unwrap();
    assert_eq!(strided.out.to_f64_vec().unwrap(), contiguous.out.to_f64_vec().unwrap(), "strided O differs");
    assert_eq!(strided.lse.to_f64_vec().unwrap(), contiguous.lse.to_f64_vec().unwrap(), "strided LSE differs");
    // The contiguous copies against the naive implementation.
    let c = Case { mask: Some([b, h, sq, sk]), bias: Some([1, h, sq, sk]), causal: true, ..case(b, sq, sk, h, hk, d) };
    let inputs = Inputs { q: qc, k: kc, v: vc, mask: Some(mc), bias: Some(bc) };
    check_forward(&c, &inputs, TOL).unwrap();

    let dout = cpu_f64(&r(b * sq * h * d), &[b, sq, h, d]);
    let dout_strided = cpu_f64(&r(b * sq * h * d), &[b, h, sq, d]).as_strided(&[b, sq, h, d], &[h * sq * d, d, sq * d, 1], 0).unwrap();
    for (gs, gc) in [
        (strided.backward(&dout).unwrap(), contiguous.backward(&dout).unwrap()),
        (strided.backward(&dout_strided).unwrap(), contiguous.backward(&cont(&dout_strided)).unwrap()),
    ] {
        for (name, a, e) in [("dq", &gs.dq, &gc.dq), ("dk", &gs.dk, &gc.dk), ("dv", &gs.dv, &gc.dv)] {
            assert_eq!(a.to_f64_vec().unwrap(), e.to_f64_vec().unwrap(), "strided {name} differs");
        }
        assert_eq!(gs.dbias.unwrap().to_f64_vec().unwrap(), gc.dbias.unwrap().to_f64_vec().unwrap(), "strided dbias differs");
    }
}

/// Output shapes and dtypes: O and the gradients in the dtypes of their inputs, LSE in f32
/// (f64 for f64 inputs), dbias in the bias's shape and dtype.
#[test]
fn output_shapes_and_dtypes() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("output_shapes_and_dtypes");
    for dt in [DType::F64, DType::F32, DType::F16, DType::BF16] {
        let c = Case { dtype: dt, bias: Some([1, 2, 1, 6]), mask: Some([2, 1, 4, 6]), ..Case::new(2, 4, 6, 4, 2, 8) };
        let inputs = c.inputs(&mut rng);
        let fwd = c.forward(&inputs).unwrap();
        assert_eq!((fwd.out.shape(), fwd.out.dtype()), (&[2, 4, 4, 8][..], dt), "{c:?}: O");
        let lse_dt = if dt == DType::F64 { DType::F64 } else { DType::F32 };
        assert_eq!((fwd.lse.shape(), fwd.lse.dtype()), (&[2, 4, 4][..], lse_dt), "{c:?}: LSE");
        let dout = random_dout(&c, &mut rng);
        let g = fwd.backward(&Tensor::from_fn(&c.q_shape(), dt, &Device::Cpu, |i| dout[i]).unwrap()).unwrap();
        assert_eq!((g.dq.shape(), g.dq.dtype()), (&c.q_shape()[..], dt), "{c:?}: dq");
        assert_eq!((g.dk.shape(), g.dk.dtype()), (&c.kv_shape()[..], dt), "{c:?}: dk");
        assert_eq!((g.dv.shape(), g.dv.dtype()), (&c.kv_shape()[..], dt), "{c:?}: dv");
        let db = g.dbias.expect("dbias with a bias");
        assert_eq!((db.shape(), db.dtype()), (&[1, 2, 1, 6][..], dt), "{c:?}: dbias");
        let none = Case { bias: None, ..c.clone() };
        let inputs = Inputs { bias: None, ..inputs };
        let g = none.forward(&inputs).unwrap().backward(&Tensor::from_fn(&c.q_shape(), dt, &Device::Cpu, |i| dout[i]).unwrap()).unwrap();
        assert!(g.dbias.is_none(), "{none:?}: dbias without a bias");
    }

    // A bias in another float dtype than q: used at its own values, its gradient in its dtype.
    let c = Case { bias: Some([2, 4, 4, 6]), ..case(2, 4, 6, 4, 2, 8) };
    let inputs = c.inputs(&mut rng).cast(DType::F64);
    let bias32 = inputs.bias.as_ref().unwrap().to_f64_vec().unwrap();
    let inputs = Inputs { bias: Some(Tensor::from_fn(&[2, 4, 4, 6], DType::F32, &Device::Cpu, |i| bias32[i]).unwrap()), ..inputs };
    check_forward(&c, &inputs, TOL).unwrap();
    let dout = random_dout(&c, &mut rng);
    let g = c.forward(&inputs).unwrap().backward(&cpu_f64(&dout, &c.q_shape())).unwrap();
    let db = g.dbias.unwrap();
    assert_eq!(db.dtype(), DType::F32, "{c:?}: dbias of an f32 bias");
    let spec = naive::Spec::of(&c);
    let data = naive::Data::of(&inputs);
    let want = naive::backward(&spec, &data, &naive::forward(&spec, &data), &dout);
    assert!(rel_err(&db.to_f64_vec().unwrap(), want.dbias.as_ref().unwrap()) < 1e-6, "{c:?}: f32 dbias");
}

/// Out, lse, dq, dk, dv and dbias of a masked, biased, causal, softcapped GQA call, the forward
/// through `path`, run twice on the same inputs; asserts the two runs are bit-identical.
fn twice_bit_identical(test: &str, paths: [ForwardPath; 2]) {
    set_output_poisoning(true);
    let mut rng = fresh_rng(test);
    let c = Case { mask: Some([2, 2, 33, 47]), bias: Some([1, 4, 33, 47]), causal: true, softcap: 4.0, ..case(2, 33, 47, 4, 2, 16) };
    let inputs = c.inputs(&mut rng);
    let dout = cpu_f64(&random_dout(&c, &mut rng), &c.q_shape());
    let run = |path: ForwardPath| {
        let f = c.forward_by(&inputs, path).unwrap();
        let g = f.backward(&dout).unwrap();
        [f.out, f.lse, g.dq, g.dk, g.dv, g.dbias.unwrap()].map(|t| t.to_f64_vec().unwrap())
    };
    let (a, b) = (run(paths[0]), run(paths[1]));
    for (n, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()), "{c:?}: output {n} (out, lse, dq, dk, dv, dbias) differs between {paths:?}");
    }
}

/// The same call twice gives bit-identical results (the CPU backend is parallel).
#[test]
fn deterministic() {
    twice_bit_identical("deterministic", [ForwardPath::Fused; 2]);
}

/// On the CPU the materialising forward is the CPU forward (which materialises already): the
/// same results bit for bit, backward included.
#[test]
fn materialized_is_the_cpu_forward() {
    twice_bit_identical("materialized_is_the_cpu_forward", [ForwardPath::Fused, ForwardPath::Materialized]);
}

/// Larger problems with every feature at once (a check on indexing beyond tiny sizes).
#[test]
fn larger_problems() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("larger_problems");
    let cases = [
        Case { mask: Some([2, 2, 65, 130]), mask_pattern: MaskPattern::Blocks(0.6), bias: Some([2, 4, 1, 130]), causal: true, ..case(2, 65, 130, 4, 2, 32) },
        Case { mask: Some([1, 1, 130, 65]), mask_pattern: MaskPattern::EmptyRows(0.5), bias: Some([1, 1, 130, 65]), softcap: 10.0, ..case(1, 130, 65, 2, 1, 24) },
    ];
    run_all(&cases, &mut rng);
}
