//! The decoding kernel (calls whose kv group's heads times queries fit a 64-row tile) against the
//! f64 CPU reference: fixed-length calls with key-side biases, GQA groups of 1 to 8, causal,
//! softcap, head dims 32-256, keys long enough to split, and key-side masks from none to every
//! key kept (read as bytes by the decoding kernel to d128, compacted into key lists for gather
//! attention past it), forward and backward; packed batches of 0-16 queries per sequence with key-side masks at any density and
//! biases, windows, and paged K/V (the only paged calls that take a mask). Outputs are poisoned: an unwritten element fails.
//! `DMATTN_GPU_CASES` sets the property tests' case counts. Skips, saying why, where there is no
//! CUDA device.
use dmattn::{DType, Tensor};
use dmattn_tests::sparse::BandCtor;
use dmattn_tests::varlen::{Packed, VarlenCase, VarlenMask, check_varlen};
use dmattn_tests::*;
use proptest::prelude::*;

/// Key lengths: short, a tile or scan-round edge, or several scan rounds (a call with few
/// keys over all its sequences and kv heads splits them too: the plan aims at eight CTAs an SM).
/// Longer keys are [`decode_long_keys`]'.
fn keys() -> impl Strategy<Value = usize> {
    prop_oneof![
        5 => 1usize..=300,
        1 => prop::sample::select(vec![1, 63, 64, 65, 1023, 1024, 1025]),
        3 => 300usize..=5000,
    ]
}

/// Fixed-length decoding calls: batch 1-3, kv heads 1-3, groups of 1, 2, 4 or 8 query heads,
/// 1 to 64 / group queries, a key-side mask `[{1|b}, {1|hk}, 1, sk]` (random at densities from none
/// to all, or in 64-key blocks) and a key-side bias `[{1|b}, {1|hk}, 1, {1|sk}]`, each or not.
fn decode_cases() -> impl Strategy<Value = (Case, u64)> {
    (
        (prop::sample::select(vec![DType::BF16, DType::F16]), prop::sample::select(vec![32usize, 64, 96, 128, 192, 256])),
        (1usize..=3, 1usize..=3, prop::sample::select(vec![1usize, 2, 4, 8])),
        (any::<u32>(), keys()),
        (any::<bool>(), prop_oneof![3 => Just(0.0), 1 => Just(20.0)], prop::option::weighted(0.2, 0.05f64..0.5)),
        (any::<bool>(), any::<bool>(), any::<u8>(), any::<u64>()),
    )
        .prop_map(|((dtype, d), (b, hk, group), (q, sk), (causal, softcap, scale), (has_mask, has_bias, pick, seed))| {
            let h = hk * group;
            // Mostly one or a few queries, up to the tile.
            let sq = if q % 3 == 0 { 1 } else { 1 + q as usize % (64 / group) };
            let side = |bit: u8, n: usize| if pick >> bit & 1 != 0 { n } else { 1 };
            let mask = has_mask.then(|| [side(0, b), side(1, hk), 1, sk]);
            let bias = has_bias.then(|| [side(2, b), side(3, hk), 1, if pick >> 4 & 3 == 0 { 1 } else { sk }]);
            let pattern = match pick >> 5 {
                0 => MaskPattern::Random(0.0),
                1 => MaskPattern::Random(0.01),
                2 | 3 => MaskPattern::Random(0.1),
                4 => MaskPattern::Random(0.5),
                5 => MaskPattern::Random(1.0),
                _ => MaskPattern::Blocks(0.3),
            };
            (Case { mask, mask_pattern: pattern, bias, causal, softcap, scale, dtype, ..Case::new(b, sq, sk, h, hk, d) }, seed)
        })
}

#[test]
fn decode_matches_reference() {
    let Some(gpu) = gpu() else { return };
    if let Err(e) = gpu_runner(2000).run(&decode_cases(), |(case, seed)| check_gpu_forward(&case, ForwardPath::Fused, &gpu, &case.inputs(&mut seeded_rng(seed)))) {
        panic!("{e}");
    }
}

