//! `select_keys` on the GPU against the CPU backend (itself checked against the selection's
//! definition in `cpu_select`), bit for bit, with poisoned outputs: random biases (bf16, f16,
//! f32; ties, NaN, ±0, ±inf; broadcasts; strided views), masks, top-k and relu, block smoothing,
//! `k` beyond the row; rows cached in shared memory and rows too long for it; CTAs selecting
//! several rows; the wide selection (many CTAs a row), forced on small rows and chosen for few
//! long ones; every output form.
//! `DMATTN_GPU_CASES` sets the case counts. Skips, saying why, where there is no CUDA device.
use dmattn::{DType, Device, Error, Tensor, select_keys};
use dmattn_tests::select::SelectCase;
use dmattn_tests::{fresh_rng, gpu};

fn cases(default: usize) -> usize {
    std::env::var("DMATTN_GPU_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Every output of `case` on the GPU equals the CPU's.
fn check(case: &SelectCase, gpu: &Device, what: &str) {
    dmattn::set_output_poisoning(true);
    let (bias, mask) = case.tensors(&Device::Cpu);
    let (gbias, gmask) = case.tensors(gpu);
    let (cpu_sel, gpu_sel) = (case.select(&bias, mask.as_ref()), case.select(&gbias, gmask.as_ref()));
    let outputs: [(&str, fn(&dmattn::SelectKeys) -> dmattn::Result<Tensor>); 3] =
        [("mask", |s| s.mask()), ("packed_mask", |s| s.packed_mask()), ("indices", |s| s.indices())];
    for (name, out) in outputs {
        match (out(&cpu_sel), out(&gpu_sel)) {
            (Ok(want), Ok(got)) => {
                assert_eq!(got.shape(), want.shape(), "{what} {name}: {case:?}");
                let (g, w) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
                if let Some(i) = (0..w.len()).find(|&i| g[i] != w[i]) {
                    let row = i / want.shape()[3];
                    panic!("{what} {name}: element {i} (row {row}) is {} on the GPU, {} on the CPU; {case:?}", g[i], w[i]);
                }
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{what} {name}"),
            (a, b) => panic!("{what} {name}: CPU {:?} but GPU {:?}; {case:?}", a.map(drop), b.map(drop)),
        }
    }
}

#[test]
fn gpu_selection_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("gpu_selection_matches_cpu");
    for n in 0..cases(2000) {
        let case = SelectCase::random(&mut rng, 3000);
        check(&case, &gpu, &format!("case {n}"));
    }
}

/// Rows whose radix keys do not fit the shared-memory cache (f32 past ~27K keys, 16-bit past
/// ~50K) are read again from the bias each pass.
#[test]
fn long_rows_match_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("long_rows_match_cpu");
    for n in 0..cases(2000).div_ceil(100) {
        let mut case = SelectCase::random(&mut rng, 8);
        let dtype = [DType::F32, DType::BF16][n % 2];
        let sk = if dtype == DType::F32 { 30000 + 7 * n } else { 60000 + 13 * n };
        let m = case.bias_shape;
        let levels = n % 3 == 0;
        let mut r = fresh_rng("long_rows values");
        use rand::Rng;
        case.dtype = dtype;
        case.bias_shape = [m[0], m[1], 1, sk];
        case.bias = (0..m[0] * m[1] * sk).map(|_| if levels { r.random_range(0..50) as f64 } else { r.random::<f64>() - 0.5 }).collect();
        case.mask = None;
        case.k = case.k.map(|_| [1, 1000, sk / 3, sk][n % 4]);
        check(&case, &gpu, &format!("long case {n}"));
    }
}

/// More rows than the grid (16 CTAs an SM), so that each CTA selects several rows and its
/// load step lists around the previous row's threshold bin: rows of one scale (the guess
/// holds), of scales varying by row (it misses), of a few levels (ties at the threshold),
/// within masks; top-k only (relu keeps no guess).
#[test]
fn many_rows_per_cta_match_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("many_rows_per_cta_match_cpu");
    use rand::Rng;
    for n in 0..cases(2000).div_ceil(200) {
        let mut case = SelectCase::random(&mut rng, 8);
        let (rows, sk) = (4096, rng.random_range(64..=1500));
        case.bias_shape = [1, 2, rows, sk];
        case.strided = false;
        case.block = None;
        case.k = Some([1, 16, sk / 10 + 1, sk / 2, sk - 1][n % 5].max(1));
        let kind = n % 3;
        case.bias = (0..2 * rows * sk)
            .map(|i| match kind {
                0 => rng.random::<f64>() - 0.5,
                1 => (rng.random::<f64>() - 0.5) * (1 + (i / sk) % 7) as f64 * 3.0,
                _ => rng.random_range(0..20) as f64,
            })
            .collect();
        case.mask = (n % 2 == 1).then(|| ([1, 2, rows, sk], (0..2 * rows * sk).map(|_| rng.random_bool(0.8)).collect()));
        check(&case, &gpu, &format!("many-rows case {n} (kind {kind}, sk {sk}, k {:?})", case.k));
    }
}

