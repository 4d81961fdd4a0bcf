//! Packed variable-length batches on the CPU backend: each sequence's rows equal its own
//! fixed-length call (forward and backward, empty sequences included), and every malformed
//! `cu_seqlens` or packed shape is a typed error naming the argument.
use dmattn::{DType, Device, Error, PageTable, SeqLens, Tensor, attention};
use dmattn_tests::sparse::BandCtor;
use dmattn_tests::varlen::{VarlenCase, VarlenMask, check_varlen};

fn case(lens: &[(usize, usize)], causal: bool, band: Option<BandCtor>) -> VarlenCase {
    VarlenCase {
        lens: lens.to_vec(),
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        causal,
        band,
        softcap: 0.0,
        bias_heads: None,
        bias_per_query: false,
        mask: None,
        dtype: DType::F64,
        page_size: None,
        sparse: None,
    }
}

#[test]
fn packed_calls_equal_each_sequence_alone() {
    let lens = [(5, 7), (0, 3), (9, 9), (3, 0), (1, 1), (12, 4)];
    for (i, (causal, band, softcap)) in [
        (false, None, 0.0),
        (true, None, 0.0),
        (true, Some(BandCtor::CausalWindow(2)), 0.0),
        (false, Some(BandCtor::Window(Some(1), Some(3))), 5.0),
    ]
    .into_iter()
    .enumerate()
    {
        // A key-side or query-based bias of each head count, and none.
        for bias_per_query in [false, true] {
            let c = VarlenCase {
                softcap,
                bias_heads: [None, Some(1), Some(2), Some(4)][i],
                bias_per_query,
                ..case(&lens, causal, band)
            };
            check_varlen(&c, &Device::Cpu, 17 + i as u64, true, false, 1e-12).unwrap();
        }
    }
    // A key-side or query-based mask of each head count, with either bias layout (the mixed
    // layouts too), with causal and a window on top.
    for (i, (per_query, bias_per_query, band)) in [(false, true, None), (true, false, Some(BandCtor::CausalWindow(3))), (true, true, None), (false, false, Some(BandCtor::Window(Some(2), None)))].into_iter().enumerate() {
        let c = VarlenCase {
            bias_heads: Some([1, 2, 4, 2][i]),
            bias_per_query,
            mask: Some(VarlenMask { heads: [4, 1, 2, 4][i], per_query, density: 0.6 }),
            ..case(&lens, true, band)
        };
        check_varlen(&c, &Device::Cpu, 40 + i as u64, true, false, 1e-12).unwrap();
    }
    // No queries at all, no keys at all.
    for lens in [&[(0, 4)][..], &[(0, 0), (2, 0)], &[(3, 0)]] {
        check_varlen(&case(lens, true, None), &Device::Cpu, 5, true, false, 1e-12).unwrap();
    }
}

fn packed(rows: usize, heads: usize) -> Tensor {
    Tensor::from_fn(&[rows, heads, 8], DType::F32, &Device::Cpu, |i| {
        (i as f64 * 0.37).sin()
    })
    .unwrap()
}

