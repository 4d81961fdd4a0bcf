//! The fused backward kernel against the f64 CPU reference: every gradient (dq, dk, dv, dbias
//! under every bias broadcast shape), GQA/MQA, causal, softcap, masks with empty tiles and rows,
//! grids run in a work order; and the deterministic mode's bit-identical runs. Skips, saying
//! why, without a CUDA device.
use dmattn::DType;
use dmattn_tests::*;

#[test]
fn backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gpu_property(2000, 200, |(case, seed)| check_gpu_backward(&case, ForwardPath::Fused, &gpu, seed, false));
}

#[test]
fn deterministic_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gpu_property(300, 200, |(case, seed)| check_gpu_backward(&case, ForwardPath::Fused, &gpu, seed, true));
}

/// d64 and d128 without a mask, bias or softcap, where the Hopper kernels take the step with its
/// scores transposed (`bwd::transposed`; d128 on its 64-row tile, d64 on its 128-row one):
/// causal with sq != sk (rows with no visible key, diagonal tiles), GQA/MQA, odd lengths, both
/// element types; the placed grid forced on a quarter of the cases, and on another quarter a
/// query split (which d64's split kernels take transposed too, d128's row-major).
#[test]
fn lean_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gpu_property(2000, 200, |(case, seed)| {
        let head_dim = if seed % 8 < 4 { 128 } else { 64 };
        let case = Case { head_dim, mask: None, bias: None, softcap: 0.0, ..case };
        let split = (seed % 4 == 0).then(|| 1 + (seed / 4 % 3) as u32);
        let placed = (seed % 4 == 1).then_some(true);
        with_backward_forced(split, placed, || check_gpu_backward(&case, ForwardPath::Fused, &gpu, seed, false))
    });
}

/// Small lean cases at d128 and d64 for the sanitizer (`san gpu_backward lean_small`): causal
/// with more keys than queries (a diagonal crossing tiles, rows past the sequence's end) and
/// plain with GQA over several query tiles.
#[test]
fn lean_small() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("lean_small");
    for head_dim in [128, 64] {
        for case in [
            Case { causal: true, dtype: DType::BF16, ..Case::new(1, 70, 200, 2, 1, head_dim) },
            Case { dtype: DType::F16, ..Case::new(2, 150, 130, 4, 2, head_dim) },
        ] {
            check_gpu_backward(&case, ForwardPath::Fused, &gpu, rand::Rng::random(&mut rng), false).unwrap();
        }
    }
}

/// Query tiles split among several CTAs per key tile, which add their dK/dV shares to f32
/// accumulators: forced on every case (2-16 shares, whatever its size, at head dim 32 or 64,
/// whose kernels all split, and 128, whose Hopper kernels without a bias or softcap have split
/// kernels of their own: those cases drop both), so that shares with no visible tile, causal
/// bounds with sq != sk, masks, every bias broadcast and GQA meet the split.
#[test]
fn split_query_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gpu_property(1500, 300, |(case, seed)| {
        let case = split_head_dim(case, seed);
        with_backward_forced(Some(1 + (seed % 4) as u32), None, || check_gpu_backward(&case, ForwardPath::Fused, &gpu, seed, false))
    });
}

/// Key-side biases at d64 and d128, whose Hopper kernels copy only the bias row and sum dbias
/// over a CTA's whole walk where every head of its kv group reads that row (bias heads 1 or kv
/// heads) and per query tile otherwise (bias heads = heads under GQA): every broadcast, GQA,
/// causal with sq != sk, masks, softcap.
#[test]
fn key_side_bias_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gpu_property(1000, 300, |(case, seed)| check_gpu_backward(&key_side_bias(case, seed), ForwardPath::Fused, &gpu, seed, false));
}

/// Every case placed wherever its variant may be (`force_backward_placement`, whatever its
/// size): under a mask or bias a work order (and kv heads first where a bias is broadcast over
/// them), the lean variant under causal kv heads first (a swapped grid). Every key tile must still
/// be covered exactly once, with every broadcast, GQA and sq != sk.
#[test]
fn placed_backward_matches_reference() {
    let Some(gpu) = gpu() else { return };
    gpu_property(1000, 200, |(case, seed)| {
        with_backward_forced(None, Some(true), || check_gpu_backward(&case, ForwardPath::Fused, &gpu, seed, false))
    });
}