/// The wide selection (many CTAs a row) forced on random cases, in chunks of 1 to 256 words, so
/// that ties at the threshold, masks and row ends fall across chunk boundaries, as one
/// cooperative launch (where the grid fits) and as a launch a step; block smoothing (which the
/// wide selection does not take) left out.
#[test]
fn wide_selection_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("wide_selection_matches_cpu");
    use rand::Rng;
    for n in 0..cases(2000) {
        let mut case = SelectCase::random(&mut rng, 3000);
        case.block = None;
        let words = [1, 2, 3, 5, 8, 31, 64, 256][rng.random_range(0..8)];
        // One cooperative launch where the grid fits the GPU at once, or a launch a step.
        let launches = n % 2 == 1;
        dmattn::force_wide_selection(Some(words));
        dmattn::force_select_launches(launches);
        check(&case, &gpu, &format!("wide case {n} ({words} words a chunk, a launch a step: {launches})"));
        dmattn::force_wide_selection(None);
        dmattn::force_select_launches(false);
    }
}

/// Few long rows, which run wide by the plan's own choice: past one CTA's shared memory
/// (about 600K keys on an H100) too, with values of a few levels (ties across chunks).
#[test]
fn few_long_rows_match_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("few_long_rows_match_cpu");
    use rand::Rng;
    for n in 0..cases(2000).div_ceil(200) {
        let mut case = SelectCase::random(&mut rng, 8);
        let sk = [16384 + 17 * n, 100_000 + 3 * n, 1 << 19, 700_000 + n, 1 << 20][n % 5];
        case.dtype = [DType::BF16, DType::F32, DType::F16][n % 3];
        let rows = [1, 2, 3][n % 3];
        case.bias_shape = [1, rows, 1, sk];
        case.strided = n % 4 == 3;
        case.block = None;
        let levels = n % 2 == 1;
        case.bias = (0..rows * sk).map(|_| if levels { rng.random_range(0..40) as f64 } else { rng.random::<f64>() - 0.5 }).collect();
        case.mask = (n % 3 == 2).then(|| ([1, 1, 1, sk], (0..sk).map(|_| rng.random_bool(0.7)).collect()));
        case.k = Some([1, 1024, sk / 3, sk][n % 4]);
        dmattn::force_select_launches(n % 7 == 6);
        check(&case, &gpu, &format!("long case {n} (sk {sk}, k {:?})", case.k));
        dmattn::force_select_launches(false);
    }
}

/// Typed errors of the GPU call: a mask on another device, a bias dtype the kernels do not take,
/// sizes past the kernels' 32 bits.
#[test]
fn gpu_selection_errors_are_typed() {
    let Some(gpu) = gpu() else { return };
    let bias = Tensor::from_fn(&[1, 1, 1, 8], DType::F32, &gpu, |i| i as f64).unwrap();
    assert!(select_keys(&bias).top_k(2).mask().is_ok());
    let mask = Tensor::from_fn(&[1, 1, 1, 8], DType::Bool, &Device::Cpu, |_| 1.0).unwrap();
    match select_keys(&bias).top_k(2).within(&mask).mask() {
        Err(Error::Device { arg: "mask", .. }) => {}
        other => panic!("{other:?}"),
    }
    // Past 32 bits: a k past the row's keys keeps them all (as on the CPU); rows or keys of a
    // zero-stride view past 2^32 are a typed error before any launch.
    let all = select_keys(&bias).top_k((1 << 32) + 1).mask().unwrap();
    assert!(all.to_f64_vec().unwrap().iter().all(|&x| x != 0.0));
    let lists = select_keys(&bias).top_k((1 << 32) + 3).block_size(2);
    assert!(matches!(lists.indices(), Err(Error::Param { arg: "k", .. })));
    let one = Tensor::from_fn(&[1], DType::F32, &gpu, |_| 1.0).unwrap();
    for shape in [[1, 1, 1, (1usize << 32) + 8], [1, 1 << 32, 1, 8]] {
        let view = one.as_strided(&shape, &[0, 0, 0, 0], 0).unwrap();
        match select_keys(&view).top_k(2).mask() {
            Err(Error::Shape { arg: "bias", .. }) => {}
            other => panic!("{shape:?}: {other:?}"),
        }
    }
    if let Ok(wide) = Tensor::from_fn(&[1, 1, 1, 8], DType::F64, &gpu, |i| i as f64) {
        match select_keys(&wide).top_k(2).mask() {
            Err(Error::DType { arg: "bias", .. }) => {}
            other => panic!("{other:?}"),
        }
    }
}
