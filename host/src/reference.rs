//! The CPU reference: attention forward and backward with f64 accumulation and the full
//! semantics (GQA/MQA, broadcast mask and bias, bottom-right causal, scale, softcap). It is both
//! the CPU backend and the ground truth the GPU kernels are tested against.
//!
//! Scores: `s = softcap(scale * q·k) + bias`, where `softcap(x) = c * tanh(x / c)` (identity for
//! c = 0); key `j` is visible to query `i` iff the mask is true there and the band shows it
//! (`sparse::band_visible`; causal is `j <= i + seqlen_k - seqlen_q`). A row with no visible key gets O = 0 and LSE = -inf, and zero
//! gradients.
use crate::problem::{Dims, Problem};
use crate::sparse::band_visible;
use rayon::prelude::*;

/// Row-major, contiguous operands in f64, in their logical shapes.
pub(crate) struct Operands {
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    /// The prepared mask's dense equivalent `[pb, ph, sq, sk]` (the band is the problem's).
    pub mask: Option<std::sync::Arc<crate::sparse::DenseMask>>,
    pub bias: Option<Vec<f64>>,
}

/// Index into a `[{1|b}, {1|hk|h}, {1|sq}, {1|sk}]` broadcast operand.
fn broadcast_index(shape: &[usize; 4], d: &Dims, b: usize, h: usize, i: usize, j: usize) -> usize {
    let pick = |n: usize, v: usize| if n == 1 { 0 } else { v };
    let hh = d.broadcast_head(shape[1], h);
    ((pick(shape[0], b) * shape[1] + hh) * shape[2] + pick(shape[2], i)) * shape[3] + pick(shape[3], j)
}

/// One query row's scores: `(raw = scale * q·k, capped, logit)` per key, `None` where hidden.
fn row_scores(p: &Problem, ops: &Operands, b: usize, h: usize, i: usize) -> Vec<Option<(f64, f64, f64)>> {
    let d = &p.dims;
    let kvh = h / d.kv_group();
    let q = &ops.q[((b * d.seqlen_q + i) * d.heads + h) * d.head_dim..][..d.head_dim];
    (0..d.seqlen_k)
        .map(|j| {
            if !band_visible(&p.band, d.seqlen_q, d.seqlen_k, i, j) {
                return None;
            }
            if let Some(mask) = &ops.mask {
                let [pb, ph] = mask.planes;
                let at = broadcast_index(&[pb, ph, d.seqlen_q, d.seqlen_k], d, b, h, i, j);
                if !mask.keep[at] {
                    return None;
                }
            }
            let k = &ops.k[((b * d.seqlen_k + j) * d.kv_heads + kvh) * d.head_dim..][..d.head_dim];
            let raw = p.scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>();
            let capped = if p.softcap > 0.0 { p.softcap * (raw / p.softcap).tanh() } else { raw };
            let bias = match (&p.bias, &ops.bias) {
                (Some(shape), Some(bias)) => bias[broadcast_index(shape, d, b, h, i, j)],
                _ => 0.0,
            };
            Some((raw, capped, capped + bias))
        })
        .collect()
}

/// Probabilities of one row from its scores and LSE (0 where hidden or the row is empty).
fn probabilities(scores: &[Option<(f64, f64, f64)>], lse: f64) -> Vec<f64> {
    scores
        .iter()
        .map(|s| match s {
            Some((_, _, logit)) if lse > f64::NEG_INFINITY => (logit - lse).exp(),
            _ => 0.0,
        })
        .collect()
}

/// O `[b, sq, h, d]` and LSE `[b, h, sq]`.
pub(crate) fn forward(p: &Problem, ops: &Operands) -> (Vec<f64>, Vec<f64>) {
    let d = p.dims;
    let rows: Vec<(Vec<f64>, f64)> = (0..d.batch * d.heads * d.seqlen_q)
        .into_par_iter()
        .map(|r| {
            let (b, h, i) = (r / (d.heads * d.seqlen_q), (r / d.seqlen_q) % d.heads, r % d.seqlen_q);
            let scores = row_scores(p, ops, b, h, i);
            let max = scores.iter().flatten().map(|s| s.2).fold(f64::NEG_INFINITY, f64::max);
            let lse = if max == f64::NEG_INFINITY {
                max
            } else {
                max + scores.iter().flatten().map(|s| (s.2 - max).exp()).sum::<f64>().ln()
            };
            let kvh = h / d.kv_group();
            let mut o = vec![0.0; d.head_dim];
            for (j, pj) in probabilities(&scores, lse).into_iter().enumerate() {
                if pj != 0.0 {
                    let v = &ops.v[((b * d.seqlen_k + j) * d.kv_heads + kvh) * d.head_dim..][..d.head_dim];
                    o.iter_mut().zip(v).for_each(|(o, v)| *o += pj * v);
                }
            }
            (o, lse)
        })
        .collect();
    let mut out = vec![0.0; d.batch * d.seqlen_q * d.heads * d.head_dim];
    let mut lse = vec![0.0; d.batch * d.heads * d.seqlen_q];
    for (r, (o, l)) in rows.into_iter().enumerate() {
        let (b, h, i) = (r / (d.heads * d.seqlen_q), (r / d.seqlen_q) % d.heads, r % d.seqlen_q);
        out[((b * d.seqlen_q + i) * d.heads + h) * d.head_dim..][..d.head_dim].copy_from_slice(&o);
        lse[r] = l;
    }
    (out, lse)
}

