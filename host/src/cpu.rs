//! The CPU backend: the f64 reference behind the same API, inputs and outputs in their dtypes.
use crate::attention::{Gradients, Saved};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::problem::{Dims, KvPages, PackedLayout, Problem};
use crate::seqlens::SeqLens;
use std::ops::Range;
use std::sync::Arc;
use crate::reference::{self, Operands};
use crate::sparse::{DenseMask, MaskData, Part, bcsr_to_bitset, check_block, check_part_shape, combine_planes, indices_keep};
use crate::tensor::{Tensor, checked_product};

fn operands(s: &Saved) -> Result<Operands> {
    let mask = match s.mask.as_ref().and_then(|m| m.data.as_ref()) {
        Some(MaskData::Cpu(d)) => Some(d.clone()),
        Some(MaskData::Cuda(_)) => unreachable!("a CUDA mask on a CPU call is rejected by validation"),
        None => None,
    };
    Ok(Operands {
        q: s.q.to_f64_vec()?,
        k: s.k.to_f64_vec()?,
        v: s.v.to_f64_vec()?,
        mask,
        bias: s.bias.as_ref().map(|b| b.to_f64_vec()).transpose()?,
    })
}

/// One part of a mask read on the host: its plane dims and whether it shows key `j` to query `i`
/// in plane `(b, h)` (plane indices already broadcast).
type HostPart = ([usize; 2], Box<dyn Fn(usize, usize, usize, usize) -> bool>);

/// Index `x` along a dimension of size `n`, read through broadcasting (size 1: always 0).
pub(crate) fn pick(n: usize, x: usize) -> usize {
    if n == 1 { 0 } else { x }
}

/// Values of a `[pb, ph, rows, cols]` tensor as flags, read through size-1 dims.
fn flags(t: &Tensor, shape: [usize; 4]) -> Result<impl Fn(usize, usize, usize, usize) -> bool + 'static> {
    let v: Vec<bool> = t.to_f64_vec()?.into_iter().map(|x| x != 0.0).collect();
    Ok(move |b: usize, h: usize, r: usize, c: usize| v[((pick(shape[0], b) * shape[1] + pick(shape[1], h)) * shape[2] + pick(shape[2], r)) * shape[3] + pick(shape[3], c)])
}

fn host_part(part: &Part, sq: usize, sk: usize) -> Result<HostPart> {
    use crate::dtype::DType::{Bool, U8};
    Ok(match part {
        Part::Dense(t) => {
            let s = check_part_shape(t, "mask", Bool, sq, sk, [true, true])?;
            let f = flags(t, s)?;
            ([s[0], s[1]], Box::new(move |b, h, i, j| f(b, h, i, j)))
        }
        Part::Packed(t) => {
            let s = check_part_shape(t, "packed_bits", U8, sq, sk.div_ceil(8), [true, false])?;
            let bytes = t.to_f64_vec()?;
            let f = move |b: usize, h: usize, i: usize, j: usize| {
                let byte = bytes[((pick(s[0], b) * s[1] + pick(s[1], h)) * s[2] + pick(s[2], i)) * s[3] + j / 8] as u8;
                byte >> (j % 8) & 1 != 0
            };
            ([s[0], s[1]], Box::new(f))
        }
        Part::Bitset { kept, block } => {
            check_block(*block)?;
            let s = check_part_shape(kept, "block_bitset", Bool, sq.div_ceil(*block), sk.div_ceil(*block), [false, false])?;
            let (f, block) = (flags(kept, s)?, *block);
            ([s[0], s[1]], Box::new(move |b, h, i, j| f(b, h, i / block, j / block)))
        }
        Part::Bcsr { row_ptr, col_idx, block } => {
            let (planes, kept) = bcsr_to_bitset(row_ptr, col_idx, *block, sq, sk)?;
            let (block, qb, kb) = (*block, sq.div_ceil(*block), sk.div_ceil(*block));
            let f = move |b: usize, h: usize, i: usize, j: usize| kept[((pick(planes[0], b) * planes[1] + pick(planes[1], h)) * qb + i / block) * kb + j / block] != 0;
            (planes, Box::new(f))
        }
        Part::Indices(t) => {
            let (s, keep) = indices_keep(t, sq, sk)?;
            let f = move |b: usize, h: usize, i: usize, j: usize| keep[((pick(s[0], b) * s[1] + pick(s[1], h)) * s[2] + pick(s[2], i)) * sk + j];
            ([s[0], s[1]], Box::new(f))
        }
        Part::DenseBlocks { mask, block } => {
            check_block(*block)?;
            let s = check_part_shape(mask, "mask", Bool, sq, sk, [true, true])?;
            let (f, block) = (flags(mask, s)?, *block);
            let (qb, kb) = (sq.div_ceil(block), sk.div_ceil(block));
            let mut kept = vec![false; s[0] * s[1] * qb * kb];
            for (b, h) in (0..s[0]).flat_map(|b| (0..s[1]).map(move |h| (b, h))) {
                for i in 0..sq {
                    for j in 0..sk {
                        if f(b, h, i, j) {
                            kept[((b * s[1] + h) * qb + i / block) * kb + j / block] = true;
                        }
                    }
                }
            }
            let f = move |b: usize, h: usize, i: usize, j: usize| kept[((pick(s[0], b) * s[1] + pick(s[1], h)) * qb + i / block) * kb + j / block];
            ([s[0], s[1]], Box::new(f))
        }
    })
}

