//! `select_keys` on the CPU backend (the reference the GPU is checked against) against the
//! selection's definition, computed independently (a count of the keys that beat each key, not a
//! sort), over random biases with ties, NaN, ±0 and ±inf, broadcasts, masks, relu, block
//! smoothing and `k` beyond the row; the three outputs agree; typed errors.
use dmattn::{DType, Device, Error, Tensor, select_keys};
use dmattn_tests::fresh_rng;
use dmattn_tests::select::SelectCase;

#[test]
fn cpu_selection_matches_its_definition() {
    let mut rng = fresh_rng("cpu_selection_matches_its_definition");
    for n in 0..400 {
        let case = SelectCase::random(&mut rng, 160);
        let (bias, mask) = case.tensors(&Device::Cpu);
        let sel = case.select(&bias, mask.as_ref());
        let out = case.out_shape();
        let want = case.expected();
        let mask_out = sel.mask().unwrap_or_else(|e| panic!("case {n} {case:?}: {e}"));
        assert_eq!(mask_out.shape(), &out);
        let got: Vec<bool> = mask_out.to_f64_vec().unwrap().iter().map(|&x| x != 0.0).collect();
        assert_eq!(got, want, "case {n}: {case:?}");
        // Packed: the same bits, little-endian within each byte.
        let packed = sel.packed_mask().unwrap();
        assert_eq!(packed.shape(), &[out[0], out[1], out[2], out[3].div_ceil(8)]);
        let bytes = packed.to_f64_vec().unwrap();
        for (r, row) in want.chunks(out[3]).enumerate() {
            for (j, &k) in row.iter().enumerate() {
                let byte = bytes[r * out[3].div_ceil(8) + j / 8] as u8;
                assert_eq!(byte >> (j % 8) & 1 != 0, k, "case {n} row {r} key {j}");
            }
        }
        // Index lists: the kept keys ascending, then -1; relu has none.
        match (case.k, sel.indices()) {
            (None, Err(Error::Param { arg: "indices", .. })) => {}
            (Some(k), Ok(lists)) => {
                let w = lists.shape()[3];
                assert!(w >= k && w <= k.max(2 * k).max(out[3]), "width {w} for k {k}");
                let v = lists.to_vec::<i32>().unwrap();
                for (r, row) in want.chunks(out[3]).enumerate() {
                    let keys: Vec<i32> = (0..out[3]).filter(|&j| row[j]).map(|j| j as i32).collect();
                    assert!(keys.len() <= w);
                    let expect: Vec<i32> = keys.iter().copied().chain(std::iter::repeat(-1)).take(w).collect();
                    assert_eq!(&v[r * w..(r + 1) * w], &expect[..], "case {n} row {r}");
                }
            }
            (k, other) => panic!("case {n}: k {k:?} gave {other:?}"),
        }
    }
}

