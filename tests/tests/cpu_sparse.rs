//! The sparse-mask API on the CPU: every form of `SparseMask` (windows, causal windows, sinks,
//! compressed causal, dense, bit-packed, block bitsets, dense masks rounded to blocks, BCSR) and
//! their combinations, prepared and passed with `sparse_mask`, give bit for bit the forward (O,
//! LSE) and backward (dq, dk, dv, dbias) of the same call with the equivalent dense mask, built
//! by `dmattn_tests::sparse` from the documented rules, independently of dmattn. Also: rows with
//! no visible key, one prepared mask used by several calls, `memory_bytes` and
//! `estimated_speedup`, and every bad sparse mask rejected with a typed error naming the argument.
//!
//! Random draws come from `fresh_rng` (set `DMATTN_SEED` to the printed seed to replay a run).
use dmattn::{DType, Device, Error, PreparedMask, SparseMask, Tensor, attention, set_output_poisoning};
use dmattn_tests::sparse::{BandCtor, DataPart, Kind, MaskSpec, random_bcsr, random_part, random_spec};
use dmattn_tests::{Case, Inputs, fresh_rng, seeded_rng};
use rand::Rng;
use rand::rngs::StdRng;
use std::panic::{AssertUnwindSafe, catch_unwind};

const CPU: Device = Device::Cpu;

/// The two tensors are identical: shape, dtype and every value's bits.
fn same(name: &str, got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.shape() != want.shape() || got.dtype() != want.dtype() {
        return Err(format!("{name}: {:?} {:?}, expected {:?} {:?}", got.shape(), got.dtype(), want.shape(), want.dtype()));
    }
    let (a, b) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    match a.iter().zip(&b).position(|(x, y)| x.to_bits() != y.to_bits()) {
        Some(at) => Err(format!("{name}[{at}] = {}, the dense mask gives {}", a[at], b[at])),
        None => Ok(()),
    }
}

/// `case` run with `prepared` (the mask `spec` describes) against the same call with the
/// equivalent dense mask: forward and backward bit for bit; and, on rows the dense mask leaves
/// without a key, O = 0, LSE = -inf and dq = 0.
fn check_prepared(case: &Case, spec: &MaskSpec, prepared: &PreparedMask, inputs: &Inputs, rng: &mut StdRng) -> Result<(), String> {
    set_output_poisoning(true);
    let fail = |m: String| format!("{m}\n  for {case:?}\n  with mask {spec:?}");
    let got = case.call(inputs).sparse_mask(prepared).forward().map_err(|e| fail(format!("sparse forward: {e}")))?;
    let (dense_case, dense_inputs) = spec.dense_call(case, inputs);
    let want = dense_case.forward(&dense_inputs).map_err(|e| fail(format!("dense forward: {e}")))?;
    same("out", &got.out, &want.out).map_err(fail)?;
    same("lse", &got.lse, &want.lse).map_err(fail)?;

    let n: usize = case.q_shape().iter().product();
    let dout: Vec<f64> = (0..n).map(|_| rng.random::<f64>() * 2.0 - 1.0).collect();
    let dout = Tensor::from_fn(&case.q_shape(), case.dtype, &CPU, |i| dout[i]).unwrap();
    let g = got.backward(&dout).map_err(|e| fail(format!("sparse backward: {e}")))?;
    let w = want.backward(&dout).map_err(|e| fail(format!("dense backward: {e}")))?;
    same("dq", &g.dq, &w.dq).map_err(fail)?;
    same("dk", &g.dk, &w.dk).map_err(fail)?;
    same("dv", &g.dv, &w.dv).map_err(fail)?;
    match (&g.dbias, &w.dbias) {
        (Some(a), Some(b)) => same("dbias", a, b).map_err(fail)?,
        (None, None) => {}
        _ => return Err(fail("dbias present on one side only".into())),
    }

    // Rows with no visible key, read from the independent dense mask.
    let (sq, sk, h, d) = (case.seqlen_q, case.seqlen_k, case.heads, case.head_dim);
    let visible = spec.visible(case, case.causal);
    let (out, lse, dq) = (got.out.to_f64_vec().unwrap(), got.lse.to_f64_vec().unwrap(), g.dq.to_f64_vec().unwrap());
    for (r, row) in visible.chunks(sk).enumerate() {
        let (b, hh, i) = (r / (h * sq), (r / sq) % h, r % sq);
        let at = ((b * sq + i) * h + hh) * d;
        if row.iter().any(|&v| v) {
            if !lse[r].is_finite() {
                return Err(fail(format!("row (b {b}, h {hh}, i {i}) sees a key but LSE = {}", lse[r])));
            }
        } else if lse[r] != f64::NEG_INFINITY || out[at..at + d].iter().chain(&dq[at..at + d]).any(|&x| x != 0.0) {
            return Err(fail(format!("row (b {b}, h {hh}, i {i}) sees no key but LSE = {}, O or dq nonzero", lse[r])));
        }
    }
    Ok(())
}

/// [`check_prepared`] on fresh inputs, the mask prepared on the CPU.
fn check(case: &Case, spec: &MaskSpec, rng: &mut StdRng) -> Result<(), String> {
    let prepared = spec.prepare(&CPU, case.seqlen_q, case.seqlen_k).map_err(|e| format!("prepare: {e}\n  for {case:?}\n  with mask {spec:?}"))?;
    let inputs = case.inputs(rng);
    check_prepared(case, spec, &prepared, &inputs, rng)
}