/// The CPU's prepared mask: every part read on the host and ANDed into one dense mask.
pub(crate) fn prepare(parts: &[Part], sq: usize, sk: usize) -> Result<DenseMask> {
    // The lengths are the caller's: the dense mask, at most the parts' largest plane dims, is
    // reserved before any part is read (the tables a part builds are no larger), so that one past
    // usize or the host's memory is a typed error, not an overflow panic or an aborted allocation.
    let most = parts.iter().filter_map(|p| p.tensors()[0].1.shape().get(..2).map(|s| [s[0], s[1]])).fold([1, 1], |m, s| [m[0].max(s[0]), m[1].max(s[1])]);
    let mut keep = Vec::new();
    match checked_product(&[most[0], most[1], sq, sk]) {
        Some(n) if keep.try_reserve_exact(n).is_ok() => {}
        _ => {
            let reason = format!("a dense mask of {sq} x {sk} scores per plane ({} x {} planes) is too large for host memory", most[0], most[1]);
            return Err(Error::Param { arg: "seqlen", reason });
        }
    }
    let parts = parts.iter().map(|p| Ok((p.tensors()[0].0, host_part(p, sq, sk)?))).collect::<Result<Vec<_>>>()?;
    let planes = combine_planes(parts.iter().map(|(arg, (planes, _))| (*arg, *planes)))?;
    keep.resize(planes[0] * planes[1] * sq * sk, true);
    for (b, h) in (0..planes[0]).flat_map(|b| (0..planes[1]).map(move |h| (b, h))) {
        for i in 0..sq {
            for j in 0..sk {
                let at = ((b * planes[1] + h) * sq + i) * sk + j;
                keep[at] = parts.iter().all(|(_, (p, f))| f(if p[0] == 1 { 0 } else { b }, if p[1] == 1 { 0 } else { h }, i, j));
            }
        }
    }
    Ok(DenseMask { planes, keep })
}

/// A mask prepared per sequence (`[pb, ph, sq, sk]` with `sq` and `sk` at least the longest
/// lengths, sequence `b` in plane `b`, or all in plane 0 where `pb` is 1) as a packed batch's
/// query-based flags `[total_q, ph, max_k]` (planes `[1, ph]`), which [`sequence_operands`] cuts
/// per sequence.
pub(crate) fn to_sequences(m: &DenseMask, seqs: &SeqLens, sq: usize, sk: usize) -> DenseMask {
    let ([pb, ph], max_k) = (m.planes, seqs.max_seqlen_k());
    let mut keep = vec![false; seqs.total_q() * ph * max_k];
    for b in 0..seqs.batch() {
        for (i, row) in seqs.rows(b).0.enumerate() {
            for h in 0..ph {
                let from = ((pick(pb, b) * ph + h) * sq + i) * sk;
                keep[(row * ph + h) * max_k..][..max_k].copy_from_slice(&m.keep[from..][..max_k]);
            }
        }
    }
    DenseMask { planes: [1, ph], keep }
}

/// The dtype LSE is reported in: f64 for f64 inputs, f32 otherwise.
pub(crate) fn lse_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 { DType::F64 } else { DType::F32 }
}

fn tensor(values: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::from_fn(shape, dtype, &Device::Cpu, |i| values[i])
}

pub(crate) fn forward(p: &Problem, s: &Saved) -> Result<(Tensor, Tensor)> {
    let mut ops = operands(s)?;
    if let (Some(pages), Some(seqs)) = (&p.pages, &p.seqs) {
        let width = p.dims.kv_heads * p.dims.head_dim;
        ops.k = unpaged(&ops.k, pages, seqs, width);
        ops.v = unpaged(&ops.v, pages, seqs, width);
    }
    let (out, lse) = match &p.seqs {
        None => reference::forward(p, &ops),
        Some(seqs) => packed_forward(p, seqs, &ops),
    };
    Ok((tensor(&out, s.q.shape(), p.dtype)?, tensor(&lse, &lse_shape(p), lse_dtype(p.dtype))?))
}

