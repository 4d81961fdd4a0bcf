//! The backward pass of the public API (dq, dk, dv, dbias) against central finite differences of
//! the forward pass, all in f64, for a random linear loss `L = Σ out·W` (so `dout = W`), plus the
//! gradients that must be exactly zero (hidden keys and rows).
//!
//! Step and tolerance: the central difference `(L(x+h) − L(x−h)) / 2h` has truncation error
//! `h²/6·|L'''|` ≈ 1e-12·O(10) and rounding error ≈ `ε·|L|·√n / h` ≈ 1.1e-16·O(10)·O(10) / 1e-6
//! ≈ 1e-8 per element with h = 1e-6 (L is summed with Neumaier compensation, so its own rounding
//! stays near ε·|L|). Gradients are compared norm-wise, `‖g − fd‖ / max(‖fd‖, 1)`: relative for
//! gradients of norm ≥ 1, absolute below (dbias broadcast over keys is analytically 0, as a
//! constant added to a whole row does not change its softmax). Measured errors are ≲ 5e-9;
//! the bound 1e-6 keeps over two orders of margin while any wrong term (a missing softcap factor,
//! a wrong reduction over heads or broadcast dims, a causal off-by-one) is ≥ 1e-3.
use dmattn::{DType, Device, Tensor, attention, set_output_poisoning};
use dmattn_tests::{Case, Inputs, MaskPattern, fresh_rng, random_dout, rel_err_floor};
use rand::rngs::StdRng;

const STEP: f64 = 1e-6;
const TOL: f64 = 1e-6;

fn case(b: usize, sq: usize, sk: usize, h: usize, hk: usize, d: usize) -> Case {
    Case { dtype: DType::F64, ..Case::new(b, sq, sk, h, hk, d) }
}

fn cpu_f64(vals: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(vals.to_vec(), shape, &Device::Cpu).unwrap()
}

/// Neumaier-compensated `Σ a·b`.
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let (mut sum, mut comp) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let t = x * y;
        let s = sum + t;
        comp += if sum.abs() >= t.abs() { (sum - s) + t } else { (t - s) + sum };
        sum = s;
    }
    sum + comp
}