/// Runs every check, collecting failures (a panic counts as one), and fails listing the first
/// few with the count.
fn all_pass(name: &str, checks: impl IntoIterator<Item = Result<(), String>>) {
    let (mut n, mut failures) = (0, Vec::new());
    for r in checks {
        n += 1;
        if let Err(e) = r {
            failures.push(e);
        }
    }
    assert!(n > 0, "{name}: no checks ran");
    let shown: Vec<_> = failures.iter().take(5).cloned().collect();
    assert!(failures.is_empty(), "{name}: {} of {n} checks failed; the first:\n{}", failures.len(), shown.join("\n"));
    eprintln!("{name}: {n} checks passed");
}

/// A random broadcast shape `[{1|b}, {1|hk|h}, {1|sq}, {1|sk}]` for a bias.
fn bias_shape(rng: &mut StdRng, c: &Case) -> [usize; 4] {
    let or1 = |rng: &mut StdRng, n: usize| if rng.random_bool(0.5) { n } else { 1 };
    let heads = [1, c.kv_heads, c.heads][rng.random_range(0..3)];
    [or1(rng, c.batch), heads, or1(rng, c.seqlen_q), if rng.random_bool(0.8) { c.seqlen_k } else { 1 }]
}

/// Window sides worth testing for `sq` queries and `sk` keys: unbounded, small, around `sk` and
/// around `sq + sk` (beyond which a side binds nothing), and `usize::MAX`.
fn sides(sq: usize, sk: usize) -> Vec<Option<usize>> {
    let mut v: Vec<usize> = vec![0, 1, 2, 5, sk.saturating_sub(1), sk, sk + 1, sq + sk - 1, sq + sk, sq + sk + 1, usize::MAX];
    v.sort_unstable();
    v.dedup();
    std::iter::once(None).chain(v.into_iter().map(Some)).collect()
}

/// Windows with every left and right edge from 0 to beyond `sq + sk` (and unbounded), with and
/// without sinks, with and without `.causal(true)` on the call; `causal_window` likewise.
#[test]
fn windows_match_dense() {
    let mut rng = fresh_rng("windows_match_dense");
    let mut results = Vec::new();
    for &(sq, sk) in &[(1, 1), (1, 9), (6, 9), (9, 6), (17, 17), (33, 70), (70, 33)] {
        let case = Case { dtype: DType::F64, ..Case::new(2, sq, sk, 2, 1, 4) };
        for (left, right) in sides(sq, sk).into_iter().flat_map(|l| sides(sq, sk).into_iter().map(move |r| (l, r))) {
            for sinks in [0, 2, sk + 3, usize::MAX] {
                let causal = rng.random_bool(0.3);
                let bias = rng.random_bool(0.3).then(|| bias_shape(&mut rng, &case));
                let case = Case { causal, bias, ..case.clone() };
                results.push(check(&case, &MaskSpec::band(BandCtor::Window(left, right), sinks), &mut rng));
                if right == Some(0)
                    && let Some(l) = left
                {
                    results.push(check(&case, &MaskSpec::band(BandCtor::CausalWindow(l), sinks), &mut rng));
                }
            }
        }
    }
    all_pass("windows_match_dense", results);
}

/// The named constructors are the windows their docs say, and `all()` is no mask: the outputs
/// are bit-identical (each is also checked against its dense equivalent elsewhere).
#[test]
fn constructors_are_their_windows() {
    let mut rng = fresh_rng("constructors_are_their_windows");
    for &(sq, sk) in &[(1, 40), (40, 1), (37, 50), (50, 37), (64, 64)] {
        let case = Case { dtype: DType::F64, bias: Some([1, 1, sq, sk]), ..Case::new(2, sq, sk, 4, 2, 8) };
        let i = case.inputs(&mut rng);
        let run = |m: &SparseMask, causal: bool| {
            let p = m.prepare(sq, sk).unwrap();
            assert_eq!(p.memory_bytes(), 0, "a parametric mask holds no memory");
            assert!(matches!(p.device(), Device::Cpu));
            let f = attention(&i.q, &i.k, &i.v).bias(i.bias.as_ref().unwrap()).sparse_mask(&p).causal(causal).forward().unwrap();
            (f.out, f.lse)
        };
        let plain = |causal: bool| {
            let f = attention(&i.q, &i.k, &i.v).bias(i.bias.as_ref().unwrap()).causal(causal).forward().unwrap();
            (f.out, f.lse)
        };
        let eq = |what: &str, a: (Tensor, Tensor), b: (Tensor, Tensor)| {
            same("out", &a.0, &b.0).and(same("lse", &a.1, &b.1)).unwrap_or_else(|e| panic!("{what} (sq {sq}, sk {sk}): {e}"));
        };
        eq("causal() vs window(None, Some(0))", run(&SparseMask::causal(), false), run(&SparseMask::window(None, Some(0)), false));
        eq("causal() vs .causal(true)", run(&SparseMask::causal(), false), plain(true));
        eq("all() vs no mask", run(&SparseMask::all(), false), plain(false));
        eq("all() + causal(true) vs causal(true)", run(&SparseMask::all(), true), plain(true));
        eq("window(None, None) vs no mask", run(&SparseMask::window(None, None), false), plain(false));
        eq("sinks without a left edge change nothing", run(&SparseMask::causal().with_sinks(3), false), plain(true));
        for l in [0, 1, 7, sk, sq + sk] {
            eq("causal_window(l) vs window(Some(l), Some(0))", run(&SparseMask::causal_window(l), false), run(&SparseMask::window(Some(l), Some(0)), false));
            eq(
                "window(l, r) + causal(true) vs window(l, 0)",
                run(&SparseMask::window(Some(l), Some(9)), true),
                run(&SparseMask::window(Some(l), Some(0)), false),
            );
        }
        eq(
            "compress_causal(usize::MAX) vs compress_causal(2^40)",
            run(&SparseMask::compress_causal(usize::MAX), false),
            run(&SparseMask::compress_causal(1 << 40), false),
        );
        if sq == sk {
            eq("compress_causal(1) vs causal() where sq = sk", run(&SparseMask::compress_causal(1), false), run(&SparseMask::causal(), false));
        }
    }
}

