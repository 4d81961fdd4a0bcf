//! Index lists (`attn_indices`) on the CPU: `.indices(lists)` and `SparseMask::indices` give bit for
//! bit the forward and backward of the same call with the dense mask the lists describe (built by
//! `dmattn_tests::sparse::random_indices`, independently of dmattn), with and without causal, for
//! lists with and without a query dimension, padding, repeats and `w` past `seqlen_k`; and bad
//! lists are typed errors naming `indices`. Also the window-shaped lists the GPU tests draw: what
//! they hold, and that both answers of the brute-force window test occur among them.
use dmattn::{DType, Device, Error, SparseMask, Tensor, attention, set_output_poisoning};
use dmattn_tests::sparse::{random_indices, window_lists, window_of};
use dmattn_tests::{Case, fresh_rng};
use rand::Rng;

const CPU: Device = Device::Cpu;

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec().unwrap().iter().map(|x| x.to_bits()).collect()
}

#[test]
fn index_lists_match_their_dense_mask() {
    let mut rng = fresh_rng("index_lists_match_their_dense_mask");
    set_output_poisoning(true);
    for _ in 0..60 {
        let (b, hk, g) = (rng.random_range(1..=2), rng.random_range(1..=2), rng.random_range(1..=2));
        let (sq, sk) = (rng.random_range(1..=40), rng.random_range(1..=40));
        let causal = rng.random_bool(0.5);
        let case = Case { causal, bias: rng.random_bool(0.5).then_some([1, 1, 1, sk]), ..Case::new(b, sq, sk, hk * g, hk, 8) };
        let inputs = case.inputs(&mut rng);
        let (shape, idx, keep) = random_indices(&mut rng, &case);
        let lists = Tensor::from_vec(idx, &shape, &CPU).unwrap();
        let dense = Tensor::from_vec(keep, &[shape[0], shape[1], shape[2], sk], &CPU).unwrap();
        let got = case.call(&inputs).indices(&lists).forward().unwrap();
        let prepared = SparseMask::indices(&lists).prepare(sq, sk).unwrap();
        let got2 = case.call(&inputs).sparse_mask(&prepared).forward().unwrap();
        let want = case.call(&inputs).mask(&dense).forward().unwrap();
        for (name, a, w) in [("out", &got.out, &want.out), ("lse", &got.lse, &want.lse), ("out (prepared)", &got2.out, &want.out)] {
            assert_eq!(bits(a), bits(w), "{name} for {case:?} with lists {shape:?}");
        }
        let dout = Tensor::from_fn(&case.q_shape(), DType::F32, &CPU, |i| (i as f64 * 0.37).sin()).unwrap();
        let (g, w) = (got.backward(&dout).unwrap(), want.backward(&dout).unwrap());
        for (name, a, b) in [("dq", &g.dq, &w.dq), ("dk", &g.dk, &w.dk), ("dv", &g.dv, &w.dv)] {
            assert_eq!(bits(a), bits(b), "{name} for {case:?} with lists {shape:?}");
        }
    }
}

#[test]
fn bad_index_lists_are_typed_errors() {
    let case = Case::new(1, 5, 7, 2, 1, 8);
    let mut rng = fresh_rng("bad_index_lists_are_typed_errors");
    let inputs = case.inputs(&mut rng);
    let lists = |v: Vec<i32>, shape: &[usize]| Tensor::from_vec(v, shape, &CPU).unwrap();
    let param = |r: dmattn::Result<dmattn::Forward>, what: &str| match r {
        Err(Error::Param { arg: "indices", .. }) => {}
        Err(e) => panic!("{what}: {e:?}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    let shape = |r: dmattn::Result<dmattn::Forward>, what: &str| match r {
        Err(Error::Shape { arg: "indices", .. }) => {}
        Err(e) => panic!("{what}: {e:?}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    param(case.call(&inputs).indices(&lists(vec![0, 7], &[1, 1, 1, 2])).forward(), "index = seqlen_k");
    param(case.call(&inputs).indices(&lists(vec![-2, 1], &[1, 1, 1, 2])).forward(), "index -2");
    shape(case.call(&inputs).indices(&lists(vec![], &[1, 1, 1, 0])).forward(), "w = 0");
    shape(case.call(&inputs).indices(&lists(vec![0; 6], &[1, 1, 3, 2])).forward(), "3 rows for 5 queries");
    shape(case.call(&inputs).indices(&lists(vec![0; 2], &[1, 2])).forward(), "2-D");
    shape(case.call(&inputs).indices(&lists(vec![0; 6], &[1, 3, 1, 2])).forward(), "3 heads");
    let f32_lists = Tensor::from_fn(&[1, 1, 1, 2], DType::F32, &CPU, |_| 0.0).unwrap();
    match case.call(&inputs).indices(&f32_lists).forward() {
        Err(Error::DType { arg: "indices", .. }) => {}
        other => panic!("f32 indices: {:?}", other.err()),
    }
    let mask = Tensor::from_vec(vec![true; 7], &[1, 1, 1, 7], &CPU).unwrap();
    param(attention(&inputs.q, &inputs.k, &inputs.v).mask(&mask).indices(&lists(vec![0], &[1, 1, 1, 1])).forward(), "mask and indices");
    let prepared = SparseMask::causal().prepare(5, 7).unwrap();
    param(attention(&inputs.q, &inputs.k, &inputs.v).sparse_mask(&prepared).indices(&lists(vec![0], &[1, 1, 1, 1])).forward(), "sparse mask and indices");
    assert!(matches!(SparseMask::indices(&lists(vec![9], &[1, 1, 1, 1])).prepare(5, 7), Err(Error::Param { arg: "indices", .. })));
}

/// `window_lists` draws lists whose entries are the keep table's keys (in some order, padded
/// with repeats and -1), windows as often as near-windows, and `window_of` tells them apart: an unchanged
/// draw is a window with the sides it was drawn from or wider (a side past the keys binds
/// nothing), and of the changed ones most are not.
#[test]
fn window_lists_are_windows_or_one_change_away() {
    let mut rng = fresh_rng("window_lists_are_windows_or_one_change_away");
    let (mut windows, mut draws) = (0, 0);
    for _ in 0..2000 {
        let (b, hk, g) = (rng.random_range(1..=2), rng.random_range(1..=2), rng.random_range(1..=2));
        let (sq, sk) = (rng.random_range(2..=70), rng.random_range(1..=70));
        let case = Case::new(b, sq, sk, hk * g, hk, 8);
        let (shape, idx, keep) = window_lists(&mut rng, &case);
        assert_eq!((shape[2], idx.len(), keep.len()), (sq, shape.iter().product(), shape[0] * shape[1] * sq * sk));
        for (n, row) in idx.chunks(shape[3]).enumerate() {
            let listed: std::collections::BTreeSet<usize> = row.iter().filter(|&&k| k >= 0).map(|&k| k as usize).collect();
            let kept: std::collections::BTreeSet<usize> = (0..sk).filter(|&j| keep[n * sk + j]).collect();
            assert_eq!(listed, kept, "row {n}");
        }
        windows += window_of(&keep, shape[0] * shape[1], sq, sk).is_some() as usize;
        draws += 1;
    }
    // Half the draws are unchanged windows (all of them windows, unless empty); some changes keep one.
    assert!((draws * 45 / 100..=draws * 80 / 100).contains(&windows), "{windows} windows in {draws} draws");
}