/// The backward of a decoding forward: a key-side mask the decoding kernel read as bytes is
/// prepared by the backward (compacted into key lists, or the dense-tile form past half the
/// keys) from the caller's tensor, which the forward left where it was.
#[test]
fn decode_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    if let Err(e) = gpu_runner(300).run(&decode_cases(), |(case, seed)| check_gpu_backward(&case, ForwardPath::Fused, &gpu, seed, seed % 4 == 0)) {
        panic!("{e}");
    }
}

/// Packed decoding batches: 1-4 sequences of 0 to 64 / group queries over 0-5000 keys,
/// key-side masks and biases (1 or kv_heads heads), causal or a window, softcap,
/// contiguous or paged K/V (pages of 1-256 keys in random order, rows no key owns NaN).
fn packed_decode_cases() -> impl Strategy<Value = (VarlenCase, u64, bool)> {
    let band = prop_oneof![
        3 => Just(None),
        1 => (0usize..3000).prop_map(|l| Some(BandCtor::CausalWindow(l))),
        1 => (prop::option::of(0usize..2000), prop::option::of(0usize..50)).prop_map(|(l, r)| Some(BandCtor::Window(l, r))),
    ];
    (
        (prop::sample::select(vec![DType::BF16, DType::F16]), prop::sample::select(vec![32usize, 64, 96, 128, 192, 256])),
        (1usize..=2, prop::sample::select(vec![1usize, 2, 4, 8])),
        (prop::collection::vec((any::<u32>(), keys()), 1..=4), any::<bool>(), band, prop_oneof![3 => Just(0.0), 1 => Just(20.0)]),
        (prop::option::of(0usize..2), prop::option::of(0usize..2), prop::sample::select(vec![0.0, 0.01, 0.1, 0.5, 1.0])),
        (prop::option::of(prop::sample::select(vec![1usize, 4, 16, 64, 128, 256])), any::<u64>(), any::<bool>()),
    )
        .prop_map(|((dtype, head_dim), (kv_heads, group), (lens, causal, band, softcap), (mask, bias, density), (page_size, seed, ordered))| {
            let heads = |i: usize| [1, kv_heads][i];
            let max_q = 64 / group;
            let lens = lens.into_iter().map(|(q, k)| (if q % 4 == 0 { 0 } else { q as usize % (max_q + 1) }, k)).collect();
            let case = VarlenCase {
                lens,
                heads: kv_heads * group,
                kv_heads,
                head_dim,
                causal,
                band,
                softcap,
                bias_heads: bias.map(heads),
                bias_per_query: false,
                mask: mask.map(|i| VarlenMask { heads: heads(i), per_query: false, density }),
                dtype,
                page_size,
                sparse: None,
            };
            (case, seed, ordered)
        })
}

/// Half the batches of two or more sequences run their CTAs in a work order, heaviest first
/// (which the plan picks only past a wave of CTAs, more than these batches have).
#[test]
fn packed_decode_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let result = gpu_runner(2000).run(&packed_decode_cases(), |(c, seed, ordered)| {
        dmattn::force_decode_order(Some(ordered));
        check_varlen(&c, &gpu, seed, false, false, gpu_tolerance(c.dtype))
    });
    dmattn::force_decode_order(None);
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Long keys, split up to the combine's 128 ways: one query over 200K keys with a 1 % mask (most
/// splits see a key or none), a GQA batch over 50K keys, and a packed batch of long and short
/// sequences, paged.
#[test]
fn decode_long_keys() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("decode_long_keys");
    let cases = [
        Case { mask: Some([1, 1, 1, 200_000]), mask_pattern: MaskPattern::Random(0.01), bias: Some([1, 1, 1, 200_000]), dtype: DType::BF16, ..Case::new(1, 1, 200_000, 2, 1, 64) },
        Case { mask: Some([2, 2, 1, 50_000]), mask_pattern: MaskPattern::Random(0.1), causal: true, dtype: DType::F16, ..Case::new(2, 4, 50_000, 8, 2, 128) },
        Case { bias: Some([1, 2, 1, 30_000]), causal: true, softcap: 20.0, dtype: DType::BF16, ..Case::new(1, 16, 30_000, 4, 2, 256) },
    ];
    for case in &cases {
        check_gpu_forward(case, ForwardPath::Fused, &gpu, &case.inputs(&mut rng)).unwrap_or_else(|e| panic!("{case:?}: {e}"));
    }
    let c = VarlenCase {
        lens: vec![(8, 60_000), (1, 100), (0, 5000), (3, 20_000), (5, 1)],
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        causal: true,
        band: None,
        softcap: 0.0,
        bias_heads: Some(8),
        bias_per_query: false,
        mask: Some(VarlenMask { heads: 8, per_query: false, density: 0.1 }),
        dtype: DType::BF16,
        page_size: Some(256),
        sparse: None,
    };
    check_varlen(&c, &gpu, 77, false, false, gpu_tolerance(c.dtype)).unwrap();
}

