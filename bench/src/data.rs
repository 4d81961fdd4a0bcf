//! Operands of a case, drawn as SCHEMA.md says: N(0, 1) data, Flash-DMA's top-k mask or random
//! blocks, generated in parallel on the host and copied to the GPU once.
use dmattn::{Device, Tensor};
use dmattn_bench::cases::{Case, Mask};
use half::bf16;
use rand::{Rng, SeedableRng, rngs::StdRng};
use rand_distr::StandardNormal;
use rayon::prelude::*;

/// Score tiles of this size are the unit a block-sparse kernel skips or computes.
const TILE: usize = 64;

/// `n` N(0, 1) values, deterministic in `seed`, filled in parallel chunks.
fn normals(n: usize, seed: u64) -> Vec<f32> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![0f32; n];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, chunk)| {
        let mut rng = StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        chunk.iter_mut().for_each(|x| *x = rng.sample(StandardNormal));
    });
    out
}

fn bf16_tensor(values: &[f32], shape: &[usize], dev: &Device) -> dmattn::Result<Tensor> {
    let data: Vec<bf16> = values.par_iter().map(|&x| bf16::from_f32(x)).collect();
    Tensor::from_vec(data, shape, dev)
}

/// Visibility `[batch, mask_heads, sq, sk]` of `mask`, given the bias (or another N(0,1)
/// score) it ranks for top-k.
fn visibility(c: &Case, mask: Mask, scores: &[f32], rng: &mut StdRng) -> Vec<bool> {
    let (sq, sk) = (c.seqlen_q, c.seqlen_k);
    let mut vis = vec![false; c.batch * c.mask_heads * sq * sk];
    match mask {
        Mask::Topk { keep } => vis.par_chunks_mut(sk).zip(scores.par_chunks(sk)).for_each(|(row, s)| {
            if keep >= sk {
                row.fill(true);
                return;
            }
            // Exactly `keep` keys, ties broken by position (bf16 scores tie often).
            let mut idx: Vec<u32> = (0..sk as u32).collect();
            idx.select_nth_unstable_by(keep, |&a, &b| s[b as usize].total_cmp(&s[a as usize]));
            idx[..keep].iter().for_each(|&j| row[j as usize] = true);
        }),
        Mask::Blocks { block, density } => {
            let (nq, nk) = (sq.div_ceil(block), sk.div_ceil(block));
            let keep: Vec<bool> = (0..c.batch * c.mask_heads * nq * nk).map(|_| rng.random_bool(density)).collect();
            vis.par_chunks_mut(sk).enumerate().for_each(|(r, row)| {
                let (bh, i) = (r / sq, r % sq);
                let blocks = &keep[(bh * nq + i / block) * nk..][..nk];
                row.iter_mut().enumerate().for_each(|(j, v)| *v = blocks[j / block]);
            });
        }
    }
    vis
}

/// The share of `TILE`×`TILE` score tiles holding at least one score visible under the mask
/// and causal masking: what a block-sparse kernel must compute.
fn computed_fraction(c: &Case, vis: Option<&[bool]>) -> f64 {
    let (sq, sk) = (c.seqlen_q, c.seqlen_k);
    if vis.is_none() && !c.causal {
        return 1.0;
    }
    let (nq, nk) = (sq.div_ceil(TILE), sk.div_ceil(TILE));
    let planes = if vis.is_some() { c.batch * c.mask_heads } else { 1 };
    let live: usize = (0..planes * nq)
        .into_par_iter()
        .map(|t| {
            let (plane, ti) = (t / nq, t % nq);
            let mut any = vec![false; nk];
            for i in ti * TILE..((ti + 1) * TILE).min(sq) {
                // Causal: keys past i + sk - sq are hidden.
                let end = if c.causal { (i + sk).saturating_sub(sq - 1).min(sk) } else { sk };
                match vis {
                    Some(v) => v[(plane * sq + i) * sk..][..end].iter().enumerate().for_each(|(j, &x)| any[j / TILE] |= x),
                    None => any[..end.div_ceil(TILE)].fill(true),
                }
            }
            any.iter().filter(|&&x| x).count()
        })
        .sum();
    live as f64 / (planes * nq * nk) as f64
}

/// Everything one case runs on: `sets` rotated copies of q, k, v (and dout), one mask and bias
/// shared by all sets (they are the large operands).
pub struct Operands {
    pub q: Vec<Tensor>,
    pub k: Vec<Tensor>,
    pub v: Vec<Tensor>,
    pub dout: Vec<Tensor>,
    pub mask: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub computed_fraction: f64,
}

