//! The mask-memory table of the `sparse` group: each form of one 32K x 32K attention pattern
//! (batch 1, one head), prepared on the GPU, with the bytes the caller gives, the bytes the
//! prepared form holds (`PreparedMask::memory_bytes()`) and those of the dense bool mask.
use crate::timing::Timer;
use cudarc::driver::CudaStream;
use dmattn::{Device, SparseMask, Tensor};
use dmattn_bench::cases::{Case, Mask, block_pattern, grid};
use dmattn_bench::results::MaskMemory;
use rayon::prelude::*;
use std::sync::Arc;

const SEQLEN: usize = 32768;
const BLOCK: usize = 128;

/// Builds a form's mask on a device: the mask and the bytes of the tensors it is given.
type Build = Box<dyn Fn(&Device) -> dmattn::Result<(SparseMask, u64)>>;

/// One form: its name, key length and builder.
struct Form {
    name: &'static str,
    seqlen_k: usize,
    build: Build,
}

/// A `[1, 1, rows, cols]` pattern of 50 % random 128-blocks, the `bitset` cases' draw.
fn blocks_case() -> Case {
    let mut c = grid(true, &["sparse".into()]).into_iter().next().expect("the sparse group has cases");
    (c.batch, c.heads, c.kv_heads, c.mask_heads, c.seqlen_q, c.seqlen_k) = (1, 1, 1, 1, SEQLEN, SEQLEN);
    (c.causal, c.mask) = (false, Some(Mask::Bitset { block: BLOCK, density: 0.5 }));
    c
}

/// The dense bool rows of kept 128-blocks `[rows, cols]` (`cols` = [`SEQLEN`]).
fn dense_blocks(kept: &[bool]) -> Vec<bool> {
    let nk = SEQLEN / BLOCK;
    let mut vis = vec![false; SEQLEN * SEQLEN];
    vis.par_chunks_mut(SEQLEN).enumerate().for_each(|(i, row)| {
        let blocks = &kept[(i / BLOCK) * nk..][..nk];
        row.iter_mut().enumerate().for_each(|(j, v)| *v = blocks[j / BLOCK]);
    });
    vis
}