/// Compressed causal with factors 1, 2, 4, 64 and `usize::MAX`, key counts about `sq / cf` (and
/// others: `sq != sk`), alone and with a left window and sinks around the compressed diagonal,
/// and with data parts.
#[test]
fn compress_causal_matches_dense() {
    let mut rng = fresh_rng("compress_causal_matches_dense");
    let mut results = Vec::new();
    for cf in [1, 2, 4, 64, usize::MAX] {
        for sq in [1usize, 3, 64, 130, 257] {
            let base = sq.div_ceil(cf);
            let mut sks = vec![base, base + 1, base.saturating_sub(1).max(1), sq, 2 * sq + 3];
            sks.sort_unstable();
            sks.dedup();
            for sk in sks {
                let case = Case { dtype: DType::F64, ..Case::new(1, sq, sk, 2, 1, 4) };
                for (left, sinks) in [(None, 0), (Some(0), 0), (Some(1), 0), (Some(3), 2), (Some(0), 1), (Some(sk + 1), 0), (Some(2), sk + 5)] {
                    let mut spec = MaskSpec::band(BandCtor::CompressCausal(cf), sinks);
                    if let Some(l) = left {
                        spec.bands.push((BandCtor::Window(Some(l), None), 0));
                    }
                    let bias = rng.random_bool(0.3).then(|| bias_shape(&mut rng, &case));
                    results.push(check(&Case { bias, ..case.clone() }, &spec, &mut rng));
                }
                // With data parts, and a bigger head layout.
                let case = Case { dtype: DType::F64, ..Case::new(2, sq, sk, 4, 2, 4) };
                for kind in [Kind::Dense, Kind::Bcsr(64), Kind::Bitset(128), Kind::Packed] {
                    let spec = MaskSpec::band(BandCtor::CompressCausal(cf), 0).and(random_part(&mut rng, &case, kind, [2, 2]));
                    results.push(check(&case, &spec, &mut rng));
                }
            }
        }
    }
    all_pass("compress_causal_matches_dense", results);
}

/// Sizes of the data-part checks: (b, sq, sk, h, hk), with block edges and GQA.
const DATA_DIMS: [(usize, usize, usize, usize, usize); 6] =
    [(2, 1, 1, 2, 1), (1, 37, 200, 4, 2), (2, 129, 65, 4, 4), (2, 200, 257, 3, 1), (1, 64, 128, 2, 2), (2, 130, 3, 6, 2)];

/// Each data part alone (dense, packed bits, bitsets, dense masks rounded to blocks, BCSR; blocks
/// of 64 and 128), with every plane broadcast (batch 1 or b, heads 1, hk or h), random values.
#[test]
fn data_parts_match_dense() {
    let mut rng = fresh_rng("data_parts_match_dense");
    let kinds =
        [Kind::Dense, Kind::Packed, Kind::Bitset(64), Kind::Bitset(128), Kind::DenseBlocks(64), Kind::DenseBlocks(128), Kind::Bcsr(64), Kind::Bcsr(128)];
    let mut results = Vec::new();
    for &(b, sq, sk, h, hk) in &DATA_DIMS {
        for kind in kinds {
            for ph in [1, hk, h] {
                for pb in [1, b] {
                    let case = Case { dtype: DType::F64, ..Case::new(b, sq, sk, h, hk, 8) };
                    results.push(check(&case, &random_part(&mut rng, &case, kind, [pb, ph]), &mut rng));
                }
            }
        }
    }
    all_pass("data_parts_match_dense", results);
}

/// BCSR in particular: empty rows, every row empty (nnz 0), unsorted and repeated indices,
/// unreferenced tails, a single index repeated, every block listed.
#[test]
fn bcsr_rows_match_dense() {
    let mut rng = fresh_rng("bcsr_rows_match_dense");
    let mut results = Vec::new();
    for &(b, sq, sk, h, hk) in &DATA_DIMS {
        let case = Case { dtype: DType::F64, ..Case::new(b, sq, sk, h, hk, 8) };
        for block in [64, 128] {
            let (qb, kb) = (sq.div_ceil(block), sk.div_ceil(block) as i32);
            for _ in 0..4 {
                results.push(check(&case, &MaskSpec::data(random_bcsr(&mut rng, [b, hk], block, sq, sk)), &mut rng));
            }
            let bcsr = |row_ptr: Vec<i32>, col_idx: Vec<i32>| {
                let nnz = col_idx.len();
                MaskSpec::data(DataPart::Bcsr { planes: [1, 1], block, row_ptr, col_idx, nnz })
            };
            // No entries at all.
            results.push(check(&case, &bcsr(vec![0; qb + 1], vec![]), &mut rng));
            // Every row: every block, backwards, twice.
            let row: Vec<i32> = (0..kb).rev().chain(0..kb).collect();
            let ptr = (0..=qb).map(|r| (r * row.len()) as i32).collect();
            results.push(check(&case, &bcsr(ptr, row.repeat(qb)), &mut rng));
            // Only the last row, its last block repeated; a tail nobody references.
            let mut ptr = vec![0; qb];
            ptr.push(3);
            results.push(check(&case, &bcsr(ptr, vec![kb - 1, kb - 1, kb - 1, 0, 0]), &mut rng));
        }
    }
    all_pass("bcsr_rows_match_dense", results);
}

