//! The tensor-core forward kernel against the f64 CPU reference: property tests over dtypes,
//! head dims, causal, mask/bias broadcasts, GQA/MQA, odd lengths, strided inputs and masks with
//! empty tiles and rows (strided inputs and all-false masks through the materialising path too).
//! Skips, saying why, where there is no CUDA device.
use dmattn::{DType, Device, Error, Tensor, attention};
use dmattn_tests::*;

#[test]
fn forward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gpu_property(2000, 300, |(case, seed)| check_gpu_forward(&case, ForwardPath::Fused, &gpu, &case.inputs(&mut seeded_rng(seed))));
}

/// Lean calls (no mask, bias or softcap) at d64 and d128: on Hopper the warp-specialised
/// forward, whose K/V ring of two slots wraps every two key tiles (up to 5 of 128 keys here).
#[test]
fn lean_forward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gpu_property(2000, 600, |(case, seed)| {
        let head_dim = if seed % 2 == 0 { 64 } else { 128 };
        let case = Case { mask: None, bias: None, softcap: 0.0, head_dim, ..case };
        check_gpu_forward(&case, ForwardPath::Fused, &gpu, &case.inputs(&mut seeded_rng(seed)))
    });
}

/// Every modifier (mask, bias, softcap, causal) at d64 and d128, up to 600 keys: on Hopper the
/// warp-specialised modifier kernel, whose producer walks the block map and passes each tile to
/// the consumers through a two-slot ring, and its mask bits through one slot (up to three
/// 128-key tiles a CTA here, the keys of small grids being split; see `shared_bias_heads_first`
/// for more). At d64 the plan takes it only over many key tiles: half the d64 cases force it,
/// half the two-CTA kernel.
#[test]
fn modifier_forward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gpu_property(2000, 600, |(case, seed)| {
        let head_dim = if seed % 2 == 0 { 64 } else { 128 };
        dmattn::force_forward_warp_specialised(Some(seed % 4 == 0));
        let case = Case { head_dim, ..case };
        check_gpu_forward(&case, ForwardPath::Fused, &gpu, &case.inputs(&mut seeded_rng(seed)))
    });
    dmattn::force_forward_warp_specialised(None);
}

/// A mask alone (no bias or softcap) at d64 and d128, up to 600 keys: on Hopper the mask-only kernel
/// (128-key tiles, no bias ring) where the keys are not split, whatever the mask's broadcast and
/// pattern (a case drawn without a mask gets a full-shape one). Forced: at d64 the plan takes
/// it only over many key tiles.
#[test]
fn mask_only_forward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    dmattn::force_forward_warp_specialised(Some(true));
    gpu_property(2000, 600, |(case, seed)| {
        let mask = case.mask.or(Some([case.batch, case.kv_heads, case.seqlen_q, case.seqlen_k]));
        // d64 and d128: the head dims with a mask-only kernel on Hopper.
        let head_dim = if seed % 2 == 0 { 64 } else { 128 };
        let case = Case { mask, bias: None, softcap: 0.0, head_dim, ..case };
        check_gpu_forward(&case, ForwardPath::Fused, &gpu, &case.inputs(&mut seeded_rng(seed)))
    });
    dmattn::force_forward_warp_specialised(None);
}

/// A small case of each forward kernel the call can pick (every head dim and element type; the
/// lean variant, the modifier variant with a mask, a bias, causal and a softcap, its gather
/// variant, and split-KV decoding), for the sanitizer run (`run.sh sanitize`) as much as for itself: on Hopper, d64
/// and d128 run the `wgmma` forward.
#[test]
fn each_forward_kernel() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("each_forward_kernel");
    // (At d64 the plan takes the warp-specialised kernels only over many key tiles; the
    // modifier case runs there on both kernels.)
    dmattn::force_forward_warp_specialised(Some(true));
    for head_dim in [32, 64, 96, 128, 192, 256] {
        for dtype in [DType::BF16, DType::F16] {
            let plain = Case { dtype, causal: true, ..Case::new(1, 150, 170, 4, 2, head_dim) };
            let mods = Case { mask: Some([1, 2, 150, 170]), bias: Some([1, 4, 150, 170]), softcap: 20.0, ..plain.clone() };
            // A mask alone (d64 and d128 on Hopper: the mask-only kernel).
            let masked = Case { mask: Some([1, 2, 150, 170]), ..plain.clone() };
            let gathered = Case { mask: Some([1, 2, 1, 170]), mask_pattern: MaskPattern::Random(0.3), bias: Some([1, 2, 1, 170]), ..plain.clone() };
            let decode = Case { dtype, bias: Some([1, 2, 1, 3000]), ..Case::new(1, 1, 3000, 4, 2, head_dim) };
            for case in [plain, mods.clone(), masked, gathered, decode] {
                check_gpu_forward(&case, ForwardPath::Fused, &gpu, &case.inputs(&mut rng)).unwrap_or_else(|e| panic!("{case:?}: {e}"));
            }
            if head_dim == 64 {
                dmattn::force_forward_warp_specialised(Some(false));
                check_gpu_forward(&mods, ForwardPath::Fused, &gpu, &mods.inputs(&mut rng)).unwrap_or_else(|e| panic!("{mods:?}: {e}"));
                dmattn::force_forward_warp_specialised(Some(true));
            }
        }
    }
    dmattn::force_forward_warp_specialised(None);
}