#[test]
fn malformed_seqlens_are_typed_errors() {
    let cpu = Device::Cpu;
    let param = |r: dmattn::Result<SeqLens>, want: &str| match r {
        Err(Error::Param { arg, .. })
        | Err(Error::Shape { arg, .. })
        | Err(Error::DType { arg, .. }) => assert_eq!(arg, want),
        other => panic!("expected an error naming {want}, got {other:?}"),
    };
    param(SeqLens::new(&[0, 4, 2], &[0, 1, 2], &cpu), "cu_seqlens_q");
    param(SeqLens::new(&[1, 4], &[0, 1], &cpu), "cu_seqlens_q");
    param(SeqLens::new(&[0], &[0], &cpu), "cu_seqlens_q");
    param(SeqLens::new(&[0, 4], &[0, 1, 2], &cpu), "cu_seqlens_k");
    param(SeqLens::new(&[0, 4], &[0, -1], &cpu), "cu_seqlens_k");
    let i32s = |v: &[i32]| Tensor::from_vec(v.to_vec(), &[v.len()], &cpu).unwrap();
    let floats = Tensor::from_fn(&[2], DType::F32, &cpu, |i| i as f64).unwrap();
    param(
        SeqLens::from_tensors(&floats, &i32s(&[0, 1])),
        "cu_seqlens_q",
    );
    param(
        SeqLens::from_tensors(&i32s(&[0, 3]), &i32s(&[0, 3, 1])),
        "cu_seqlens_k",
    );
    let ok = SeqLens::from_tensors(&i32s(&[0, 3, 5]), &i32s(&[0, 2, 6])).unwrap();
    assert_eq!(
        (
            ok.batch(),
            ok.total_q(),
            ok.total_k(),
            ok.max_seqlen_q(),
            ok.max_seqlen_k()
        ),
        (2, 5, 6, 3, 4)
    );

    // Totals that are not the tensors' rows, 4-D tensors, and what packed calls do not take yet.
    let seqs = SeqLens::new(&[0, 3, 5], &[0, 2, 6], &cpu).unwrap();
    let (q, kv) = (packed(5, 4), packed(6, 2));
    let shape = |r: dmattn::Result<dmattn::Forward>, want: &str| match r {
        Err(Error::Shape { arg, .. }) => assert_eq!(arg, want),
        Err(e) => panic!("expected a shape error naming {want}, got {e}"),
        Ok(_) => panic!("expected a shape error naming {want}"),
    };
    shape(
        attention(&packed(6, 4), &kv, &kv).seqlens(&seqs).forward(),
        "q",
    );
    shape(
        attention(&q, &packed(5, 2), &packed(5, 2))
            .seqlens(&seqs)
            .forward(),
        "k",
    );
    shape(
        attention(&q, &kv, &packed(7, 2)).seqlens(&seqs).forward(),
        "v",
    );
    let q4 = Tensor::from_fn(&[1, 5, 4, 8], DType::F32, &cpu, |i| i as f64).unwrap();
    shape(attention(&q4, &kv, &kv).seqlens(&seqs).forward(), "q");
    // A bias is key-side `[total_k, {1|hk|h}]`.
    let bias = Tensor::from_fn(&[1, 1, 1, 4], DType::F32, &cpu, |i| i as f64).unwrap();
    shape(attention(&q, &kv, &kv).seqlens(&seqs).bias(&bias).forward(), "bias");
    let bias = Tensor::from_fn(&[6, 3], DType::F32, &cpu, |i| i as f64).unwrap();
    shape(attention(&q, &kv, &kv).seqlens(&seqs).bias(&bias).forward(), "bias");
    let bias = Tensor::from_fn(&[6, 2], DType::F32, &cpu, |i| i as f64).unwrap();
    attention(&q, &kv, &kv).seqlens(&seqs).bias(&bias).forward().unwrap();
    // Query-based `[total_q, {1|hk|h}, max_seqlen_k]`.
    let per_query = |s: &[usize]| Tensor::from_fn(s, DType::F32, &cpu, |i| i as f64 * 0.01).unwrap();
    attention(&q, &kv, &kv).seqlens(&seqs).bias(&per_query(&[5, 4, 4])).forward().unwrap();
    shape(attention(&q, &kv, &kv).seqlens(&seqs).bias(&per_query(&[5, 4, 6])).forward(), "bias");
    shape(attention(&q, &kv, &kv).seqlens(&seqs).bias(&per_query(&[6, 4, 4])).forward(), "bias");
    shape(attention(&q, &kv, &kv).seqlens(&seqs).bias(&per_query(&[5, 3, 4])).forward(), "bias");
    attention(&q, &kv, &kv).seqlens(&seqs).bias(&bias).deterministic(true).forward().unwrap();
    // A mask takes the bias's layouts, Bool only.
    let keep = |s: &[usize]| Tensor::from_fn(s, DType::Bool, &cpu, |i| (i % 3 != 0) as u8 as f64).unwrap();
    attention(&q, &kv, &kv).seqlens(&seqs).mask(&keep(&[6, 2])).forward().unwrap();
    attention(&q, &kv, &kv).seqlens(&seqs).mask(&keep(&[5, 1, 4])).bias(&bias).forward().unwrap();
    for bad in [&[6, 3][..], &[5, 2], &[1, 1, 1, 6], &[5, 4, 5]] {
        shape(attention(&q, &kv, &kv).seqlens(&seqs).mask(&keep(bad)).forward(), "mask");
    }
    match attention(&q, &kv, &kv).seqlens(&seqs).mask(&per_query(&[5, 4, 4])).forward() {
        Err(Error::DType { arg, .. }) => assert_eq!(arg, "mask"),
        other => panic!("expected a dtype error naming mask, got {:?}", other.err()),
    }
    attention(&q, &kv, &kv)
        .seqlens(&seqs)
        .causal(true)
        .forward()
        .unwrap();
}