/// Paged K or V `[num_pages, page_size, kv_heads, head_dim]` (rows of `width` values) as the
/// packed `[total_k, kv_heads, head_dim]` its block table describes.
fn unpaged(pages: &[f64], kv: &KvPages, seqs: &SeqLens, width: usize) -> Vec<f64> {
    let mut rows = Vec::with_capacity(seqs.total_k() * width);
    for b in 0..seqs.batch() {
        for j in 0..seqs.rows(b).1.len() {
            let page = kv.table.page(b, j / kv.page_size).expect("a validated table");
            let row = page as usize * kv.page_size + j % kv.page_size;
            rows.extend_from_slice(&pages[row * width..][..width]);
        }
    }
    rows
}

/// A packed batch's sequences, each as a fixed-length call of batch 1: `(problem, query rows,
/// key rows)` for every sequence with queries.
fn sequences(p: &Problem, seqs: &SeqLens) -> impl Iterator<Item = (Problem, Range<usize>, Range<usize>)> {
    (0..seqs.batch()).map(|b| seqs.rows(b)).filter(|(q, _)| !q.is_empty()).map(|(q, k)| {
        let dims = Dims { batch: 1, seqlen_q: q.len(), seqlen_k: k.len(), ..p.dims };
        let rows = if p.packed_bias == Some(PackedLayout::PerQuery) { q.len() } else { 1 };
        let bias = p.bias.map(|[_, heads, _, _]| [1, heads, rows, k.len()]);
        (Problem { dims, bias, seqs: None, packed_bias: None, packed_mask: None, pages: None, ..p.clone() }, q, k)
    })
}

/// `rows` of a `[total, heads, head_dim]` operand with rows of `width` values.
fn rows_of(v: &[f64], rows: &Range<usize>, width: usize) -> Vec<f64> {
    v[rows.start * width..rows.end * width].to_vec()
}

/// Where sequence `(q, k)`'s value of (head `h`, query `i`, key `j`) is in a packed bias or mask
/// of layout `layout` with `heads` heads (`PackedLayout`; a query-based one is `max_k` keys wide).
fn packed_index(layout: PackedLayout, heads: usize, max_k: usize, q: &Range<usize>, k: &Range<usize>, h: usize, i: usize, j: usize) -> usize {
    match layout {
        PackedLayout::PerQuery => ((q.start + i) * heads + h) * max_k + j,
        PackedLayout::KeySide => (k.start + j) * heads + h,
    }
}

/// [`packed_index`] of `p`'s bias.
fn bias_index(p: &Problem, q: &Range<usize>, k: &Range<usize>, h: usize, i: usize, j: usize) -> usize {
    let [_, heads, _, max_k] = p.bias.expect("a bias");
    packed_index(p.packed_bias.expect("a packed bias"), heads, max_k, q, k, h, i, j)
}

/// The (head, query, key) cells of a `[heads, rows, keys]` operand, in its element order.
fn cells([heads, rows, keys]: [usize; 3]) -> impl Iterator<Item = (usize, usize, usize)> {
    (0..heads).flat_map(move |h| (0..rows).flat_map(move |i| (0..keys).map(move |j| (h, i, j))))
}

/// The [`cells`] of a sequence's bias (`sp`'s `[1, heads, {1|sq}, sk]`); none without a bias.
fn bias_cells(sp: &Problem) -> impl Iterator<Item = (usize, usize, usize)> {
    let [_, heads, rows, sk] = sp.bias.unwrap_or([0; 4]);
    cells([heads, rows, sk])
}

/// Sequence `(q, k)` of packed batch `p` (`sp`, from [`sequences`]): its operands, its bias as
/// `sp`'s.
fn sequence_operands(p: &Problem, sp: &Problem, ops: &Operands, q: &Range<usize>, k: &Range<usize>) -> Operands {
    let d = &p.dims;
    let (q_width, k_width) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    let bias = ops.bias.as_ref().map(|b| bias_cells(sp).map(|(h, i, j)| b[bias_index(p, q, k, h, i, j)]).collect());
    // The mask's flags (`PreparedMask::packed`) as the sequence's dense `[1, heads, sq, sk]`.
    let mask = ops.mask.as_ref().zip(p.packed_mask).map(|(m, layout)| {
        let (heads, max_k) = (m.planes[1], p.seqs.as_ref().map_or(0, |s| s.max_seqlen_k()));
        let keep = cells([heads, q.len(), k.len()]).map(|(h, i, j)| m.keep[packed_index(layout, heads, max_k, q, k, h, i, j)]).collect();
        Arc::new(DenseMask { planes: m.planes, keep })
    });
    Operands { q: rows_of(&ops.q, q, q_width), k: rows_of(&ops.k, k, k_width), v: rows_of(&ops.v, k, k_width), mask, bias }
}