/// Many queries over few keys, where the plan itself splits the query tiles at d32/d64 (a grid
/// of a few CTAs otherwise): causal with sq >> sk (most rows see nothing), GQA, key-side and full
/// biases, a mask; and larger head dims, which keep one CTA per key tile, except d128 without a
/// bias on Hopper (the masked case here; `dmattn_abi::bwd_split_kernel`). The sparse block mask
/// over 200 query tiles leaves runs of more than 32 empty tiles in a key tile's column, which
/// the walk's cursor crosses a window at a time (`TileCursor::prev`, `next`).
#[test]
fn long_queries_over_few_keys() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("long_queries_over_few_keys");
    for case in [
        Case { bias: Some([1, 1, 1, 64]), causal: true, dtype: DType::BF16, ..Case::new(1, 4096, 64, 2, 1, 64) },
        Case { bias: Some([2, 4, 3000, 130]), dtype: DType::F16, ..Case::new(2, 3000, 130, 4, 2, 32) },
        Case { mask: Some([1, 1, 2500, 200]), mask_pattern: MaskPattern::Blocks(0.5), dtype: DType::BF16, ..Case::new(1, 2500, 200, 3, 1, 32) },
        Case { causal: true, softcap: 20.0, dtype: DType::BF16, ..Case::new(1, 3000, 1000, 1, 1, 256) },
        Case { bias: Some([1, 1, 1, 100]), causal: true, dtype: DType::BF16, ..Case::new(1, 2048, 100, 2, 1, 128) },
        Case { mask: Some([1, 1, 12800, 256]), mask_pattern: MaskPattern::Blocks(0.03), dtype: DType::BF16, ..Case::new(1, 12800, 256, 2, 1, 64) },
        Case { mask: Some([1, 1, 12800, 130]), mask_pattern: MaskPattern::Blocks(0.03), dtype: DType::F16, ..Case::new(1, 12800, 130, 2, 2, 128) },
    ] {
        check_gpu_backward(&case, ForwardPath::Fused, &gpu, rand::Rng::random(&mut rng), false).unwrap();
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
        let dout = gpu_dout(&case, seed);
        let first = gradients(&case, ForwardPath::Fused, &inputs, &dout, true);
        for _ in 0..3 {
            assert_same_bits(&first, &gradients(&case, ForwardPath::Fused, &inputs, &dout, true), &case);
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
    for g in gradients(&case, ForwardPath::Fused, &inputs, &gpu_dout(&case, 7), false).into_iter().flatten() {
        assert!(g.iter().all(|&x| x == 0.0), "nonzero gradient under an all-false mask");
    }
}

/// Key tiles no query sees (empty mask tiles): their CTAs skip every step and write dK = dV = 0,
/// which must not race with their own K/V copies still landing in the shared tiles that stage
/// the output (a bug found on an H100: intermittently wrong dK with one query row, thousands of
/// keys and a sparse random mask; compute-sanitizer's timing hid it). Many such tiles, several
/// draws.
#[test]
fn empty_key_tiles_write_zero_gradients() {
    let Some(gpu) = gpu() else { return };
    for (seed, sk) in [8000, 20000, 12000, 16448].into_iter().enumerate() {
        let case = Case {
            mask: Some([1, 2, 1, sk]),
            mask_pattern: MaskPattern::Random(0.05),
            dtype: DType::BF16,
            ..Case::new(2, 1, sk, 4, 2, 64)
        };
        check_gpu_backward(&case, ForwardPath::Fused, &gpu, seed as u64, false).unwrap();
    }
}

/// Grids of more CTAs than today's GPUs have SMs, under masks whose key tiles visit different
/// numbers of query tiles: on Hopper the lean variants run their CTAs heaviest first, each taking
/// its key tile, kv head and batch from the work order, and with a bias broadcast over heads the
/// kv heads of a key tile side by side (a swapped grid). Every key tile must still be covered
/// exactly once (dK and dV are poisoned before the kernel runs).
#[test]
fn placed_grids() {
    let Some(gpu) = gpu() else { return };
    let mut rng = fresh_rng("placed_grids");
    // (dtype, d, sq, sk, heads, kv heads, mask dims, bias dims, causal): 144-272 CTAs each.
    let cases = [
        (DType::BF16, 64, 300, 2000, 16, 8, [2, 1, 300, 2000], Some([2, 1, 300, 2000]), false),
        (DType::F16, 128, 256, 1500, 12, 6, [2, 12, 256, 1500], None, true),
        (DType::BF16, 64, 200, 2100, 8, 8, [1, 1, 200, 2100], Some([1, 1, 200, 2100]), false),
    ];
    for &(dtype, d, sq, sk, h, hk, mask, bias, causal) in &cases {
        let case = Case {
            mask: Some(mask),
            mask_pattern: MaskPattern::Blocks(0.5),
            bias,
            causal,
            dtype,
            ..Case::new(2, sq, sk, h, hk, d)
        };
        check_gpu_backward(&case, ForwardPath::Fused, &gpu, rand::Rng::random(&mut rng), false).unwrap();
    }
}