/// Paged K/V on the CPU: the same outputs as the packed call (pages drawn at random, spare rows
/// NaN), checked against each sequence alone; the backward of a paged call is a typed error.
#[test]
fn paged_calls_equal_packed_ones() {
    let lens = [(5, 70), (0, 3), (9, 129), (3, 0), (1, 64)];
    for (i, page_size) in [64, 128, 256].into_iter().enumerate() {
        // A key-side mask with the last (a query-based one is a typed error with pages).
        let mask = (i == 2).then_some(VarlenMask { heads: 2, per_query: false, density: 0.5 });
        let c = VarlenCase { page_size: Some(page_size), bias_heads: Some(2), mask, ..case(&lens, i != 1, None) };
        if i == 2 {
            let per_query = VarlenCase { mask: Some(VarlenMask { per_query: true, ..mask.unwrap() }), ..c.clone() };
            let inputs = per_query.inputs(&mut dmattn_tests::seeded_rng(3));
            assert!(matches!(per_query.forward(&inputs, &per_query.seqlens(&Device::Cpu), false), Err(Error::Unsupported { .. })));
        }
        check_varlen(&c, &Device::Cpu, 40 + i as u64, false, false, 1e-12).unwrap();
        let inputs = c.inputs(&mut dmattn_tests::seeded_rng(40 + i as u64));
        let seqs = c.seqlens(&Device::Cpu);
        let paged = c.forward(&inputs, &seqs, false).unwrap();
        let packed = VarlenCase { page_size: None, ..c.clone() }.forward(&inputs, &seqs, false).unwrap();
        for (a, b) in [(&paged.out, &packed.out), (&paged.lse, &packed.lse)] {
            let (a, b) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "paged and packed differ ({page_size})");
        }
        assert!(matches!(paged.backward(&inputs.dout), Err(Error::Unsupported { .. })));
    }
}