fn loss(case: &Case, inputs: &Inputs, w: &[f64]) -> f64 {
    dot(&case.forward(inputs).unwrap().out.to_f64_vec().unwrap(), w)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Arg {
    Q,
    K,
    V,
    Bias,
}

/// `inputs` with operand `arg` replaced by `t`.
fn with(inputs: &Inputs, arg: Arg, t: Tensor) -> Inputs {
    let mut i = Inputs { q: inputs.q.clone(), k: inputs.k.clone(), v: inputs.v.clone(), mask: inputs.mask.clone(), bias: inputs.bias.clone() };
    match arg {
        Arg::Q => i.q = t,
        Arg::K => i.k = t,
        Arg::V => i.v = t,
        Arg::Bias => i.bias = Some(t),
    }
    i
}

/// Central finite differences of `L = Σ out·w` with respect to every element of `arg`.
fn finite_differences(case: &Case, inputs: &Inputs, w: &[f64], arg: Arg) -> Vec<f64> {
    let t = match arg {
        Arg::Q => &inputs.q,
        Arg::K => &inputs.k,
        Arg::V => &inputs.v,
        Arg::Bias => inputs.bias.as_ref().unwrap(),
    };
    let x = t.to_f64_vec().unwrap();
    (0..x.len())
        .map(|e| {
            let (mut plus, mut minus) = (x.clone(), x.clone());
            plus[e] += STEP;
            minus[e] -= STEP;
            let lp = loss(case, &with(inputs, arg, cpu_f64(&plus, t.shape())), w);
            let lm = loss(case, &with(inputs, arg, cpu_f64(&minus, t.shape())), w);
            (lp - lm) / (plus[e] - minus[e])
        })
        .collect()
}

/// The analytic gradients of `case` on `inputs` for dout `w`, as (dq, dk, dv, dbias).
fn analytic(case: &Case, inputs: &Inputs, w: &[f64]) -> [Option<Vec<f64>>; 4] {
    let g = case.forward(inputs).unwrap().backward(&cpu_f64(w, &case.q_shape())).unwrap();
    assert_eq!(g.dbias.is_some(), case.bias.is_some(), "{case:?}: dbias present iff there is a bias");
    [Some(g.dq), Some(g.dk), Some(g.dv), g.dbias].map(|t| t.map(|t| t.to_f64_vec().unwrap()))
}

/// Checks every gradient of `case` (fresh inputs, fresh W) against finite differences; returns
/// the largest error seen, or a message naming the case and gradient.
fn check(case: &Case, rng: &mut StdRng) -> Result<f64, String> {
    let inputs = case.inputs(rng);
    check_inputs(case, &inputs, rng)
}

fn check_inputs(case: &Case, inputs: &Inputs, rng: &mut StdRng) -> Result<f64, String> {
    assert_eq!(case.dtype, DType::F64, "finite differences need f64");
    let w = random_dout(case, rng);
    let grads = analytic(case, inputs, &w);
    let mut worst = 0.0f64;
    for (arg, g) in [Arg::Q, Arg::K, Arg::V, Arg::Bias].into_iter().zip(grads) {
        let Some(g) = g else { continue };
        let fd = finite_differences(case, inputs, &w, arg);
        let e = rel_err_floor(&g, &fd, 1.0);
        worst = worst.max(e);
        if !(e <= TOL) {
            return Err(format!("{case:?}: d{arg:?} differs from finite differences: err {e:e} > {TOL:e}"));
        }
    }
    Ok(worst)
}

fn check_all(name: &str, cases: &[Case], rng: &mut StdRng) {
    assert!(!cases.is_empty());
    let mut worst = 0.0f64;
    let mut failures = Vec::new();
    for c in cases {
        match check(c, rng) {
            Ok(e) => worst = worst.max(e),
            Err(m) => failures.push(m),
        }
    }
    eprintln!("{name}: {} cases, largest error {worst:e}", cases.len());
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn dbias_every_broadcast_shape() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("dbias_every_broadcast_shape");
    let (b, sq, sk, h, hk, d) = (2, 4, 5, 4, 2, 3);
    let mut cases = Vec::new();
    for bb in [1, b] {
        for hh in [1, hk, h] {
            for qq in [1, sq] {
                for kk in [1, sk] {
                    let s = [bb, hh, qq, kk];
                    cases.push(Case { bias: Some(s), ..case(b, sq, sk, h, hk, d) });
                    // Causal, softcap, and a mask with empty rows (rows 0 and 3 of each block).
                    cases.push(Case {
                        bias: Some(s),
                        causal: true,
                        softcap: 1.5,
                        mask: Some([b, hk, sq, sk]),
                        mask_pattern: MaskPattern::EmptyRows(0.8),
                        ..case(b, sq, sk, h, hk, d)
                    });
                }
            }
        }
    }
    assert_eq!(cases.len(), 48);
    check_all("dbias_every_broadcast_shape", &cases, &mut rng);
}

#[test]
fn dq_dk_dv_heads_causal_softcap_masks() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("dq_dk_dv_heads_causal_softcap_masks");
    let mut cases = Vec::new();
    for (h, hk) in [(1, 1), (3, 3), (4, 2), (4, 1)] {
        for (sq, sk) in [(1, 1), (3, 7), (5, 5), (7, 3)] {
            cases.push(Case { causal: true, ..case(2, sq, sk, h, hk, 4) });
            cases.push(Case { softcap: 0.8, scale: Some(1.3), mask: Some([1, h, sq, sk]), mask_pattern: MaskPattern::Random(0.6), ..case(1, sq, sk, h, hk, 4) });
            cases.push(Case {
                causal: true,
                softcap: 3.0,
                mask: Some([2, 1, sq, sk]),
                mask_pattern: MaskPattern::EmptyRows(0.7),
                bias: Some([1, hk, sq, 1]),
                ..case(2, sq, sk, h, hk, 4)
            });
        }
    }
    // A wider head dim and longer sequences, every feature at once.
    cases.push(Case {
        causal: true,
        softcap: 5.0,
        scale: Some(0.4),
        mask: Some([2, 2, 9, 11]),
        mask_pattern: MaskPattern::EmptyRows(0.8),
        bias: Some([2, 1, 9, 11]),
        ..case(2, 9, 11, 4, 2, 16)
    });
    check_all("dq_dk_dv_heads_causal_softcap_masks", &cases, &mut rng);
}