/// A small case of each decoding kernel (every head dim and element type, contiguous and paged,
/// with a mask, a bias and a split; sequences of 4, 12, 24 and 64 rows, so that the warps split
/// key tiles four, two and one way), for the sanitizer run as much as for itself.
#[test]
fn each_decode_kernel() {
    let Some(gpu) = gpu() else { return };
    for (i, head_dim) in [32, 64, 96, 128, 192, 256].into_iter().enumerate() {
        for dtype in [DType::BF16, DType::F16] {
            for page_size in [None, Some(64)] {
                let c = VarlenCase {
                    lens: vec![(3, 3000), (0, 100), (1, 70), (2, 0), (6, 500), (16, 200)],
                    heads: 8,
                    kv_heads: 2,
                    head_dim,
                    causal: true,
                    band: None,
                    softcap: if i % 2 == 0 { 0.0 } else { 20.0 },
                    bias_heads: Some(2),
                    bias_per_query: false,
                    mask: Some(VarlenMask { heads: 2, per_query: false, density: 0.3 }),
                    dtype,
                    page_size,
                    sparse: None,
                };
                check_varlen(&c, &gpu, 500 + i as u64, false, false, gpu_tolerance(dtype)).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            }
        }
    }
}

/// A paged call with a mask that is not decoding-shaped is a typed error on the GPU (the general
/// paged kernels take no mask); the CPU backend answers it.
#[test]
fn paged_masks_outside_decoding_are_typed_errors() {
    let Some(gpu) = gpu() else { return };
    let c = VarlenCase {
        lens: vec![(40, 300), (3, 64)],
        heads: 4,
        kv_heads: 1,
        head_dim: 64,
        causal: true,
        band: None,
        softcap: 0.0,
        bias_heads: None,
        bias_per_query: false,
        mask: Some(VarlenMask { heads: 1, per_query: false, density: 0.5 }),
        dtype: DType::BF16,
        page_size: Some(64),
        sparse: None,
    };
    let inputs = c.inputs(&mut seeded_rng(9));
    c.forward(&inputs, &c.seqlens(&dmattn::Device::Cpu), false).unwrap();
    match c.forward(&inputs.to(&gpu), &c.seqlens(&gpu), false) {
        Err(dmattn::Error::Unsupported { .. }) => {}
        Err(e) => panic!("expected an unsupported-call error, got {e}"),
        Ok(_) => panic!("expected an unsupported-call error"),
    }
}

/// A packed batch's key-side mask given as a strided view (keys 1 apart, heads `total_k` apart)
/// gives the bits of the same mask laid out `[total_k, heads]`: the decoding kernel reads its
/// bytes where they are, by their strides.
#[test]
fn strided_key_side_mask_reads_the_same() {
    let Some(gpu) = gpu() else { return };
    let c = VarlenCase {
        lens: vec![(3, 3000), (1, 70), (6, 500), (0, 40), (2, 1500)],
        heads: 8,
        kv_heads: 2,
        head_dim: 64,
        causal: true,
        band: None,
        softcap: 0.0,
        bias_heads: Some(2),
        bias_per_query: false,
        mask: Some(VarlenMask { heads: 2, per_query: false, density: 0.3 }),
        dtype: DType::BF16,
        page_size: None,
        sparse: None,
    };
    let seqs = c.seqlens(&gpu);
    let cpu = c.inputs(&mut seeded_rng(11));
    let mask = cpu.mask.as_ref().unwrap();
    let [keys, heads] = mask.shape()[..] else { unreachable!("a key-side mask is 2-D") };
    let flags = mask.to_f64_vec().unwrap();
    let by_head: Vec<bool> = (0..heads * keys).map(|i| flags[(i % keys) * heads + i / keys] != 0.0).collect();
    let strided = Tensor::from_vec(by_head, &[heads, keys], &gpu).unwrap().as_strided(&[keys, heads], &[1, keys], 0).unwrap();
    let out = |inputs: &Packed| c.forward(inputs, &seqs, false).unwrap().out.to_f64_vec().unwrap();
    let (contiguous, viewed) = (out(&cpu.to(&gpu)), out(&Packed { mask: Some(strided), ..cpu.to(&gpu) }));
    assert!(contiguous.iter().all(|x| x.is_finite()));
    assert!(contiguous.iter().zip(&viewed).all(|(a, b)| a.to_bits() == b.to_bits()), "a strided mask's outputs differ from the contiguous one's");
}