/// Named combinations (window ∧ dense, causal ∧ BCSR, bitset ∧ packed, dense ∧ packed, dense
/// blocks ∧ bitset ∧ causal window with sinks, compressed causal ∧ BCSR ∧ dense), then random
/// ones of up to four parts of any kind, with `.causal(true)` (not with compressed causal),
/// bias of any broadcast shape, softcap, scale, GQA, f64 / f32 / bf16.
#[test]
fn combinations_match_dense() {
    let mut rng = fresh_rng("combinations_match_dense");
    let mut results = Vec::new();
    let named: [&[Kind]; 8] = [
        &[Kind::Band, Kind::Dense],
        &[Kind::Band, Kind::Bcsr(64)],
        &[Kind::Bitset(64), Kind::Packed],
        &[Kind::Dense, Kind::Packed],
        &[Kind::DenseBlocks(128), Kind::Bitset(64), Kind::Band],
        &[Kind::Compress(4), Kind::Bcsr(128), Kind::Dense],
        &[Kind::Bcsr(64), Kind::Bcsr(128), Kind::DenseBlocks(64)],
        &[Kind::Band, Kind::Band, Kind::Packed],
    ];
    for kinds in named {
        for &(b, sq, sk, h, hk) in &DATA_DIMS {
            let case = Case { dtype: DType::F64, causal: rng.random_bool(0.3) && !matches!(kinds[0], Kind::Compress(_)), ..Case::new(b, sq, sk, h, hk, 8) };
            results.push(check(&case, &random_spec(&mut rng, &case, kinds), &mut rng));
        }
    }
    // Named ones with exact parameters: causal ∧ BCSR; causal window + sinks ∧ dense, under
    // .causal(true); window ∧ bitset ∧ packed.
    let case = Case { dtype: DType::F64, bias: Some([1, 4, 1, 150]), ..Case::new(2, 150, 150, 4, 2, 8) };
    let causal_bcsr = MaskSpec::band(BandCtor::Causal, 0).and(MaskSpec::data(random_bcsr(&mut rng, [2, 4], 64, 150, 150)));
    results.push(check(&case, &causal_bcsr, &mut rng));
    let cw = MaskSpec::band(BandCtor::CausalWindow(20), 4).and(random_part(&mut rng, &case, Kind::Dense, [1, 2]));
    results.push(check(&Case { causal: true, ..case.clone() }, &cw, &mut rng));
    let wbp = MaskSpec::band(BandCtor::Window(Some(30), Some(10)), 0).and(random_part(&mut rng, &case, Kind::Bitset(128), [2, 1])).and(random_part(
        &mut rng,
        &case,
        Kind::Packed,
        [2, 4],
    ));
    results.push(check(&case, &wbp, &mut rng));

    let all = [
        Kind::Band,
        Kind::Dense,
        Kind::Packed,
        Kind::Bitset(64),
        Kind::Bitset(128),
        Kind::DenseBlocks(64),
        Kind::DenseBlocks(128),
        Kind::Bcsr(64),
        Kind::Bcsr(128),
    ];
    for _ in 0..250 {
        let (b, hk, group) = (rng.random_range(1..=2), rng.random_range(1..=2), rng.random_range(1..=3));
        let (sq, sk) = (rng.random_range(1..=160), rng.random_range(1..=160));
        let mut kinds: Vec<Kind> = (0..rng.random_range(1..=4)).map(|_| all[rng.random_range(0..all.len())]).collect();
        let compress = rng.random_bool(0.15).then(|| [1, 2, 4, 64][rng.random_range(0..4)]);
        kinds.extend(compress.map(Kind::Compress));
        let dtype = [DType::F64, DType::F64, DType::F32, DType::BF16][rng.random_range(0..4)];
        let mut case = Case { dtype, causal: compress.is_none() && rng.random_bool(0.4), ..Case::new(b, sq, sk, hk * group, hk, rng.random_range(1..=12)) };
        case.bias = rng.random_bool(0.4).then(|| bias_shape(&mut rng, &case));
        case.softcap = if rng.random_bool(0.3) { 5.0 } else { 0.0 };
        case.scale = rng.random_bool(0.2).then(|| rng.random_range(0.05..2.0));
        let spec = random_spec(&mut rng, &case, &kinds);
        results.push(check(&case, &spec, &mut rng));
    }
    all_pass("combinations_match_dense", results);
}

/// One prepared mask serves several calls: different q/k/v values, head counts (within its
/// planes), dtypes, bias and options; and a mask prepared once gives what preparing it again
/// gives.
#[test]
fn prepared_mask_serves_many_calls() {
    let mut rng = fresh_rng("prepared_mask_serves_many_calls");
    let (sq, sk) = (140, 200);
    let shape_case = Case::new(2, sq, sk, 4, 2, 8);
    let spec = MaskSpec::band(BandCtor::CausalWindow(50), 3).and(MaskSpec::data(random_bcsr(&mut rng, [1, 2], 64, sq, sk))).and(random_part(
        &mut rng,
        &shape_case,
        Kind::Dense,
        [2, 2],
    ));
    let prepared = spec.prepare(&CPU, sq, sk).unwrap();
    assert!(prepared.memory_bytes() > 0);
    let cases = [
        Case { dtype: DType::F64, ..Case::new(2, sq, sk, 4, 2, 8) },
        Case { dtype: DType::F32, bias: Some([2, 1, sq, sk]), softcap: 3.0, ..Case::new(2, sq, sk, 2, 2, 16) },
        Case { dtype: DType::BF16, causal: true, ..Case::new(2, sq, sk, 6, 2, 4) },
        Case { dtype: DType::F64, scale: Some(0.3), ..Case::new(2, sq, sk, 4, 2, 8) },
    ];
    let mut results = Vec::new();
    for case in &cases {
        let inputs = case.inputs(&mut rng);
        results.push(check_prepared(case, &spec, &prepared, &inputs, &mut rng));
    }
    // The mask as prepared again, and as the first call left it.
    let again = spec.prepare(&CPU, sq, sk).unwrap();
    let inputs = cases[0].inputs(&mut rng);
    let a = cases[0].call(&inputs).sparse_mask(&prepared).forward().unwrap();
    let b = cases[0].call(&inputs).sparse_mask(&again).forward().unwrap();
    results.push(same("out", &a.out, &b.out));
    all_pass("prepared_mask_serves_many_calls", results);
}