/// Gradients that are exactly zero: keys no query sees (dk = dv = 0), rows that see no key
/// (dq = 0, O = 0, LSE = -inf), hidden scores (dbias = 0), a kv head hidden from every query.
/// The same cases also pass the finite-difference check.
#[test]
fn exact_zeros() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("exact_zeros");
    let (b, h, hk, d) = (2, 4, 2, 3);
    for (sq, sk, causal) in [(5, 6, false), (5, 8, true), (6, 6, true), (8, 5, true)] {
        let c = Case { mask: Some([b, h, sq, sk]), bias: Some([b, h, sq, sk]), causal, softcap: 2.0, ..case(b, sq, sk, h, hk, d) };
        let mut inputs = c.inputs(&mut rng);
        // Hidden: key 1 everywhere; query row 2 everywhere; kv head 1 of batch 1 (query heads
        // 2 and 3) entirely; the last query row of batch 0 (with causal and sq < sk, the only
        // query that sees key sk − 1); a random 20% otherwise.
        let (j0, i0) = (1, 2);
        let hidden = |bb: usize, hh: usize, i: usize, j: usize| {
            j == j0 || i == i0 || (bb == 1 && hh / (h / hk) == 1) || (bb == 0 && i == sq - 1)
        };
        let rand_keep = inputs.mask.as_ref().unwrap().to_f64_vec().unwrap();
        let keep: Vec<bool> =
            (0..b * h * sq * sk).map(|x| !hidden(x / (h * sq * sk), (x / (sq * sk)) % h, (x / sk) % sq, x % sk) && rand_keep[x] != 0.0).collect();
        inputs.mask = Some(Tensor::from_vec(keep.clone(), &[b, h, sq, sk], &Device::Cpu).unwrap());

        let w = random_dout(&c, &mut rng);
        let fwd = c.forward(&inputs).unwrap();
        let (out, lse) = (fwd.out.to_f64_vec().unwrap(), fwd.lse.to_f64_vec().unwrap());
        let g = fwd.backward(&cpu_f64(&w, &c.q_shape())).unwrap();
        let (dq, dk, dv, db) = (g.dq.to_f64_vec().unwrap(), g.dk.to_f64_vec().unwrap(), g.dv.to_f64_vec().unwrap(), g.dbias.unwrap().to_f64_vec().unwrap());
        let visible = |bb: usize, hh: usize, i: usize, j: usize| keep[((bb * h + hh) * sq + i) * sk + j] && (!causal || j + sq <= i + sk);

        let mut zero_rows = 0;
        for bb in 0..b {
            for hh in 0..h {
                for i in 0..sq {
                    let row = ((bb * sq + i) * h + hh) * d;
                    if (0..sk).any(|j| visible(bb, hh, i, j)) {
                        assert!(lse[(bb * h + hh) * sq + i].is_finite(), "{c:?}: row (b {bb}, h {hh}, i {i}) sees keys but LSE is not finite");
                        continue;
                    }
                    zero_rows += 1;
                    assert_eq!(lse[(bb * h + hh) * sq + i], f64::NEG_INFINITY, "{c:?}: row (b {bb}, h {hh}, i {i}) sees no key: LSE");
                    assert!(out[row..row + d].iter().all(|&x| x == 0.0), "{c:?}: row (b {bb}, h {hh}, i {i}) sees no key: O = {:?}", &out[row..row + d]);
                    assert!(dq[row..row + d].iter().all(|&x| x == 0.0), "{c:?}: row (b {bb}, h {hh}, i {i}) sees no key: dq = {:?}", &dq[row..row + d]);
                }
            }
        }
        assert!(zero_rows >= b * h, "{c:?}: expected the hidden rows to be empty");
        let mut unseen_keys = 0;
        for bb in 0..b {
            for kh in 0..hk {
                for j in 0..sk {
                    let at = ((bb * sk + j) * hk + kh) * d;
                    let seen = (kh * (h / hk)..(kh + 1) * (h / hk)).any(|hh| (0..sq).any(|i| visible(bb, hh, i, j)));
                    let (gk, gv) = (&dk[at..at + d], &dv[at..at + d]);
                    if seen {
                        assert!(gv.iter().any(|&x| x != 0.0), "{c:?}: key (b {bb}, kv head {kh}, j {j}) is seen but dv = 0");
                    } else {
                        unseen_keys += 1;
                        assert!(gk.iter().chain(gv).all(|&x| x == 0.0), "{c:?}: key (b {bb}, kv head {kh}, j {j}) is seen by no query: dk = {gk:?}, dv = {gv:?}");
                    }
                }
            }
        }
        assert!(unseen_keys >= b * hk + sk - 1, "{c:?}: expected the hidden keys to be unseen");
        if causal && sq < sk {
            // Key sk − 1 is seen only by query sq − 1, which is hidden in batch 0.
            for kh in 0..hk {
                let at = ((sk - 1) * hk + kh) * d;
                assert!(dk[at..at + d].iter().chain(&dv[at..at + d]).all(|&x| x == 0.0), "{c:?}: key sk-1 of batch 0 is unseen: dk/dv != 0");
            }
        }
        for x in 0..db.len() {
            let (bb, hh, i, j) = (x / (h * sq * sk), (x / (sq * sk)) % h, (x / sk) % sq, x % sk);
            if !visible(bb, hh, i, j) {
                assert_eq!(db[x], 0.0, "{c:?}: score (b {bb}, h {hh}, i {i}, j {j}) is hidden: dbias");
            }
        }
        check_inputs(&c, &inputs, &mut rng).unwrap();
    }
}