#[test]
fn malformed_page_tables_are_typed_errors() {
    let cpu = Device::Cpu;
    // Sequences of 70 and 3 keys: two pages of 64 and one.
    let seqs = SeqLens::new(&[0, 1, 2], &[0, 70, 73], &cpu).unwrap();
    let q = packed(2, 4);
    let pages = |n: usize, size: usize| Tensor::from_fn(&[n, size, 2, 8], DType::F32, &cpu, |i| (i as f64 * 0.1).cos()).unwrap();
    let kv = pages(3, 64);
    let run = |kv: &Tensor, table: &PageTable| attention(&q, kv, kv).seqlens(&seqs).kv_pages(table).forward();
    let expect = |r: dmattn::Result<dmattn::Forward>, want: &str| match r {
        Err(Error::Param { arg, .. }) | Err(Error::Shape { arg, .. }) | Err(Error::DType { arg, .. }) => assert_eq!(arg, want),
        Err(e) => panic!("expected an error naming {want}, got {e}"),
        Ok(_) => panic!("expected an error naming {want}"),
    };
    run(&kv, &PageTable::new(&[2, 0, 1, -1], 2, &cpu).unwrap()).unwrap();
    // An entry a sequence reaches out of range (negative, or past the pages); too few entries;
    // a row per sequence.
    expect(run(&kv, &PageTable::new(&[2, 3, 1, -1], 2, &cpu).unwrap()), "block_table");
    expect(run(&kv, &PageTable::new(&[2, 0, -1, 0], 2, &cpu).unwrap()), "block_table");
    expect(run(&kv, &PageTable::new(&[2, 1], 2, &cpu).unwrap()), "block_table");
    expect(run(&kv, &PageTable::new(&[2, 0, 1, -1, 0, 0], 3, &cpu).unwrap()), "block_table");
    // Page sizes: powers of two (16-key pages, as vLLM's, are taken).
    run(&pages(6, 16), &PageTable::new(&[5, 4, 3, 2, 1, 0, -1, -1, -1, -1], 2, &cpu).unwrap()).unwrap();
    expect(run(&pages(3, 48), &PageTable::new(&[2, 0, 1, 1, 1, 1], 2, &cpu).unwrap()), "k");
    expect(run(&pages(3, 96), &PageTable::new(&[2, 0, 1, -1], 2, &cpu).unwrap()), "k");
    // Pages of 2^32 keys (a view with a zero row stride): past the kernels' 32-bit shift.
    let one_row = Tensor::from_fn(&[8], DType::F32, &cpu, |i| i as f64).unwrap();
    let huge = one_row.as_strided(&[1, 1 << 32, 1, 8], &[0, 0, 0, 1], 0).unwrap();
    let seqs1 = SeqLens::new(&[0, 1], &[0, 4], &cpu).unwrap();
    let q1 = Tensor::from_fn(&[1, 1, 8], DType::F32, &cpu, |i| i as f64).unwrap();
    expect(attention(&q1, &huge, &huge).seqlens(&seqs1).kv_pages(&PageTable::new(&[0], 1, &cpu).unwrap()).forward(), "k");
    // Malformed tables, and pages without a packed batch.
    assert!(matches!(PageTable::new(&[0, 1, 2], 2, &cpu), Err(Error::Shape { arg: "block_table", .. })));
    let floats = Tensor::from_fn(&[2, 2], DType::F32, &cpu, |i| i as f64).unwrap();
    assert!(matches!(PageTable::from_tensor(&floats), Err(Error::DType { arg: "block_table", .. })));
    let table = PageTable::from_tensor(&Tensor::from_vec(vec![2i32, 0, 1, -1], &[2, 2], &cpu).unwrap()).unwrap();
    assert_eq!((table.batch(), table.max_pages(), table.page(1, 0), table.page(2, 0)), (2, 2, Some(1), None));
    let q4 = Tensor::from_fn(&[1, 2, 4, 8], DType::F32, &cpu, |i| i as f64).unwrap();
    expect(attention(&q4, &kv, &kv).kv_pages(&table).forward(), "block_table");
}

/// Sparse masks with data in packed batches (`SparseMask::prepare_packed`): random score,
/// block and index-list masks given per sequence (a plane each or one for all), alone or with
/// causal, a window, biases of either layout, against each sequence alone with the equivalent
/// dense mask, forward and backward.
#[test]
fn packed_sparse_masks_equal_each_sequence_alone() {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let lens = [&[(5, 7), (0, 3), (9, 70), (3, 0), (1, 1), (12, 4)][..], &[(70, 130), (66, 65)], &[(1, 200)]];
    for i in 0..60 {
        let sparse = dmattn_tests::varlen::varlen_sparse().new_tree(&mut runner).unwrap().current();
        let band = [None, Some(BandCtor::CausalWindow(5)), Some(BandCtor::Window(Some(3), None))][i % 3];
        let c = VarlenCase {
            bias_heads: [None, Some(1), Some(2), Some(4)][i % 4],
            bias_per_query: i % 5 == 0,
            sparse: Some(sparse),
            ..case(lens[i % 3], i % 2 == 0, band)
        };
        check_varlen(&c, &Device::Cpu, 100 + i as u64, true, false, 1e-12).unwrap_or_else(|e| panic!("case {i}: {e}"));
    }
}