/// A bool mask with a parametric sparse mask is the two ANDed: the same outputs as the dense
/// mask and the rule combined into one prepared mask.
#[test]
fn mask_with_parametric_sparse_mask() {
    let mut rng = fresh_rng("mask_with_parametric_sparse_mask");
    let (sq, sk) = (37, 70);
    let case = Case { dtype: DType::F64, mask: Some([2, 2, 1, sk]), bias: Some([1, 4, sq, sk]), ..Case::new(2, sq, sk, 4, 2, 8) };
    let inputs = case.inputs(&mut rng);
    let mut results = Vec::new();
    for rule in [SparseMask::causal_window(9).with_sinks(3), SparseMask::window(Some(5), Some(20)), SparseMask::compress_causal(2)] {
        let alone = rule.clone().prepare(sq, sk).unwrap();
        let both = rule.and(SparseMask::dense(inputs.mask.as_ref().unwrap())).prepare(sq, sk).unwrap();
        let a = case.call(&inputs).sparse_mask(&alone).forward().unwrap();
        let b = attention(&inputs.q, &inputs.k, &inputs.v).bias(inputs.bias.as_ref().unwrap()).sparse_mask(&both).forward().unwrap();
        results.push(same("out", &a.out, &b.out));
        results.push(same("lse", &a.lse, &b.lse));
    }
    all_pass("mask_with_parametric_sparse_mask", results);
}

/// `memory_bytes` is 0 for a parametric mask and positive with data; `estimated_speedup` is
/// what its docs define (64x64 tiles over those the mask's data and band both touch, computed
/// here independently), 1 for `all()`, and far above 1 for a sliding window on a long sequence
/// (at a million tokens, promptly).
#[test]
fn memory_and_estimated_speedup() {
    let mut rng = fresh_rng("memory_and_estimated_speedup");
    let window = SparseMask::causal_window(128).with_sinks(4).prepare(4096, 4096).unwrap();
    assert_eq!(window.memory_bytes(), 0);
    let speedup = window.estimated_speedup().unwrap();
    assert!(speedup > 10.0, "causal_window(128) over 4096 keys: estimated speedup {speedup}");
    let expected = MaskSpec::band(BandCtor::CausalWindow(128), 4).estimated_speedup(4096, 4096);
    assert_eq!(speedup, expected, "causal_window(128) + 4 sinks at 4096");
    assert_eq!(SparseMask::all().prepare(300, 500).unwrap().estimated_speedup().unwrap(), 1.0);
    // A million-token window (16384^2 tiles, which the estimate does not walk): query tile r
    // sees key tiles r - 16..=r, the first 16 fewer.
    let long = SparseMask::causal_window(1024).prepare(1 << 20, 1 << 20).unwrap().estimated_speedup().unwrap();
    let visited = (1..=16).sum::<usize>() + (16384 - 16) * 17;
    assert_eq!(long, (16384.0 * 16384.0) / visited as f64);
    for (ctor, sq, sk) in [
        (BandCtor::Causal, 1000, 1000),
        (BandCtor::Window(Some(64), Some(64)), 2000, 3000),
        (BandCtor::CompressCausal(4), 1024, 256),
        (BandCtor::Window(Some(0), Some(0)), 5, 5),
    ] {
        let p = ctor.build().prepare(sq, sk).unwrap();
        assert_eq!(p.memory_bytes(), 0, "{ctor:?}");
        assert_eq!(p.estimated_speedup().unwrap(), MaskSpec::band(ctor, 0).estimated_speedup(sq, sk), "{ctor:?} at {sq}x{sk}");
    }
    // A compressed band with a window whose last rows' band lies past the keys (query tiles 1
    // and 2 see nothing; found by a random case).
    let past = MaskSpec { bands: vec![(BandCtor::CompressCausal(2), 0), (BandCtor::Window(Some(1), Some(8)), 0)], data: Vec::new() };
    assert_eq!(past.prepare(&CPU, 130, 3).unwrap().estimated_speedup().unwrap(), 3.0);
    assert_eq!(past.estimated_speedup(130, 3), 3.0);
    // With data parts.
    let kinds: [&[Kind]; 6] = [
        &[Kind::Dense],
        &[Kind::Bitset(128), Kind::Band],
        &[Kind::Bcsr(64)],
        &[Kind::DenseBlocks(64), Kind::Packed],
        &[Kind::Compress(2), Kind::Bitset(64)],
        &[Kind::Band, Kind::Packed],
    ];
    for kinds in kinds {
        for &(b, sq, sk, h, hk) in &DATA_DIMS {
            let case = Case::new(b, sq, sk, h, hk, 8);
            let spec = random_spec(&mut rng, &case, kinds);
            let p = spec.prepare(&CPU, sq, sk).unwrap();
            assert!(p.memory_bytes() > 0, "{spec:?}: a mask with data holds memory");
            let got = p.estimated_speedup().unwrap();
            let want = spec.estimated_speedup(sq, sk);
            assert_eq!(got, want, "estimated_speedup of {spec:?} at {sq}x{sk}");
            assert!(got >= 1.0);
        }
    }
}