/// A fixed-length decoding call's key-side mask, which the decoding kernel reads as bytes by
/// its strides: a view with keys 2 apart, and one expanded over the batch (stride 0), give the
/// outputs of the same mask laid out contiguous, bit for bit. And a decoding forward's mask,
/// prepared afresh by each backward, gives two deterministic backwards the same gradients.
#[test]
fn fixed_key_side_mask_views_read_the_same() {
    let Some(gpu) = gpu() else { return };
    let (b, hk, keys) = (2, 2, 3000);
    let case = Case {
        mask: Some([b, hk, 1, keys]),
        mask_pattern: MaskPattern::Random(0.1),
        bias: Some([1, hk, 1, keys]),
        causal: true,
        dtype: DType::BF16,
        ..Case::new(b, 3, keys, 4, hk, 64)
    };
    let mut cpu = case.inputs(&mut seeded_rng(23));
    // Batch entry 1's mask made entry 0's, so that an expanded view can give the same mask.
    let flags = cpu.mask.as_ref().unwrap().to_f64_vec().unwrap();
    let plane = hk * keys;
    let same: Vec<bool> = (0..b * plane).map(|i| flags[i % plane] != 0.0).collect();
    cpu.mask = Some(Tensor::from_vec(same.clone(), &[b, hk, 1, keys], &dmattn::Device::Cpu).unwrap());
    let spread: Vec<bool> = (0..2 * b * plane).map(|i| i % 2 == 0 && same[i / 2]).collect();
    let strided = Tensor::from_vec(spread, &[b, hk, 1, 2 * keys], &gpu).unwrap().as_strided(&[b, hk, 1, keys], &[2 * plane, 2 * keys, 2 * keys, 2], 0).unwrap();
    let one = Tensor::from_vec(same[..plane].to_vec(), &[1, hk, 1, keys], &gpu).unwrap();
    let expanded = one.as_strided(&[b, hk, 1, keys], &[0, keys, keys, 1], 0).unwrap();
    let on_gpu = cpu.to(&gpu);
    let out = |mask: &Tensor| {
        let inputs = Inputs { q: on_gpu.q.clone(), k: on_gpu.k.clone(), v: on_gpu.v.clone(), mask: Some(mask.clone()), bias: on_gpu.bias.clone() };
        case.call(&inputs).forward().unwrap().out.to_f64_vec().unwrap()
    };
    let contiguous = out(on_gpu.mask.as_ref().unwrap());
    check_gpu_forward(&case, ForwardPath::Fused, &gpu, &cpu).unwrap();
    for (what, mask) in [("strided", &strided), ("expanded", &expanded)] {
        let viewed = out(mask);
        assert!(contiguous.iter().zip(&viewed).all(|(a, b)| a.to_bits() == b.to_bits()), "a {what} mask's outputs differ from the contiguous one's");
    }
    let fwd = case.call(&on_gpu).deterministic(true).forward().unwrap();
    let dout = gpu_dout(&case, 5).to_device(&gpu).unwrap();
    let (first, again) = (grads_vec(&fwd.backward(&dout).unwrap()), grads_vec(&fwd.backward(&dout).unwrap()));
    assert_same_bits(&first, &again, &case);
}