/// What a packed batch's sparse mask must be: prepared for the call's sequences (with data),
/// a plane per sequence or one for all, not with paged K/V; a mask prepared for it serves no
/// fixed-length call.
#[test]
fn packed_sparse_masks_are_checked() {
    use dmattn::SparseMask;
    let cpu = Device::Cpu;
    let seqs = SeqLens::from_lengths(&[3, 5], &[4, 70], &cpu).unwrap();
    let (q, kv) = (packed(8, 4), packed(74, 2));
    let kept = |b: usize| Tensor::from_vec(vec![true; b * 2], &[b, 1, 1, 2], &cpu).unwrap();
    let param = |r: dmattn::Result<dmattn::Forward>, want: &str| match r {
        Err(Error::Param { arg, .. }) | Err(Error::Shape { arg, .. }) => assert_eq!(arg, want),
        Err(e) => panic!("expected an error naming {want}, got {e}"),
        Ok(_) => panic!("expected an error naming {want}"),
    };
    let mask = SparseMask::block_bitset(&kept(2), 64);
    attention(&q, &kv, &kv).seqlens(&seqs).sparse_mask(&mask.prepare_packed(&seqs).unwrap()).forward().unwrap();
    // Prepared for fixed lengths, or for other sequences.
    param(attention(&q, &kv, &kv).seqlens(&seqs).sparse_mask(&mask.prepare(5, 70).unwrap()).forward(), "sparse_mask");
    let other = SeqLens::from_lengths(&[5, 3], &[70, 4], &cpu).unwrap();
    param(attention(&q, &kv, &kv).seqlens(&seqs).sparse_mask(&mask.prepare_packed(&other).unwrap()).forward(), "sparse_mask");
    // Same lengths, built again: taken.
    let again = SeqLens::from_lengths(&[3, 5], &[4, 70], &cpu).unwrap();
    attention(&q, &kv, &kv).seqlens(&seqs).sparse_mask(&mask.prepare_packed(&again).unwrap()).forward().unwrap();
    // Three planes for two sequences; block bitsets of the wrong block count.
    assert!(matches!(SparseMask::block_bitset(&kept(3), 64).prepare_packed(&seqs), Err(Error::Shape { arg: "sparse_mask", .. })));
    let wide = Tensor::from_vec(vec![true; 4], &[2, 1, 1, 2], &cpu).unwrap();
    assert!(matches!(SparseMask::block_bitset(&wide, 128).prepare_packed(&seqs), Err(Error::Shape { arg: "block_bitset", .. })));
    // A packed batch's mask in a fixed-length call.
    let dense = |shape: &[usize]| Tensor::from_fn(shape, DType::F32, &cpu, |i| (i as f64 * 0.37).sin()).unwrap();
    let (q4, kv4) = (dense(&[1, 5, 4, 8]), dense(&[1, 70, 2, 8]));
    param(attention(&q4, &kv4, &kv4).sparse_mask(&mask.prepare_packed(&seqs).unwrap()).forward(), "sparse_mask");
    // Index lists of a packed batch: `[{1|batch}, heads, {1|max_seqlen_q}, w]`.
    let idx = Tensor::from_vec(vec![0i32, 69, -1, 3], &[2, 1, 1, 2], &cpu).unwrap();
    attention(&q, &kv, &kv).seqlens(&seqs).indices(&idx).forward().unwrap();
    let idx3 = Tensor::from_vec(vec![0i32; 6], &[3, 1, 1, 2], &cpu).unwrap();
    param(attention(&q, &kv, &kv).seqlens(&seqs).indices(&idx3).forward(), "indices");
    // Paged K/V take no mask with data per query.
    let pages = Tensor::from_fn(&[3, 64, 2, 8], DType::F32, &cpu, |i| (i as f64 * 0.1).cos()).unwrap();
    let table = PageTable::new(&[0, -1, 1, 2], 2, &cpu).unwrap();
    let paged = attention(&q, &pages, &pages).seqlens(&seqs).kv_pages(&table).sparse_mask(&mask.prepare_packed(&seqs).unwrap()).forward();
    assert!(matches!(paged, Err(Error::Unsupported { .. })));
}