/// The reference forward of a packed batch: O `[total_q, h, d]`, LSE `[h, total_q]`.
fn packed_forward(p: &Problem, seqs: &SeqLens, ops: &Operands) -> (Vec<f64>, Vec<f64>) {
    let d = p.dims;
    let (q_width, total) = (d.heads * d.head_dim, seqs.total_q());
    let mut out = vec![0.0; total * q_width];
    let mut lse = vec![f64::NEG_INFINITY; d.heads * total];
    for (sp, q, k) in sequences(p, seqs) {
        let (o, l) = reference::forward(&sp, &sequence_operands(p, &sp, ops, &q, &k));
        out[q.start * q_width..q.end * q_width].copy_from_slice(&o);
        for h in 0..d.heads {
            lse[h * total + q.start..][..q.len()].copy_from_slice(&l[h * q.len()..][..q.len()]);
        }
    }
    (out, lse)
}

/// The reference backward of a packed batch: each sequence's dQ, dK and dV rows, and the bias's
/// gradient in its layout (zero where no query reads it).
type PackedGrads = (Vec<f64>, Vec<f64>, Vec<f64>, Option<Vec<f64>>);
fn packed_backward(p: &Problem, seqs: &SeqLens, ops: &Operands, out: &[f64], lse: &[f64], dout: &[f64]) -> PackedGrads {
    let d = p.dims;
    let (q_width, k_width, total) = (d.heads * d.head_dim, d.kv_heads * d.head_dim, seqs.total_q());
    let (mut dq, mut dk, mut dv) = (vec![0.0; ops.q.len()], vec![0.0; ops.k.len()], vec![0.0; ops.v.len()]);
    let mut dbias = ops.bias.as_ref().map(|b| vec![0.0; b.len()]);
    for (sp, q, k) in sequences(p, seqs) {
        let seq_ops = sequence_operands(p, &sp, ops, &q, &k);
        let seq_lse: Vec<f64> = (0..d.heads).flat_map(|h| lse[h * total + q.start..][..q.len()].iter().copied()).collect();
        let (sq, sk, sv, sb) = reference::backward(&sp, &seq_ops, &rows_of(out, &q, q_width), &seq_lse, &rows_of(dout, &q, q_width));
        dq[q.start * q_width..q.end * q_width].copy_from_slice(&sq);
        dk[k.start * k_width..k.end * k_width].copy_from_slice(&sk);
        dv[k.start * k_width..k.end * k_width].copy_from_slice(&sv);
        if let (Some(db), Some(sb)) = (&mut dbias, sb) {
            for ((h, i, j), g) in bias_cells(&sp).zip(sb) {
                db[bias_index(p, &q, &k, h, i, j)] = g;
            }
        }
    }
    (dq, dk, dv, dbias)
}

/// LSE's shape: `[batch, heads, seqlen_q]`, or `[heads, total_q]` for a packed batch.
pub(crate) fn lse_shape(p: &Problem) -> Vec<usize> {
    match &p.seqs {
        None => vec![p.dims.batch, p.dims.heads, p.dims.seqlen_q],
        Some(s) => vec![p.dims.heads, s.total_q()],
    }
}

pub(crate) fn backward(p: &Problem, s: &Saved, out: &Tensor, lse: &Tensor, dout: &Tensor) -> Result<Gradients> {
    let (ops, out, lse, dout) = (operands(s)?, out.to_f64_vec()?, lse.to_f64_vec()?, dout.to_f64_vec()?);
    let (dq, dk, dv, dbias) = match &p.seqs {
        None => reference::backward(p, &ops, &out, &lse, &dout),
        Some(seqs) => packed_backward(p, seqs, &ops, &out, &lse, &dout),
    };
    Ok(Gradients {
        dq: tensor(&dq, s.q.shape(), p.dtype)?,
        dk: tensor(&dk, s.k.shape(), p.dtype)?,
        dv: tensor(&dv, s.v.shape(), p.dtype)?,
        dbias: match (dbias, &s.bias) {
            (Some(db), Some(b)) => Some(tensor(&db, b.shape(), b.dtype())?),
            _ => None,
        },
    })
}