/// A per-query bias the heads share (`[1, 1 | hk, sq, sk]`) over more CTAs than an SM count: on
/// the warp-specialised modifier kernel (d64 and d128) the plan runs such grids heads fastest
/// (`FwdParams` flag `HEADS_FIRST`), each CTA finding its query tile and head from its linear
/// index; with a mask, causal or a softcap beside it, on
/// every forward kernel that takes a bias. At d64 and d128 a longer case walks 4-5 key tiles a
/// CTA (two key splits), so the one mask slot beside the bias ring turns over with each parity
/// twice.
#[test]
fn shared_bias_heads_first() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("shared_bias_heads_first");
    // At d64 the warp-specialised modifier kernel (heads first), which the plan takes only over
    // many key tiles.
    dmattn::force_forward_warp_specialised(Some(true));
    for head_dim in [64, 128, 96] {
        for (i, dtype) in [DType::BF16, DType::F16].into_iter().enumerate() {
            // 5 query tiles x 32 heads: 160 CTAs.
            let base = Case { dtype, ..Case::new(1, 600, 300 + 77 * i, 32, 8, head_dim) };
            let (sq, sk) = (base.seqlen_q, base.seqlen_k);
            let long = Case { seqlen_k: 1100 + 77 * i, ..base.clone() };
            let mut cases = vec![
                Case { bias: Some([1, 1, sq, sk]), mask: Some([1, 1, sq, sk]), ..base.clone() },
                Case { bias: Some([1, 8, sq, sk]), causal: true, ..base.clone() },
                Case { bias: Some([1, 1, sq, sk]), mask: Some([1, 8, sq, sk]), mask_pattern: MaskPattern::Blocks(0.5), softcap: 15.0, ..base.clone() },
            ];
            if head_dim != 96 {
                let sk = long.seqlen_k;
                cases.push(Case { bias: Some([1, 1, sq, sk]), mask: Some([1, 1, sq, sk]), mask_pattern: MaskPattern::Random(0.6), ..long });
            }
            for case in cases {
                check_gpu_forward(&case, ForwardPath::Fused, &gpu, &case.inputs(&mut rng)).unwrap_or_else(|e| panic!("{case:?}: {e}"));
            }
        }
    }
    dmattn::force_forward_warp_specialised(None);
}

/// q, k, v as views into one packed `[b, s, 3, h, d]` buffer (a fused QKV projection's output):
/// non-contiguous sequence and head strides, read in place by both forward paths.
#[test]
fn strided_qkv_views() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("strided_qkv_views");
    let paths = [ForwardPath::Fused, ForwardPath::Materialized];
    for (&(dtype, d, s, h), path) in [(DType::BF16, 64, 150, 3), (DType::F16, 128, 77, 2), (DType::BF16, 96, 200, 1)].iter().flat_map(|c| paths.map(|p| (c, p))) {
        let case = Case { dtype, causal: true, ..Case::new(2, s, s, h, h, d) };
        // [b, s, 3h, d] holds q, k, v side by side in each row.
        let packed = Case { dtype, ..Case::new(2, s, s, 3 * h, 3 * h, d) }.inputs(&mut rng).q;
        let strides = [s * 3 * h * d, 3 * h * d, d, 1];
        let view = |t: &Tensor, which: usize| t.as_strided(&[2, s, h, d], &strides, which * h * d).unwrap();
        let on_gpu = packed.to_device(&gpu).unwrap();
        let cpu_inputs = Inputs { q: view(&packed, 0), k: view(&packed, 1), v: view(&packed, 2), mask: None, bias: None };
        let gpu_inputs = Inputs { q: view(&on_gpu, 0), k: view(&on_gpu, 1), v: view(&on_gpu, 2), mask: None, bias: None };
        let want = case.forward(&cpu_inputs).unwrap().out.to_f64_vec().unwrap();
        let got = case.forward_by(&gpu_inputs, path).unwrap().out.to_f64_vec().unwrap();
        let err = rel_err(&got, &want);
        assert!(err <= gpu_tolerance(dtype), "strided qkv ({path:?}): rel err {err:.3e} for {case:?}");
    }
}