/// Gradients of one kv group (batch `b`, kv head `kvh`): dq rows of its query heads, its dk/dv
/// rows, and a dbias contribution (bias-shaped).
struct GroupGrads {
    dq: Vec<(usize, Vec<f64>)>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dbias: Option<Vec<f64>>,
}

/// dQ, dK, dV (shapes of q, k, v) and dBias (shape of the bias, summed over its broadcast
/// dimensions), given the forward's O and LSE and the output gradient dO.
pub(crate) fn backward(
    p: &Problem,
    ops: &Operands,
    out: &[f64],
    lse: &[f64],
    dout: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Option<Vec<f64>>) {
    let d = p.dims;
    let hd = d.head_dim;
    let bias_len = p.bias.map(|s| s.iter().product::<usize>());
    let groups: Vec<GroupGrads> = (0..d.batch * d.kv_heads)
        .into_par_iter()
        .map(|g| {
            let (b, kvh) = (g / d.kv_heads, g % d.kv_heads);
            let mut gg = GroupGrads {
                dq: Vec::new(),
                dk: vec![0.0; d.seqlen_k * hd],
                dv: vec![0.0; d.seqlen_k * hd],
                dbias: bias_len.map(|n| vec![0.0; n]),
            };
            for h in kvh * d.kv_group()..(kvh + 1) * d.kv_group() {
                for i in 0..d.seqlen_q {
                    let row = ((b * d.seqlen_q + i) * d.heads + h) * hd;
                    let (o, dout) = (&out[row..][..hd], &dout[row..][..hd]);
                    let q = &ops.q[row..][..hd];
                    let scores = row_scores(p, ops, b, h, i);
                    let probs = probabilities(&scores, lse[(b * d.heads + h) * d.seqlen_q + i]);
                    let delta: f64 = o.iter().zip(dout).map(|(a, b)| a * b).sum();
                    let mut dq = vec![0.0; hd];
                    for (j, (s, pj)) in scores.iter().zip(probs).enumerate() {
                        let Some((_, capped, _)) = s else { continue };
                        let kv = ((b * d.seqlen_k + j) * d.kv_heads + kvh) * hd;
                        let (k, v) = (&ops.k[kv..][..hd], &ops.v[kv..][..hd]);
                        let dp: f64 = dout.iter().zip(v).map(|(a, b)| a * b).sum();
                        let ds = pj * (dp - delta);
                        gg.dv[j * hd..][..hd].iter_mut().zip(dout).for_each(|(a, g)| *a += pj * g);
                        if let (Some(shape), Some(db)) = (&p.bias, &mut gg.dbias) {
                            db[broadcast_index(shape, &d, b, h, i, j)] += ds;
                        }
                        let dcap = if p.softcap > 0.0 { 1.0 - (capped / p.softcap).powi(2) } else { 1.0 };
                        let draw = ds * dcap * p.scale;
                        dq.iter_mut().zip(k).for_each(|(a, k)| *a += draw * k);
                        gg.dk[j * hd..][..hd].iter_mut().zip(q).for_each(|(a, q)| *a += draw * q);
                    }
                    gg.dq.push((row, dq));
                }
            }
            gg
        })
        .collect();

    let mut dq = vec![0.0; ops.q.len()];
    let mut dk = vec![0.0; ops.k.len()];
    let mut dv = vec![0.0; ops.v.len()];
    let mut dbias = bias_len.map(|n| vec![0.0; n]);
    for (g, gg) in groups.into_iter().enumerate() {
        let (b, kvh) = (g / d.kv_heads, g % d.kv_heads);
        for (row, v) in gg.dq {
            dq[row..row + hd].copy_from_slice(&v);
        }
        for j in 0..d.seqlen_k {
            let at = ((b * d.seqlen_k + j) * d.kv_heads + kvh) * hd;
            dk[at..at + hd].copy_from_slice(&gg.dk[j * hd..][..hd]);
            dv[at..at + hd].copy_from_slice(&gg.dv[j * hd..][..hd]);
        }
        if let (Some(total), Some(part)) = (&mut dbias, gg.dbias) {
            total.iter_mut().zip(part).for_each(|(a, b)| *a += b);
        }
    }
    (dq, dk, dv, dbias)
}