fn forms() -> Vec<Form> {
    let c = blocks_case();
    let (nq, nk) = (SEQLEN / BLOCK, SEQLEN / BLOCK);
    let kept = Arc::new(block_pattern(&c, BLOCK, 0.5));
    let shape = |rows: usize, cols: usize| [1, 1, rows, cols];
    let mut forms = vec![
        Form { name: "causal_window(1024)", seqlen_k: SEQLEN, build: Box::new(|_| Ok((SparseMask::causal_window(1024), 0))) },
        Form { name: "compress_causal(4)", seqlen_k: SEQLEN / 4, build: Box::new(|_| Ok((SparseMask::compress_causal(4), 0))) },
        Form {
            name: "dense(bool) of compress_causal(4)",
            seqlen_k: SEQLEN / 4,
            build: Box::new(move |dev| {
                let sk = SEQLEN / 4;
                let mut vis = vec![false; SEQLEN * sk];
                vis.par_chunks_mut(sk).enumerate().for_each(|(i, row)| row[..(i / 4 + 1).min(sk)].fill(true));
                Ok((SparseMask::dense(&Tensor::from_vec(vis, &shape(SEQLEN, sk), dev)?), (SEQLEN * sk) as u64))
            }),
        },
    ];
    let k = kept.clone();
    forms.push(Form {
        name: "block_bitset(128), 50 % random",
        seqlen_k: SEQLEN,
        build: Box::new(move |dev| Ok((SparseMask::block_bitset(&Tensor::from_vec(k.to_vec(), &shape(nq, nk), dev)?, BLOCK), (nq * nk) as u64))),
    });
    let k = kept.clone();
    forms.push(Form {
        name: "bcsr(128), 50 % random",
        seqlen_k: SEQLEN,
        build: Box::new(move |dev| {
            let (row_ptr, col_idx, nnz) = crate::data::bcsr(&k, 1, nq, nk);
            let bytes = 4 * (row_ptr.len() + col_idx.len()) as u64;
            let (rp, ci) = (Tensor::from_vec(row_ptr, &[1, 1, nq + 1], dev)?, Tensor::from_vec(col_idx, &[1, 1, nnz], dev)?);
            Ok((SparseMask::bcsr(&rp, &ci, BLOCK), bytes))
        }),
    });
    let k = kept.clone();
    forms.push(Form {
        name: "dense_blocks(bool, 128), 50 % random",
        seqlen_k: SEQLEN,
        build: Box::new(move |dev| {
            let t = Tensor::from_vec(dense_blocks(&k), &shape(SEQLEN, SEQLEN), dev)?;
            Ok((SparseMask::dense_blocks(&t, BLOCK), (SEQLEN * SEQLEN) as u64))
        }),
    });
    let k = kept.clone();
    forms.push(Form {
        name: "dense(bool), 50 % random 128-blocks",
        seqlen_k: SEQLEN,
        build: Box::new(move |dev| {
            let t = Tensor::from_vec(dense_blocks(&k), &shape(SEQLEN, SEQLEN), dev)?;
            Ok((SparseMask::dense(&t), (SEQLEN * SEQLEN) as u64))
        }),
    });
    forms.push(Form {
        name: "packed_bits, 50 % random 128-blocks",
        seqlen_k: SEQLEN,
        build: Box::new(move |dev| {
            // A 128-block is 16 whole bytes of a row: all ones or all zeros.
            let row_bytes = SEQLEN / 8;
            let mut bits = vec![0u8; SEQLEN * row_bytes];
            bits.par_chunks_mut(row_bytes).enumerate().for_each(|(i, row)| {
                let blocks = &kept[(i / BLOCK) * nk..][..nk];
                row.iter_mut().enumerate().for_each(|(b, x)| *x = if blocks[b * 8 / BLOCK] { 0xFF } else { 0 });
            });
            Ok((SparseMask::packed_bits(&Tensor::from_vec(bits, &shape(SEQLEN, row_bytes), dev)?), (SEQLEN * row_bytes) as u64))
        }),
    });
    forms
}

/// Every form's row, measured on `dev` (its tensors are freed before the next form's are made).
pub fn table(dev: &Device, stream: &Arc<CudaStream>) -> Vec<MaskMemory> {
    let timer = Timer { warmup: 1, reps: 5 };
    forms()
        .into_iter()
        .map(|f| {
            let mut row = MaskMemory {
                form: f.name.into(),
                batch: 1,
                heads: 1,
                seqlen_q: SEQLEN,
                seqlen_k: f.seqlen_k,
                input_bytes: 0,
                prepared_bytes: 0,
                dense_bool_bytes: (SEQLEN * f.seqlen_k) as u64,
                prepare_ms: None,
                note: String::new(),
            };
            let measured = (f.build)(dev).and_then(|(mask, input)| {
                row.input_bytes = input;
                let prepared = mask.prepare(SEQLEN, f.seqlen_k)?;
                row.prepared_bytes = prepared.memory_bytes() as u64;
                row.note = format!("estimated speedup {:.2}x", prepared.estimated_speedup()?);
                timer.median_ms(stream, |_| mask.prepare(SEQLEN, f.seqlen_k).map(drop))
            });
            match measured {
                Ok(ms) => row.prepare_ms = Some(ms),
                Err(e) => row.note = e.to_string(),
            }
            row
        })
        .collect()
}

/// One row as printed.
pub fn describe(m: &MaskMemory) -> String {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let prep = m.prepare_ms.map_or("—".to_string(), |ms| format!("{ms:.3} ms"));
    format!(
        "{:<40} q{} k{}: given {:>9.3} MiB, prepared {:>9.3} MiB, dense bool {:>9.3} MiB; prepare {prep}; {}",
        m.form,
        m.seqlen_q,
        m.seqlen_k,
        mib(m.input_bytes),
        mib(m.prepared_bytes),
        mib(m.dense_bool_bytes),
        m.note
    )
}