/// K and V broadcast (stride 0) over the batch or over the kv heads, as `broadcast_as` and
/// `as_strided` views give them: the lean Hopper kernel's tensor maps cannot step a broadcast
/// dimension, so such calls take the modifier kernel; every path reads them in place.
#[test]
fn broadcast_kv_views() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("broadcast_kv_views");
    for &(dtype, d, s, causal) in &[(DType::BF16, 64, 300, true), (DType::F16, 128, 200, false), (DType::BF16, 128, 129, true)] {
        let (b, h, hk) = (2, 4, 2);
        let case = Case { dtype, causal, ..Case::new(b, s, s, h, hk, d) };
        let inputs = case.inputs(&mut rng);
        // One batch entry's (or one kv head's) K and V, seen by every entry (head).
        let over_batch = |t: &Tensor| t.as_strided(&[b, s, hk, d], &[0, hk * d, d, 1], 0).unwrap();
        let over_heads = |t: &Tensor| t.as_strided(&[b, s, hk, d], &[s * hk * d, hk * d, 0, 1], 0).unwrap();
        for (name, view) in [("batch", &over_batch as &dyn Fn(&Tensor) -> Tensor), ("kv heads", &over_heads)] {
            let (k, v) = (inputs.k.to_device(&gpu).unwrap(), inputs.v.to_device(&gpu).unwrap());
            let cpu_inputs = Inputs { q: inputs.q.clone(), k: view(&inputs.k), v: view(&inputs.v), mask: None, bias: None };
            let gpu_inputs = Inputs { q: inputs.q.to_device(&gpu).unwrap(), k: view(&k), v: view(&v), mask: None, bias: None };
            let want = case.forward(&cpu_inputs).unwrap().out.to_f64_vec().unwrap();
            let got = case.forward_by(&gpu_inputs, ForwardPath::Fused).unwrap().out.to_f64_vec().unwrap();
            let err = rel_err(&got, &want);
            assert!(got.iter().all(|x| x.is_finite()) && err <= gpu_tolerance(dtype), "k, v broadcast over {name}: rel err {err:.3e} for {case:?}");
        }
    }
}

/// Long key sequences with block-sparse masks: the tile cursor classifies 32 tiles per step, so
/// these cross several windows, with long empty runs.
#[test]
fn long_sparse_keys() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("long_sparse_keys");
    for &(sk, p, causal) in &[(5000, 0.1, false), (4500, 0.5, true), (9000, 0.02, false)] {
        let case = Case {
            mask: Some([1, 2, 130, sk]),
            mask_pattern: MaskPattern::Blocks(p),
            bias: Some([1, 1, 130, sk]),
            causal,
            dtype: DType::BF16,
            ..Case::new(1, 130, sk, 2, 1, 64)
        };
        let inputs = case.inputs(&mut rng);
        check_gpu_forward(&case, ForwardPath::Fused, &gpu, &inputs).unwrap();
    }
}

/// Grids of more CTAs than today's GPUs have SMs, under masks whose query tiles visit different
/// numbers of key tiles: the forward runs its CTAs heaviest first, each taking its query tile
/// from the work order, which must still cover every tile exactly once (poisoned outputs show a
/// tile left out).
#[test]
fn work_ordered_grids() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("work_ordered_grids");
    // (dtype, d, sq, sk, heads, kv heads, mask heads, causal, bias): 240-320 CTAs each.
    let cases = [
        (DType::BF16, 32, 1000, 700, 20, 4, 1, false, false),
        (DType::F16, 192, 700, 300, 12, 12, 12, true, true),
        (DType::BF16, 128, 640, 400, 24, 1, 1, false, true),
    ];
    for &(dtype, d, sq, sk, h, hk, mh, causal, bias) in &cases {
        let case = Case {
            mask: Some([2, mh, sq, sk]),
            mask_pattern: MaskPattern::Blocks(0.5),
            bias: bias.then_some([1, h, sq, sk]),
            causal,
            dtype,
            ..Case::new(2, sq, sk, h, hk, d)
        };
        check_gpu_forward(&case, ForwardPath::Fused, &gpu, &case.inputs(&mut rng)).unwrap();
    }
}