/// The backward pass is linear in dout: g(a·W1 + b·W2) = a·g(W1) + b·g(W2), and dout = 0 gives
/// zero gradients.
#[test]
fn backward_is_linear_in_dout() {
    set_output_poisoning(true);
    let mut rng = fresh_rng("backward_is_linear_in_dout");
    let c = Case { mask: Some([2, 1, 6, 7]), bias: Some([1, 4, 6, 7]), causal: true, softcap: 2.5, ..case(2, 6, 7, 4, 2, 5) };
    let inputs = c.inputs(&mut rng);
    let (w1, w2) = (random_dout(&c, &mut rng), random_dout(&c, &mut rng));
    let combo: Vec<f64> = w1.iter().zip(&w2).map(|(a, b)| 0.75 * a - 2.0 * b).collect();
    let (g1, g2, g12) = (analytic(&c, &inputs, &w1), analytic(&c, &inputs, &w2), analytic(&c, &inputs, &combo));
    for (n, ((a, b), ab)) in g1.iter().zip(&g2).zip(&g12).enumerate() {
        let (a, b, ab) = (a.as_ref().unwrap(), b.as_ref().unwrap(), ab.as_ref().unwrap());
        let want: Vec<f64> = a.iter().zip(b).map(|(x, y)| 0.75 * x - 2.0 * y).collect();
        assert!(want.iter().any(|&x| x != 0.0), "{c:?}: gradient {n} is all zero");
        let e = rel_err_floor(ab, &want, 1.0);
        assert!(e < 1e-12, "{c:?}: gradient {n} (dq, dk, dv, dbias) is not linear in dout: err {e:e}");
    }
    let zero = attention(&inputs.q, &inputs.k, &inputs.v)
        .mask(inputs.mask.as_ref().unwrap())
        .bias(inputs.bias.as_ref().unwrap())
        .causal(true)
        .softcap(2.5)
        .forward()
        .unwrap()
        .backward(&cpu_f64(&vec![0.0; w1.len()], &c.q_shape()))
        .unwrap();
    for (name, t) in [("dq", zero.dq), ("dk", zero.dk), ("dv", zero.dv), ("dbias", zero.dbias.unwrap())] {
        assert!(t.to_f64_vec().unwrap().iter().all(|&x| x == 0.0), "{c:?}: dout = 0 but {name} != 0");
    }
}
