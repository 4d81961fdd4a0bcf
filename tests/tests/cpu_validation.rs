//! Every bad input to the public API is rejected with the right typed `dmattn::Error` variant,
//! naming the argument (and, for shapes and dtypes, reporting what it got), never with a panic.
//! Each bad call differs from a valid baseline (checked to succeed) in one thing.
use dmattn::{DType, Device, Error, Tensor, attention, set_output_poisoning};
use dmattn_tests::{ForwardPath, fresh_rng};
use rand::Rng;
use rand::rngs::StdRng;
use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The error a call must return.
#[derive(Clone, Debug)]
enum Expect {
    BadShape(&'static str, Vec<usize>),
    BadDType(&'static str, DType),
    BadParam(&'static str),
}

/// Checks `r` is the expected error; `Err` describes the mismatch.
fn matches<T>(r: dmattn::Result<T>, want: &Expect) -> Result<(), String> {
    let e = match r {
        Ok(_) => return Err(format!("accepted; expected {want:?}")),
        Err(e) => e,
    };
    let ok = match (&e, want) {
        (Error::Shape { arg, got, .. }, Expect::BadShape(a, g)) => arg == a && got == g,
        (Error::DType { arg, got, .. }, Expect::BadDType(a, g)) => arg == a && got == g,
        (Error::Param { arg, .. }, Expect::BadParam(a)) => arg == a,
        _ => false,
    };
    let arg = match want {
        Expect::BadShape(a, _) | Expect::BadDType(a, _) | Expect::BadParam(a) => *a,
    };
    let msg = e.to_string();
    if !ok {
        Err(format!("got {e:?} (\"{msg}\"); expected {want:?}"))
    } else if !msg.contains(&format!("`{arg}`")) {
        Err(format!("the message \"{msg}\" does not name `{arg}`"))
    } else {
        Ok(())
    }
}

/// Runs each named check, catching panics, and fails listing every one that went wrong.
fn run_checks(checks: Vec<(String, Box<dyn Fn() -> Result<(), String> + '_>)>) {
    assert!(!checks.is_empty());
    let n = checks.len();
    let failures: Vec<String> = checks
        .into_iter()
        .filter_map(|(name, f)| match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(())) => None,
            Ok(Err(m)) => Some(format!("{name}: {m}")),
            Err(p) => Some(format!(
                "{name}: PANICKED: {}",
                p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
            )),
        })
        .collect();
    assert!(failures.is_empty(), "{} of {n} checks failed:\n{}", failures.len(), failures.join("\n"));
}

/// Random nonzero tensors of any shape and dtype.
struct Maker(RefCell<StdRng>);

impl Maker {
    fn t(&self, shape: &[usize], dt: DType) -> Tensor {
        let n: usize = shape.iter().product();
        let vals: Vec<f64> = (0..n).map(|_| self.0.borrow_mut().random::<f64>() * 2.0 + 0.25).collect();
        Tensor::from_fn(shape, dt, &Device::Cpu, |i| if dt == DType::Bool { (vals[i] > 0.5) as u8 as f64 } else { vals[i] }).unwrap()
    }
}

// The valid baseline: q [2, 5, 4, 8], k/v [2, 7, 2, 8] (GQA), mask/bias [2, 4, 5, 7].
const B: usize = 2;
const SQ: usize = 5;
const SK: usize = 7;
const H: usize = 4;
const HK: usize = 2;
const D: usize = 8;

/// A forward call from shapes and dtypes; mask and bias optional.
struct Call {
    q: (Vec<usize>, DType),
    k: (Vec<usize>, DType),
    v: (Vec<usize>, DType),
    mask: Option<(Vec<usize>, DType)>,
    bias: Option<(Vec<usize>, DType)>,
    scale: Option<f64>,
    softcap: f64,
}

impl Call {
    fn valid() -> Call {
        Call {
            q: (vec![B, SQ, H, D], DType::F32),
            k: (vec![B, SK, HK, D], DType::F32),
            v: (vec![B, SK, HK, D], DType::F32),
            mask: Some((vec![B, H, SQ, SK], DType::Bool)),
            bias: Some((vec![B, H, SQ, SK], DType::F32)),
            scale: None,
            softcap: 0.0,
        }
    }

    fn run(&self, m: &Maker) -> dmattn::Result<dmattn::Forward> {
        self.run_by(m, ForwardPath::Fused)
    }

    fn run_by(&self, m: &Maker, path: ForwardPath) -> dmattn::Result<dmattn::Forward> {
        let (q, k, v) = (m.t(&self.q.0, self.q.1), m.t(&self.k.0, self.k.1), m.t(&self.v.0, self.v.1));
        let mask = self.mask.as_ref().map(|(s, dt)| m.t(s, *dt));
        let bias = self.bias.as_ref().map(|(s, dt)| m.t(s, *dt));
        let mut a = attention(&q, &k, &v).softcap(self.softcap).causal(true);
        if let Some(s) = self.scale {
            a = a.scale(s);
        }
        if let Some(t) = &mask {
            a = a.mask(t);
        }
        if let Some(t) = &bias {
            a = a.bias(t);
        }
        path.run(a)
    }
}

#[test]
fn baseline_is_valid() {
    set_output_poisoning(true);
    let m = Maker(RefCell::new(fresh_rng("baseline_is_valid")));
    let f = Call::valid().run(&m).expect("the baseline call is valid");
    assert!(f.out.to_f64_vec().unwrap().iter().all(|x| x.is_finite()));
    // Every legal broadcast shape, the edge scale/softcap values, and f64/f16/bf16 inputs are accepted.
    for s in [[1, 1, 1, 1], [1, HK, 1, SK], [B, 1, SQ, 1], [1, H, SQ, SK]] {
        for c in [Call { mask: Some((s.to_vec(), DType::Bool)), ..Call::valid() }, Call { bias: Some((s.to_vec(), DType::F32)), ..Call::valid() }] {
            c.run(&m).unwrap_or_else(|e| panic!("broadcast shape {s:?} rejected: {e}"));
        }
    }
    for (scale, softcap) in [(Some(1e-30), 0.0), (Some(1e30), 1e30), (None, 1e-30), (None, -0.0)] {
        Call { scale, softcap, ..Call::valid() }.run(&m).unwrap_or_else(|e| panic!("scale {scale:?} softcap {softcap} rejected: {e}"));
    }
    for dt in [DType::F64, DType::F16, DType::BF16] {
        let c = Call { q: (vec![B, SQ, H, D], dt), k: (vec![B, SK, HK, D], dt), v: (vec![B, SK, HK, D], dt), bias: Some((vec![1, 1, SQ, SK], dt)), ..Call::valid() };
        c.run(&m).unwrap_or_else(|e| panic!("{dt:?} inputs rejected: {e}"));
    }
}

#[test]
fn bad_forward_inputs() {
    set_output_poisoning(true);
    let m = Maker(RefCell::new(fresh_rng("bad_forward_inputs")));
    let f32_ = DType::F32;
    let mut cases: Vec<(String, Call, Expect)> = Vec::new();
    let mut add = |name: &str, c: Call, e: Expect| cases.push((name.to_string(), c, e));
    use Expect::*;

    // Wrong rank.
    add("q rank 3", Call { q: (vec![B, SQ, H * D], f32_), ..Call::valid() }, BadShape("q", vec![B, SQ, H * D]));
    add("q rank 5", Call { q: (vec![B, SQ, H, D, 1], f32_), ..Call::valid() }, BadShape("q", vec![B, SQ, H, D, 1]));
    add("q rank 0", Call { q: (vec![], f32_), ..Call::valid() }, BadShape("q", vec![]));
    add("k rank 3", Call { k: (vec![B, SK, HK * D], f32_), ..Call::valid() }, BadShape("k", vec![B, SK, HK * D]));
    add("v rank 5", Call { v: (vec![1, B, SK, HK, D], f32_), ..Call::valid() }, BadShape("v", vec![1, B, SK, HK, D]));
    add("mask rank 3", Call { mask: Some((vec![H, SQ, SK], DType::Bool)), ..Call::valid() }, BadShape("mask", vec![H, SQ, SK]));
    add("mask rank 2", Call { mask: Some((vec![SQ, SK], DType::Bool)), ..Call::valid() }, BadShape("mask", vec![SQ, SK]));
    add("bias rank 5", Call { bias: Some((vec![1, B, H, SQ, SK], f32_)), ..Call::valid() }, BadShape("bias", vec![1, B, H, SQ, SK]));
    add("bias rank 1", Call { bias: Some((vec![SK], f32_)), ..Call::valid() }, BadShape("bias", vec![SK]));

    // k / v mismatch.
    add("v seqlen != k", Call { v: (vec![B, SK + 1, HK, D], f32_), ..Call::valid() }, BadShape("v", vec![B, SK + 1, HK, D]));
    add("v kv_heads != k", Call { v: (vec![B, SK, H, D], f32_), ..Call::valid() }, BadShape("v", vec![B, SK, H, D]));
    add("v head_dim != k", Call { v: (vec![B, SK, HK, 2 * D], f32_), ..Call::valid() }, BadShape("v", vec![B, SK, HK, 2 * D]));
    add("v batch != k", Call { v: (vec![1, SK, HK, D], f32_), ..Call::valid() }, BadShape("v", vec![1, SK, HK, D]));

    // Batch / head_dim mismatch with q.
    add("k batch != q", Call { k: (vec![B + 1, SK, HK, D], f32_), v: (vec![B + 1, SK, HK, D], f32_), ..Call::valid() }, BadShape("k", vec![B + 1, SK, HK, D]));
    add("k head_dim != q", Call { k: (vec![B, SK, HK, D + 1], f32_), v: (vec![B, SK, HK, D + 1], f32_), ..Call::valid() }, BadShape("k", vec![B, SK, HK, D + 1]));

    // Heads not divisible by kv_heads.
    add("kv_heads 3 of 4", Call { k: (vec![B, SK, 3, D], f32_), v: (vec![B, SK, 3, D], f32_), ..Call::valid() }, BadShape("k", vec![B, SK, 3, D]));
    add("kv_heads 8 > 4", Call { k: (vec![B, SK, 8, D], f32_), v: (vec![B, SK, 8, D], f32_), ..Call::valid() }, BadShape("k", vec![B, SK, 8, D]));

    // Zero-sized dims (none may divide by zero).
    for dim in 0..4 {
        let mut q = vec![B, SQ, H, D];
        q[dim] = 0;
        let mut k = vec![B, SK, HK, D];
        if dim == 0 || dim == 3 {
            k[dim] = 0; // batch and head_dim must match q's
        }
        add(&format!("q dim {dim} zero"), Call { q: (q.clone(), f32_), k: (k.clone(), f32_), v: (k, f32_), mask: None, bias: None, ..Call::valid() }, BadShape("q", q));
    }
    add("k seqlen zero", Call { k: (vec![B, 0, HK, D], f32_), v: (vec![B, 0, HK, D], f32_), mask: None, bias: None, ..Call::valid() }, BadShape("k", vec![B, 0, HK, D]));
    add("k kv_heads zero", Call { k: (vec![B, SK, 0, D], f32_), v: (vec![B, SK, 0, D], f32_), mask: None, bias: None, ..Call::valid() }, BadShape("k", vec![B, SK, 0, D]));
    add("heads zero", Call { q: (vec![B, SQ, 0, D], f32_), mask: None, bias: None, ..Call::valid() }, BadShape("q", vec![B, SQ, 0, D]));
    add("mask dim zero", Call { mask: Some((vec![B, H, 0, SK], DType::Bool)), ..Call::valid() }, BadShape("mask", vec![B, H, 0, SK]));
    add("bias dim zero", Call { bias: Some((vec![B, H, SQ, 0], f32_)), ..Call::valid() }, BadShape("bias", vec![B, H, SQ, 0]));

    // Dtypes.
    for dt in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        add(&format!("mask {dt:?}"), Call { mask: Some((vec![B, H, SQ, SK], dt)), ..Call::valid() }, BadDType("mask", dt));
    }
    add("bias Bool", Call { bias: Some((vec![B, H, SQ, SK], DType::Bool)), ..Call::valid() }, BadDType("bias", DType::Bool));
    add("q Bool", Call { q: (vec![B, SQ, H, D], DType::Bool), ..Call::valid() }, BadDType("q", DType::Bool));
    add("k F16 with q F32", Call { k: (vec![B, SK, HK, D], DType::F16), ..Call::valid() }, BadDType("k", DType::F16));
    add("v BF16 with q F32", Call { v: (vec![B, SK, HK, D], DType::BF16), ..Call::valid() }, BadDType("v", DType::BF16));
    add("k, v Bool with q F32", Call { k: (vec![B, SK, HK, D], DType::Bool), v: (vec![B, SK, HK, D], DType::Bool), ..Call::valid() }, BadDType("k", DType::Bool));

    // Broadcast dims that are neither 1 nor full, for mask and bias.
    let bad_dims: [(usize, Vec<usize>); 4] = [(0, vec![B + 1, 2 * B + 1]), (1, vec![3, H + 1, 2 * H]), (2, vec![SQ - 1, SQ + 1, 2]), (3, vec![SK - 1, SK + 1, 2])];
    for (dim, bad) in bad_dims {
        for n in bad {
            let mut s = vec![B, H, SQ, SK];
            s[dim] = n;
            add(&format!("mask dim {dim} = {n}"), Call { mask: Some((s.clone(), DType::Bool)), ..Call::valid() }, BadShape("mask", s.clone()));
            add(&format!("bias dim {dim} = {n}"), Call { bias: Some((s.clone(), f32_)), ..Call::valid() }, BadShape("bias", s));
        }
    }
    // A mask laid out as q ([b, sq, h, sk]-style transposes) is not broadcastable.
    add("mask [b, sq, h, sk]", Call { mask: Some((vec![B, SQ, H, SK], DType::Bool)), ..Call::valid() }, BadShape("mask", vec![B, SQ, H, SK]));
    add("bias [sk, sq, h, b]", Call { bias: Some((vec![SK, SQ, H, B], f32_)), ..Call::valid() }, BadShape("bias", vec![SK, SQ, H, B]));

    // Scale and softcap.
    for s in [0.0, -0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1e-300] {
        add(&format!("scale {s}"), Call { scale: Some(s), ..Call::valid() }, BadParam("scale"));
    }
    for c in [-1.0, -1e-300, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        add(&format!("softcap {c}"), Call { softcap: c, ..Call::valid() }, BadParam("softcap"));
    }

    let n = cases.len();
    eprintln!("bad_forward_inputs: {n} bad calls");
    let m = &m;
    // Both forward passes validate alike.
    let check = move |c: &Call, e: &Expect| {
        matches(c.run(m), e)?;
        matches(c.run_by(m, ForwardPath::Materialized), e).map_err(|why| format!("forward_materialized: {why}"))
    };
    run_checks(cases.into_iter().map(|(name, c, e)| (name, Box::new(move || check(&c, &e)) as Box<dyn Fn() -> Result<(), String>>)).collect());
}

/// Bad inputs with several faults are still rejected (with one of the faults), never a panic.
#[test]
fn several_faults_never_panic() {
    set_output_poisoning(true);
    let m = Maker(RefCell::new(fresh_rng("several_faults_never_panic")));
    let mut checks: Vec<(String, Box<dyn Fn() -> Result<(), String> + '_>)> = Vec::new();
    let shapes = [vec![0, 0, 0, 0], vec![1, 0, 3, 0], vec![2, 5, 0, 8], vec![0, 5, 4, 8], vec![2, 7, 3, 8], vec![1], vec![2, 5, 4, 8, 1]];
    for qs in &shapes {
        for ks in &shapes {
            for dt in [DType::F32, DType::Bool] {
                let (qs, ks) = (qs.clone(), ks.clone());
                let m = &m;
                checks.push((
                    format!("q {qs:?}, k/v {ks:?} {dt:?}"),
                    Box::new(move || {
                        let valid = qs.len() == 4 && ks.len() == 4 && !qs.contains(&0) && !ks.contains(&0) && qs[0] == ks[0] && qs[3] == ks[3] && qs[2] % ks[2] == 0 && dt == DType::F32;
                        let (q, k) = (m.t(&qs, DType::F32), m.t(&ks, dt));
                        match (attention(&q, &k, &k).scale(-1.0).forward(), valid) {
                            (Err(Error::Param { arg: "scale", .. }), true) | (Err(Error::Shape { .. } | Error::DType { .. }), false) => Ok(()),
                            (r, _) => Err(format!("valid shapes: {valid}; got {:?}", r.err())),
                        }
                    }),
                ));
            }
        }
    }
    run_checks(checks);
}

#[test]
fn bad_dout() {
    set_output_poisoning(true);
    let m = Maker(RefCell::new(fresh_rng("bad_dout")));
    use Expect::*;
    for dt in [DType::F32, DType::F64, DType::BF16] {
        let call = Call {
            q: (vec![B, SQ, H, D], dt),
            k: (vec![B, SK, HK, D], dt),
            v: (vec![B, SK, HK, D], dt),
            bias: Some((vec![1, H, SQ, SK], dt)),
            ..Call::valid()
        };
        let fwd = call.run(&m).unwrap();
        let ok = fwd.backward(&m.t(&[B, SQ, H, D], dt));
        assert!(ok.is_ok(), "{dt:?}: a valid dout is rejected: {:?}", ok.err());
        let other = if dt == DType::F32 { DType::F64 } else { DType::F32 };
        let bad: Vec<(Vec<usize>, DType, Expect)> = vec![
            (vec![B, SQ, H, D + 1], dt, BadShape("dout", vec![B, SQ, H, D + 1])),
            (vec![B, SQ, H * D], dt, BadShape("dout", vec![B, SQ, H * D])),
            (vec![B, H, SQ, D], dt, BadShape("dout", vec![B, H, SQ, D])),
            (vec![1, SQ, H, D], dt, BadShape("dout", vec![1, SQ, H, D])),
            (vec![B, SQ, H, D, 1], dt, BadShape("dout", vec![B, SQ, H, D, 1])),
            (vec![B, SQ, H, 0], dt, BadShape("dout", vec![B, SQ, H, 0])),
            (vec![B, SQ, H, D], other, BadDType("dout", other)),
            (vec![B, SQ, H, D], DType::F16, BadDType("dout", DType::F16)),
            (vec![B, SQ, H, D], DType::Bool, BadDType("dout", DType::Bool)),
        ];
        let fwd = &fwd;
        let m = &m;
        run_checks(
            bad.into_iter()
                .map(|(s, t, e)| (format!("{dt:?} out, dout {s:?} {t:?}"), Box::new(move || matches(fwd.backward(&m.t(&s, t)), &e)) as Box<dyn Fn() -> Result<(), String>>))
                .collect(),
        );
    }
}

/// Errors of the tensor constructors and views.
#[test]
fn bad_tensors() {
    set_output_poisoning(true);
    let m = Maker(RefCell::new(fresh_rng("bad_tensors")));
    use Expect::*;
    let t = m.t(&[2, 3, 4], DType::F32);
    let t = &t;
    let checks: Vec<(String, Box<dyn Fn() -> Result<(), String> + '_>)> = vec![
        ("from_vec too short".into(), Box::new(|| matches(Tensor::from_vec(vec![1.5f32; 5], &[2, 3], &Device::Cpu), &BadShape("data", vec![5])))),
        ("from_vec too long".into(), Box::new(|| matches(Tensor::from_vec(vec![true; 7], &[2, 3], &Device::Cpu), &BadShape("data", vec![7])))),
        ("as_strided rank mismatch".into(), Box::new(|| matches(t.as_strided(&[2, 12], &[12], 0), &BadParam("strides")))),
        ("as_strided past the end".into(), Box::new(|| matches(t.as_strided(&[2, 12], &[12, 1], 1), &BadParam("strides")))),
        ("as_strided huge stride".into(), Box::new(|| matches(t.as_strided(&[2, 2], &[1000, 1], 0), &BadParam("strides")))),
        // Sizes past usize: typed errors, not overflow panics (or, in release, views wrapped
        // back into their storage).
        ("as_strided elements overflow".into(), Box::new(|| matches(t.as_strided(&[1 << 33, 1 << 33], &[0, 0], 0), &BadParam("strides")))),
        ("as_strided extent overflows".into(), Box::new(|| matches(t.as_strided(&[2], &[usize::MAX], 0), &BadParam("strides")))),
        ("as_strided offset overflows".into(), Box::new(|| matches(t.as_strided(&[2], &[1], usize::MAX), &BadParam("strides")))),
        ("from_fn elements overflow".into(), Box::new(|| matches(Tensor::from_fn(&[1 << 40, 1 << 40], DType::F32, &Device::Cpu, |_| 0.0), &BadShape("shape", vec![1 << 40, 1 << 40])))),
        ("from_fn bytes overflow".into(), Box::new(|| matches(Tensor::from_fn(&[1 << 62], DType::F32, &Device::Cpu, |_| 0.0), &BadShape("shape", vec![1 << 62])))),
        ("from_vec elements overflow".into(), Box::new(|| matches(Tensor::from_vec(vec![0f32; 3], &[1 << 40, 1 << 40], &Device::Cpu), &BadShape("data", vec![3])))),
        ("from_vec empty of huge dims".into(), Box::new(|| Tensor::from_vec(Vec::<f32>::new(), &[0, 1 << 40, 1 << 40], &Device::Cpu).map(|_| ()).map_err(|e| e.to_string()))),
        ("to_vec wrong type".into(), Box::new(|| matches(t.to_vec::<f64>(), &BadDType("T", DType::F64)))),
        ("to_vec bool of f32".into(), Box::new(|| matches(t.to_vec::<bool>(), &BadDType("T", DType::Bool)))),
        ("valid view".into(), Box::new(|| t.as_strided(&[4, 6], &[6, 1], 0).map(|_| ()).map_err(|e| e.to_string()))),
        ("valid to_vec".into(), Box::new(|| t.to_vec::<f32>().map(|_| ()).map_err(|e| e.to_string()))),
    ];
    run_checks(checks);
}