/// Decoding shapes (a few query rows, long keys, few heads): the grid is too small for the GPU,
/// so the keys are split across CTAs and the partial results combined. Gradients from such a
/// forward (its O and LSE) are checked too.
#[test]
fn split_kv_decode() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("split_kv_decode");
    let cases = [
        (DType::BF16, 1, 20000, 64, false, Some(MaskPattern::Random(0.05))),
        (DType::F16, 1, 4097, 128, false, None),
        (DType::BF16, 2, 20000, 64, false, None),
        (DType::BF16, 5, 9000, 128, true, Some(MaskPattern::Blocks(0.3))),
        (DType::F16, 3, 6000, 256, true, Some(MaskPattern::Random(0.5))),
        (DType::BF16, 1, 3000, 96, false, Some(MaskPattern::Random(0.0))),
    ];
    for (i, &(dtype, sq, sk, d, causal, pattern)) in cases.iter().enumerate() {
        let case = Case {
            mask: pattern.map(|_| [1, 2, sq, sk]),
            mask_pattern: pattern.unwrap_or(MaskPattern::Random(1.0)),
            bias: Some([2, 1, 1, sk]),
            causal,
            dtype,
            ..Case::new(2, sq, sk, 4, 2, d)
        };
        let inputs = case.inputs(&mut rng);
        check_gpu_forward(&case, ForwardPath::Fused, &gpu, &inputs).unwrap();
        check_gpu_backward(&case, ForwardPath::Fused, &gpu, i as u64, false).unwrap();
    }
}

/// A mask that hides everything: O = 0 and LSE = -inf everywhere, nothing NaN.
#[test]
fn all_false_mask() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("all_false_mask");
    let case = Case { mask: Some([2, 1, 1, 300]), mask_pattern: MaskPattern::Random(0.0), dtype: DType::F16, ..Case::new(2, 200, 300, 4, 2, 128) };
    let inputs = case.inputs(&mut rng).to(&gpu);
    dmattn::set_output_poisoning(true);
    for path in [ForwardPath::Fused, ForwardPath::Materialized] {
        let fwd = case.forward_by(&inputs, path).unwrap();
        assert!(fwd.out.to_f64_vec().unwrap().iter().all(|&x| x == 0.0), "{path:?}: O is not all 0");
        assert!(fwd.lse.to_f64_vec().unwrap().iter().all(|&x| x == f64::NEG_INFINITY), "{path:?}: LSE is not all -inf");
    }
}

/// What the kernels cannot take is refused with a typed error naming the argument.
#[test]
fn gpu_rejects_what_kernels_cannot_take() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("gpu_rejects");
    let f32_case = Case::new(1, 8, 8, 1, 1, 64);
    let i = f32_case.inputs(&mut rng).to(&gpu);
    assert!(matches!(attention(&i.q, &i.k, &i.v).forward(), Err(Error::DType { arg: "q", .. })));

    let odd_dim = Case { dtype: DType::BF16, ..Case::new(1, 8, 8, 1, 1, 80) };
    let i = odd_dim.inputs(&mut rng).to(&gpu);
    assert!(matches!(attention(&i.q, &i.k, &i.v).forward(), Err(Error::Unsupported { .. })));

    let case = Case { dtype: DType::BF16, ..Case::new(1, 8, 8, 1, 1, 64) };
    let i = case.inputs(&mut rng).to(&gpu);
    // Sequence stride 68 elements: not 16-byte aligned rows.
    let big = Tensor::from_fn(&[1, 8, 1, 68], DType::BF16, &Device::Cpu, |x| x as f64 * 0.01).unwrap().to_device(&gpu).unwrap();
    let q = big.as_strided(&[1, 8, 1, 64], &[8 * 68, 68, 68, 1], 0).unwrap();
    assert!(matches!(attention(&q, &i.k, &i.v).forward(), Err(Error::Layout { arg: "q", .. })));
    let bias_f16 = Tensor::from_fn(&[1, 1, 8, 8], DType::F16, &Device::Cpu, |x| x as f64).unwrap().to_device(&gpu).unwrap();
    assert!(matches!(attention(&i.q, &i.k, &i.v).bias(&bias_f16).forward(), Err(Error::DType { arg: "bias", .. })));
}