/// Enough operand sets that they do not all sit in L2 (256 MiB of q, k, v; 1 to 4 sets).
fn set_count(c: &Case) -> usize {
    let bytes = 2 * c.head_dim * c.batch * (c.seqlen_q * c.heads + 2 * c.seqlen_k * c.kv_heads);
    (256usize << 20).div_ceil(bytes).clamp(1, 4)
}

impl Operands {
    pub fn new(c: &Case, dev: &Device, rng: &mut StdRng) -> dmattn::Result<Operands> {
        let (b, sq, sk, d) = (c.batch, c.seqlen_q, c.seqlen_k, c.head_dim);
        let mut draw = |shape: &[usize]| bf16_tensor(&normals(shape.iter().product(), rng.random()), shape, dev);
        let (q_shape, kv_shape) = ([b, sq, c.heads, d], [b, sk, c.kv_heads, d]);
        let sets = set_count(c);
        let mut o = Operands { q: vec![], k: vec![], v: vec![], dout: vec![], mask: None, bias: None, computed_fraction: 1.0 };
        for _ in 0..sets {
            o.q.push(draw(&q_shape)?);
            o.k.push(draw(&kv_shape)?);
            o.v.push(draw(&kv_shape)?);
            if c.backward {
                o.dout.push(draw(&q_shape)?);
            }
        }
        let score_shape = [b, c.mask_heads, sq, sk];
        let scores = (c.bias || matches!(c.mask, Some(Mask::Topk { .. }))).then(|| normals(score_shape.iter().product(), rng.random()));
        let vis = c.mask.map(|m| visibility(c, m, scores.as_deref().unwrap_or(&[]), rng));
        o.computed_fraction = computed_fraction(c, vis.as_deref());
        if let Some(vis) = vis {
            o.mask = Some(Tensor::from_vec(vis, &score_shape, dev)?);
        }
        if c.bias {
            // The top-k mask ranks the bias itself, as Flash-DMA's dynamic mask does.
            o.bias = Some(bf16_tensor(scores.as_deref().unwrap(), &score_shape, dev)?);
        }
        Ok(o)
    }

    pub fn sets(&self) -> usize {
        self.q.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmattn_bench::cases::grid;

    fn small(mask: Option<Mask>, causal: bool) -> Case {
        let mut c = grid(true, &["dma-train".into()])[0].clone();
        (c.seqlen_q, c.seqlen_k, c.mask, c.causal) = (200, 300, mask, causal);
        c
    }

    #[test]
    fn topk_keeps_exactly_keep_keys_of_largest_score() {
        let c = small(Some(Mask::Topk { keep: 7 }), false);
        let s = normals(c.seqlen_q * c.seqlen_k, 1);
        let vis = visibility(&c, c.mask.unwrap(), &s, &mut StdRng::seed_from_u64(0));
        for (row, sr) in vis.chunks(c.seqlen_k).zip(s.chunks(c.seqlen_k)) {
            assert_eq!(row.iter().filter(|&&x| x).count(), 7);
            let min_kept = sr.iter().zip(row).filter(|(_, v)| **v).map(|(x, _)| *x).fold(f32::INFINITY, f32::min);
            assert!(sr.iter().zip(row).all(|(x, v)| *v || *x <= min_kept));
        }
    }

    #[test]
    fn computed_fraction_counts_live_tiles() {
        assert_eq!(computed_fraction(&small(None, false), None), 1.0);
        // 4 x 5 tiles (200 rows, 300 keys); bottom-right causal lets row i see keys up to
        // i + 100: tile rows see 3, 4, 5 and 5 key tiles.
        let f = computed_fraction(&small(None, true), None);
        assert_eq!(f, 17.0 / 20.0);
        // 128-blocks over 1024 x 1024: each block is four whole tiles.
        let mut c = small(Some(Mask::Blocks { block: 128, density: 0.5 }), false);
        (c.seqlen_q, c.seqlen_k) = (1024, 1024);
        let vis = visibility(&c, c.mask.unwrap(), &[], &mut StdRng::seed_from_u64(3));
        let visible_blocks = (0..64).filter(|b| vis[(b / 8) * 128 * 1024 + (b % 8) * 128]).count();
        assert!(visible_blocks > 0 && visible_blocks < 64);
        assert_eq!(computed_fraction(&c, Some(&vis)), visible_blocks as f64 / 64.0);
    }
}