/// Flash-DMA's workload: a key-side bias and a top-k over it, the same keys for every query.
#[test]
fn top_k_of_a_key_side_bias_keeps_the_largest_ties_to_the_lower_key() {
    let cpu = Device::Cpu;
    let bias = Tensor::from_vec(vec![1.0f32, 3.0, 3.0, -1.0, 3.0, f32::NAN, 0.0, -0.0], &[1, 1, 1, 8], &cpu).unwrap();
    let top = |k| select_keys(&bias).top_k(k).indices().unwrap().to_vec::<i32>().unwrap();
    assert_eq!(top(1), [5]); // NaN ranks first
    assert_eq!(top(3), [1, 2, 5]); // 3.0 at keys 1, 2, 4: the lower two
    assert_eq!(top(6), [0, 1, 2, 4, 5, 6]); // +0 at 6 before -0 at 7
    assert_eq!(top(10), [0, 1, 2, 3, 4, 5, 6, 7, -1, -1]);
    let relu: Vec<f64> = select_keys(&bias).relu().mask().unwrap().to_f64_vec().unwrap();
    assert_eq!(relu, [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
    // Within a mask hiding key 1, and smoothed over blocks of 4: keys 2, 4, 5 are taken; block
    // 0..4 has 1 of 4 (dropped), block 4..8 has 2 of 4 (dropped: not more than half).
    let hide = Tensor::from_fn(&[1, 1, 1, 8], DType::Bool, &cpu, |i| (i != 1) as u8 as f64).unwrap();
    let within = select_keys(&bias).top_k(3).within(&hide);
    assert_eq!(within.indices().unwrap().to_vec::<i32>().unwrap(), [2, 4, 5]);
    assert_eq!(within.clone().block_size(4).indices().unwrap().to_vec::<i32>().unwrap(), [-1; 6]);
    // Blocks of 2: {2,3} 1 of 2 dropped, {4,5} kept.
    assert_eq!(within.block_size(2).indices().unwrap().to_vec::<i32>().unwrap(), [4, 5, -1, -1, -1, -1]);
}

#[test]
fn bad_selections_are_typed_errors() {
    let cpu = Device::Cpu;
    let bias = Tensor::from_fn(&[2, 1, 3, 16], DType::F32, &cpu, |i| i as f64).unwrap();
    let arg = |r: dmattn::Result<Tensor>| match r {
        Err(Error::Param { arg, .. } | Error::Shape { arg, .. } | Error::DType { arg, .. } | Error::Device { arg, .. }) => arg,
        other => panic!("expected a typed error, got {other:?}"),
    };
    assert_eq!(arg(select_keys(&bias).mask()), "select_keys");
    assert_eq!(arg(select_keys(&bias).top_k(0).mask()), "k");
    assert_eq!(arg(select_keys(&bias).top_k(2).block_size(0).mask()), "block_size");
    assert_eq!(arg(select_keys(&bias).relu().indices()), "indices");
    let ints = Tensor::from_fn(&[1, 1, 1, 16], DType::I32, &cpu, |i| i as f64).unwrap();
    assert_eq!(arg(select_keys(&ints).top_k(2).mask()), "bias");
    let flat = Tensor::from_fn(&[3, 16], DType::F32, &cpu, |i| i as f64).unwrap();
    assert_eq!(arg(select_keys(&flat).top_k(2).mask()), "bias");
    let mask = |shape: &[usize], dtype| Tensor::from_fn(shape, dtype, &cpu, |_| 1.0).unwrap();
    assert_eq!(arg(select_keys(&bias).top_k(2).within(&mask(&[2, 1, 3, 16], DType::F32)).mask()), "mask");
    assert_eq!(arg(select_keys(&bias).top_k(2).within(&mask(&[2, 1, 2, 16], DType::Bool)).mask()), "mask");
    assert_eq!(arg(select_keys(&bias).top_k(2).within(&mask(&[2, 1, 3, 15], DType::Bool)).mask()), "mask");
    // Sizes past usize: k (past the row's keys, which keeps them all) and a broadcast of
    // zero-stride views.
    let all = select_keys(&bias).top_k(usize::MAX).block_size(2).mask().unwrap();
    assert!(all.to_f64_vec().unwrap().iter().all(|&x| x != 0.0));
    assert_eq!(arg(select_keys(&bias).top_k(usize::MAX).indices()), "k");
    assert_eq!(arg(select_keys(&bias).top_k(usize::MAX).block_size(2).indices()), "k");
    let row = Tensor::from_fn(&[16], DType::F32, &cpu, |i| i as f64).unwrap();
    let tall = row.as_strided(&[1 << 33, 1, 1, 16], &[0, 0, 0, 1], 0).unwrap();
    let wide = mask(&[1], DType::Bool).as_strided(&[1, 1 << 33, 1, 1], &[0, 0, 0, 0], 0).unwrap();
    assert_eq!(arg(select_keys(&tall).top_k(2).within(&wide).mask()), "mask");
    // A mask broadcast along the keys, and one adding a head dim, are fine.
    let m = select_keys(&bias).top_k(2).within(&mask(&[1, 4, 1, 1], DType::Bool)).mask().unwrap();
    assert_eq!(m.shape(), &[2, 4, 3, 16]);
}