/// The error a bad mask or call must give.
#[derive(Debug)]
enum Want {
    Shape(&'static str),
    DType(&'static str),
    Param(&'static str),
}

/// `r` is the wanted typed error and its message names the argument.
fn expect<T>(what: &str, r: dmattn::Result<T>, want: Want) -> Result<(), String> {
    let e = match r {
        Ok(_) => return Err(format!("{what}: accepted; expected {want:?}")),
        Err(e) => e,
    };
    let (ok, arg) = match (&e, &want) {
        (Error::Shape { arg, .. }, Want::Shape(a)) | (Error::DType { arg, .. }, Want::DType(a)) | (Error::Param { arg, .. }, Want::Param(a)) => (arg == a, *a),
        (_, Want::Shape(a) | Want::DType(a) | Want::Param(a)) => (false, *a),
    };
    let msg = e.to_string();
    if !ok {
        Err(format!("{what}: got {e:?} (\"{msg}\"); expected {want:?}"))
    } else if !msg.contains(&format!("`{arg}`")) {
        Err(format!("{what}: the message \"{msg}\" does not name `{arg}`"))
    } else {
        Ok(())
    }
}

/// Every bad sparse mask, and every bad use of one, is a typed error naming the argument, at
/// `prepare` (for what the mask alone shows) or at the call; never a panic. Each differs from a
/// valid baseline (checked to work) in one thing.
#[test]
fn rejects_bad_sparse_masks() {
    // Baseline: b 2, sq 70, sk 150, h 4, hk 2; blocks of 64: 2 query blocks, 3 key blocks.
    let (b, sq, sk, h, hk) = (2, 70, 150, 4, 2);
    let case = Case { dtype: DType::F32, ..Case::new(b, sq, sk, h, hk, 8) };
    let inputs = case.inputs(&mut seeded_rng(7));
    let i = &inputs;
    let t_i32 = |v: Vec<i32>, s: &[usize]| Tensor::from_vec(v, s, &CPU).unwrap();
    let t = |s: &[usize], dt: DType| Tensor::from_fn(s, dt, &CPU, |x| (x % 3 != 0) as u8 as f64).unwrap();
    let bcsr = |rp: Vec<i32>, ci: Vec<i32>, block: usize| {
        let n = ci.len();
        SparseMask::bcsr(&t_i32(rp, &[1, 1, sq.div_ceil(block) + 1]), &t_i32(ci, &[1, 1, n]), block)
    };
    let run = |m: &SparseMask| {
        let p = m.prepare(sq, sk)?;
        attention(&i.q, &i.k, &i.v).sparse_mask(&p).forward()
    };
    let dense_ok = t(&[b, hk, sq, sk], DType::Bool);
    let packed_ok = t(&[1, h, sq, sk.div_ceil(8)], DType::U8);
    let bitset_ok = t(&[b, 1, 2, 3], DType::Bool);
    // The baselines work.
    for m in [
        bcsr(vec![0, 2, 3], vec![2, 0, 1], 64),
        bcsr(vec![0, 1], vec![1], 128),
        SparseMask::dense(&dense_ok),
        SparseMask::packed_bits(&packed_ok),
        SparseMask::block_bitset(&bitset_ok, 64),
        SparseMask::dense_blocks(&dense_ok, 128),
        SparseMask::compress_causal(2).and(SparseMask::compress_causal(2)),
        SparseMask::dense(&dense_ok).and(SparseMask::block_bitset(&bitset_ok, 64)).and(SparseMask::packed_bits(&t(&[1, 1, 1, 19], DType::U8))),
    ] {
        run(&m).unwrap();
    }

    type Named<'a> = (&'static str, Box<dyn Fn() -> Result<(), String> + 'a>);
    type Check<'a> = (String, Box<dyn Fn() -> Result<(), String> + 'a>);
    let named: Vec<Named> = vec![
        // BCSR row pointers and indices.
        ("row_ptr decreasing", Box::new(|| expect("", run(&bcsr(vec![0, 2, 1], vec![0, 1], 64)), Want::Param("row_ptr")))),
        ("row_ptr not starting at 0", Box::new(|| expect("", run(&bcsr(vec![1, 1, 2], vec![0, 1], 64)), Want::Param("row_ptr")))),
        ("row_ptr negative", Box::new(|| expect("", run(&bcsr(vec![-1, 1, 2], vec![0, 1], 64)), Want::Param("row_ptr")))),
        ("row_ptr beyond nnz", Box::new(|| expect("", run(&bcsr(vec![0, 1, 3], vec![0, 1], 64)), Want::Param("row_ptr")))),
        (
            "row_ptr beyond nnz, second plane",
            Box::new(|| {
                let m = SparseMask::bcsr(&t_i32(vec![0, 1, 2, 0, 1, 3], &[1, 2, 3]), &t_i32(vec![0, 1, 0, 1], &[1, 2, 2]), 64);
                expect("", run(&m), Want::Param("row_ptr"))
            }),
        ),
        ("block index = number of key blocks", Box::new(|| expect("", run(&bcsr(vec![0, 1, 2], vec![0, 3], 64)), Want::Param("col_idx")))),
        ("block index negative", Box::new(|| expect("", run(&bcsr(vec![0, 1, 2], vec![-1, 0], 64)), Want::Param("col_idx")))),
        ("block index out of range for 128", Box::new(|| expect("", run(&bcsr(vec![0, 1], vec![2], 128)), Want::Param("col_idx")))),
        (
            "row_ptr wrong length",
            Box::new(|| {
                let m = SparseMask::bcsr(&t_i32(vec![0, 1, 2, 2], &[1, 1, 4]), &t_i32(vec![0, 1], &[1, 1, 2]), 64);
                expect("", run(&m), Want::Shape("row_ptr"))
            }),
        ),
        (
            "row_ptr 2-D",
            Box::new(|| {
                let m = SparseMask::bcsr(&t_i32(vec![0, 1, 2], &[1, 3]), &t_i32(vec![0, 1], &[1, 1, 2]), 64);
                expect("", run(&m), Want::Shape("row_ptr"))
            }),
        ),
        (
            "col_idx planes unlike row_ptr's",
            Box::new(|| {
                let m = SparseMask::bcsr(&t_i32(vec![0, 1, 2, 0, 1, 2], &[1, 2, 3]), &t_i32(vec![0, 1], &[1, 1, 2]), 64);
                expect("", run(&m), Want::Shape("col_idx"))
            }),
        ),
        (
            "row_ptr f32",
            Box::new(|| {
                let m = SparseMask::bcsr(&t(&[1, 1, 3], DType::F32), &t_i32(vec![0, 1], &[1, 1, 2]), 64);
                expect("", run(&m), Want::DType("row_ptr"))
            }),
        ),
        (
            "col_idx u8",
            Box::new(|| {
                let m = SparseMask::bcsr(&t_i32(vec![0, 1, 2], &[1, 1, 3]), &t(&[1, 1, 2], DType::U8), 64);
                expect("", run(&m), Want::DType("col_idx"))
            }),
        ),
        // Compressed causal.
        ("compress_causal(0)", Box::new(|| expect("", run(&SparseMask::compress_causal(0)), Want::Param("compress_factor")))),
        (
            "two compress factors",
            Box::new(|| expect("", run(&SparseMask::compress_causal(2).and(SparseMask::compress_causal(4))), Want::Param("compress_factor"))),
        ),
        (
            "causal(true) with compress_causal",
            Box::new(|| {
                let p = SparseMask::compress_causal(2).prepare(sq, sk).unwrap();
                expect("", attention(&i.q, &i.k, &i.v).sparse_mask(&p).causal(true).forward(), Want::Param("causal"))
            }),
        ),
        // Score masks.
        ("packed: last dim 18", Box::new(|| expect("", run(&SparseMask::packed_bits(&t(&[1, 1, sq, 18], DType::U8))), Want::Shape("packed_bits")))),
        ("packed: last dim 20", Box::new(|| expect("", run(&SparseMask::packed_bits(&t(&[1, 1, sq, 20], DType::U8))), Want::Shape("packed_bits")))),
        ("packed: last dim sk", Box::new(|| expect("", run(&SparseMask::packed_bits(&t(&[1, 1, sq, sk], DType::U8))), Want::Shape("packed_bits")))),
        ("packed: last dim 1", Box::new(|| expect("", run(&SparseMask::packed_bits(&t(&[1, 1, sq, 1], DType::U8))), Want::Shape("packed_bits")))),
        ("packed: rows 69", Box::new(|| expect("", run(&SparseMask::packed_bits(&t(&[1, 1, sq - 1, 19], DType::U8))), Want::Shape("packed_bits")))),
        ("packed: bool", Box::new(|| expect("", run(&SparseMask::packed_bits(&t(&[1, 1, sq, 19], DType::Bool))), Want::DType("packed_bits")))),
        ("dense: u8", Box::new(|| expect("", run(&SparseMask::dense(&t(&[1, 1, sq, sk], DType::U8))), Want::DType("mask")))),
        ("dense: f32", Box::new(|| expect("", run(&SparseMask::dense(&t(&[1, 1, sq, sk], DType::F32))), Want::DType("mask")))),
        ("dense: keys 149", Box::new(|| expect("", run(&SparseMask::dense(&t(&[1, 1, sq, sk - 1], DType::Bool))), Want::Shape("mask")))),
        ("dense: 3-D", Box::new(|| expect("", run(&SparseMask::dense(&t(&[1, sq, sk], DType::Bool))), Want::Shape("mask")))),
        // Block masks.
        ("bitset: u8", Box::new(|| expect("", run(&SparseMask::block_bitset(&t(&[1, 1, 2, 3], DType::U8), 64)), Want::DType("block_bitset")))),
        ("bitset: 2 key blocks", Box::new(|| expect("", run(&SparseMask::block_bitset(&t(&[1, 1, 2, 2], DType::Bool), 64)), Want::Shape("block_bitset")))),
        (
            "bitset: query blocks broadcast",
            Box::new(|| expect("", run(&SparseMask::block_bitset(&t(&[1, 1, 1, 3], DType::Bool), 64)), Want::Shape("block_bitset"))),
        ),
        (
            "bitset: 64-blocks shape with block 128",
            Box::new(|| expect("", run(&SparseMask::block_bitset(&t(&[1, 1, 2, 3], DType::Bool), 128)), Want::Shape("block_bitset"))),
        ),
        ("dense_blocks: i32", Box::new(|| expect("", run(&SparseMask::dense_blocks(&t(&[1, 1, sq, sk], DType::I32), 64)), Want::DType("mask")))),
        ("dense_blocks: keys 151", Box::new(|| expect("", run(&SparseMask::dense_blocks(&t(&[1, 1, sq, sk + 1], DType::Bool), 64)), Want::Shape("mask")))),
        // Planes.
        (
            "parts with 2 and 4 heads",
            Box::new(|| {
                let m = SparseMask::dense(&dense_ok).and(SparseMask::block_bitset(&t(&[1, h, 2, 3], DType::Bool), 64));
                expect("", run(&m), Want::Shape("block_bitset"))
            }),
        ),
        (
            "parts with batch 2 and 3",
            Box::new(|| {
                let m = SparseMask::dense(&dense_ok).and(SparseMask::packed_bits(&t(&[3, 1, sq, 19], DType::U8)));
                expect("", run(&m), Want::Shape("packed_bits"))
            }),
        ),
        ("mask planes with batch 3", Box::new(|| expect("", run(&SparseMask::dense(&t(&[3, 1, sq, sk], DType::Bool))), Want::Shape("sparse_mask")))),
        ("mask planes with 3 heads", Box::new(|| expect("", run(&SparseMask::dense(&t(&[1, 3, sq, sk], DType::Bool))), Want::Shape("sparse_mask")))),
        (
            "bcsr planes with 8 heads",
            Box::new(|| {
                let m = SparseMask::bcsr(&t_i32([0, 0, 0].repeat(8), &[1, 8, 3]), &t_i32(vec![0; 8], &[1, 8, 1]), 64);
                expect("", run(&m), Want::Shape("sparse_mask"))
            }),
        ),
        // Sequence lengths.
        (
            "prepared for other key count",
            Box::new(|| {
                let p = SparseMask::dense(&t(&[1, 1, sq, sk + 1], DType::Bool)).prepare(sq, sk + 1).unwrap();
                expect("", attention(&i.q, &i.k, &i.v).sparse_mask(&p).forward(), Want::Shape("sparse_mask"))
            }),
        ),
        (
            "parametric prepared for other query count",
            Box::new(|| {
                let p = SparseMask::causal_window(8).prepare(sq + 1, sk).unwrap();
                expect("", attention(&i.q, &i.k, &i.v).sparse_mask(&p).forward(), Want::Shape("sparse_mask"))
            }),
        ),
        ("prepare(0, sk)", Box::new(|| expect("", SparseMask::causal().prepare(0, sk), Want::Param("seqlen")))),
        (
            // A dense mask of 2^66 scores: a typed error, not an overflow panic.
            "dense mask prepared for 2^33 x 2^33",
            Box::new(|| expect("", SparseMask::dense(&t(&[1, 1, 1, 1], DType::Bool)).prepare(1 << 33, 1 << 33), Want::Param("seqlen"))),
        ),
        (
            "index lists prepared for 2^33 x 2^33",
            Box::new(|| expect("", SparseMask::indices(&t_i32(vec![0], &[1, 1, 1, 1])).prepare(1 << 33, 1 << 33), Want::Param("seqlen"))),
        ),
        (
            "a call of 2^33 x 2^33 with a mask",
            Box::new(|| {
                // q and k of 2^33 rows as views with a zero row stride (one row of storage).
                let row = Tensor::from_fn(&[8], DType::F32, &CPU, |x| x as f64).unwrap();
                let long = row.as_strided(&[1, 1 << 33, 1, 8], &[0, 0, 0, 1], 0).unwrap();
                let keep = t(&[1, 1, 1, 1], DType::Bool);
                expect("", attention(&long, &long, &long).mask(&keep).forward(), Want::Param("seqlen"))
            }),
        ),
        (
            // Lengths whose sum overflows usize: prepared (a band needs no memory), then refused
            // by a call of other lengths.
            "parametric prepared for usize::MAX queries",
            Box::new(|| {
                let p = SparseMask::window(Some(3), None).prepare(usize::MAX, sk).map_err(|e| format!(": {e}"))?;
                expect("", attention(&i.q, &i.k, &i.v).sparse_mask(&p).forward(), Want::Shape("sparse_mask"))
            }),
        ),
        // Sides and sinks that bind keys past the kernels' 32 bits (lengths of 2^34).
        ("a window side of 2^33", Box::new(|| expect("", SparseMask::window(Some(1 << 33), None).prepare(1 << 34, 1 << 34), Want::Param("window")))),
        ("2^33 sinks", Box::new(|| expect("", SparseMask::causal_window(2).with_sinks(1 << 33).prepare(1 << 34, 1 << 34), Want::Param("sinks")))),
        ("prepare(sq, 0)", Box::new(|| expect("", SparseMask::dense(&dense_ok).prepare(sq, 0), Want::Param("seqlen")))),
        // The call.
        (
            "mask and sparse_mask with data",
            Box::new(|| {
                let p = SparseMask::causal().and(SparseMask::dense(&dense_ok)).prepare(sq, sk).unwrap();
                expect("", attention(&i.q, &i.k, &i.v).mask(&dense_ok).sparse_mask(&p).forward(), Want::Param("mask"))
            }),
        ),
        (
            "sparse_mask and mask",
            Box::new(|| {
                let p = SparseMask::dense(&dense_ok).prepare(sq, sk).unwrap();
                expect("", attention(&i.q, &i.k, &i.v).sparse_mask(&p).mask(&dense_ok).forward(), Want::Param("mask"))
            }),
        ),
    ];
    let mut checks: Vec<Check> = named.into_iter().map(|(name, f)| (name.to_string(), f)).collect();
    // Block sizes other than 64 and 128.
    let (dense_ok, bitset_ok) = (&dense_ok, &bitset_ok);
    for block in [0, 1, 32, 96, 256] {
        let name = |what: &str| format!("{what} with block {block}");
        checks.push((name("bitset"), Box::new(move || expect("", run(&SparseMask::block_bitset(bitset_ok, block)), Want::Param("block")))));
        checks.push((name("dense_blocks"), Box::new(move || expect("", run(&SparseMask::dense_blocks(dense_ok, block)), Want::Param("block")))));
        checks.push((
            name("bcsr"),
            Box::new(move || {
                let m = SparseMask::bcsr(&t_i32(vec![0, 0, 0], &[1, 1, 3]), &t_i32(vec![0], &[1, 1, 1]), block);
                expect("", run(&m), Want::Param("block"))
            }),
        ));
    }
    let n = checks.len();
    let failures: Vec<String> = checks
        .into_iter()
        .filter_map(|(name, f)| match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(())) => None,
            Ok(Err(m)) => Some(format!("{name}{m}")),
            Err(p) => Some(format!(
                "{name}: PANICKED: {}",
                p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
            )),
        })
        .collect();
    assert!(failures.is_empty(), "{} of {n} checks failed:\n{}", failures.len(), failures.join("\n"));
}
