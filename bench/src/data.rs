//! Operands of a case, drawn as SCHEMA.md says: N(0, 1) data, Flash-DMA's top-k masks (per query
//! row, or key-side and query-broadcast, or a packed batch's key-side share of each sequence's
//! keys), random blocks or the sparse group's masks (a `SparseMask`, prepared once), generated in
//! parallel on the host and copied to the GPU once.
use dmattn::{Device, PageTable, PreparedMask, SeqLens, SparseMask, Tensor};
use dmattn_bench::cases::{Case, Mask, PageLayout, block_pattern, index_lists, key_fraction_scores, key_scores, normal_quantile, page_table, top_fraction_keys, top_keys};
use half::bf16;
use rand::{Rng, SeedableRng, rngs::StdRng};
use rand_distr::StandardNormal;
use rayon::prelude::*;

/// Score tiles of this size are the unit a block-sparse kernel skips or computes.
const TILE: usize = 64;

/// `n` N(0, 1) values, deterministic in `seed`, filled in parallel chunks.
fn normals(n: usize, seed: u64) -> Vec<f32> {
    normals_as(n, seed, |x| x)
}

/// [`normals`] stored as `f` makes them (straight to bf16 where f32 copies of 2^31 values would
/// not fit the host).
pub(crate) fn normals_as<T: Copy + Default + Send>(n: usize, seed: u64, f: impl Fn(f32) -> T + Sync) -> Vec<T> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![T::default(); n];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, chunk)| {
        let mut rng = StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        chunk.iter_mut().for_each(|x| *x = f(rng.sample(StandardNormal)));
    });
    out
}

fn bf16_tensor(values: &[f32], shape: &[usize], dev: &Device) -> dmattn::Result<Tensor> {
    let data: Vec<bf16> = values.par_iter().map(|&x| bf16::from_f32(x)).collect();
    Tensor::from_vec(data, shape, dev)
}

/// The packed rows of k or v (`[total_k, kv_heads, head_dim]`, `width` values a row; sequence
/// `b` has `lens_k[b]` of them) as bf16 pages `[num_pages, page_size, kv_heads, head_dim]` laid
/// out as `pages` says ([`page_table`]); the page rows past a sequence's last key are zero.
fn paged_rows(rows: &[f32], width: usize, lens_k: &[usize], pages: &PageLayout) -> Vec<bf16> {
    let ps = pages.page_size;
    // Each page's source: the first packed row it holds and how many.
    let mut source = vec![(0usize, 0usize); pages.num_pages];
    let mut start = 0;
    for (b, &len) in lens_k.iter().enumerate() {
        for i in 0..len.div_ceil(ps) {
            source[pages.table[b * pages.max_pages + i] as usize] = (start + i * ps, ps.min(len - i * ps));
        }
        start += len;
    }
    let mut out = vec![bf16::ZERO; pages.num_pages * ps * width];
    out.par_chunks_mut(ps * width).zip(source.par_iter()).for_each(|(page, &(first, n))| {
        page[..n * width].iter_mut().zip(&rows[first * width..][..n * width]).for_each(|(x, &y)| *x = bf16::from_f32(y));
    });
    out
}

/// Visibility `[batch, mask_heads, sq, sk]` of a mask given densely (`topk`, `blocks`,
/// `compress_dense`), given the bias (or another N(0,1) score) it ranks for top-k; `None` for the
/// sparse forms, which have no dense tensor.
fn visibility(c: &Case, mask: Mask, scores: &[f32]) -> Option<Vec<bool>> {
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
            let keep = block_pattern(c, block, density);
            vis.par_chunks_mut(sk).enumerate().for_each(|(r, row)| {
                let (bh, i) = (r / sq, r % sq);
                let blocks = &keep[(bh * nq + i / block) * nk..][..nk];
                row.iter_mut().enumerate().for_each(|(j, v)| *v = blocks[j / block]);
            });
        }
        // The band of every row (`Case::row_keys` reads the compression factor).
        Mask::CompressDense { .. } => vis.par_chunks_mut(sk).enumerate().for_each(|(r, row)| row[c.row_keys(r % sq)].fill(true)),
        Mask::Window { .. } | Mask::Compress { .. } | Mask::Bcsr { .. } | Mask::Bitset { .. } => return None,
        // The listed keys of every row (its own causal range: see `index_lists`).
        Mask::IndexLists { keep, layout, .. } => {
            let lists = index_lists(c, keep, layout);
            vis.par_chunks_mut(sk).zip(lists.par_chunks(keep)).for_each(|(row, l)| l.iter().filter(|&&k| k >= 0).for_each(|&k| row[k as usize] = true));
        }
        Mask::KeyTopk { .. } => unreachable!("key_topk is query-broadcast: see key_topk"),
        Mask::KeyFraction { .. } => unreachable!("key_fraction is a packed batch's key-side mask: see key_fraction"),
        Mask::Select { .. } => unreachable!("select cases run no attention: see select.rs"),
    }
    Some(vis)
}

/// A `key_topk` case's mask `[batch, mask_heads, 1, seqlen_k]` (the kept keys of each plane) and
/// key-side bias of the same shape (N(0, 1): `Φ⁻¹` of the scores that pick the kept keys; SCHEMA.md),
/// with the kept keys of each plane.
fn key_topk(c: &Case, keep: usize) -> (Vec<bool>, Vec<f32>, Vec<Vec<u32>>) {
    let scores = key_scores(c, keep);
    let kept = top_keys(&scores, c.seqlen_k, keep);
    let mut vis = vec![false; scores.len()];
    for (plane, keys) in vis.chunks_mut(c.seqlen_k).zip(&kept) {
        keys.iter().for_each(|&j| plane[j as usize] = true);
    }
    let bias = scores.par_iter().map(|&u| normal_quantile(u) as f32).collect();
    (vis, bias, kept)
}

/// A packed `key_fraction` case's mask and bias, each `[total_k, mask_heads]` (the packed key
/// order dmattn takes with `.seqlens(..)`, paged K/V or not): the kept keys of each (sequence,
/// mask head) and the bias `Φ⁻¹` of the scores that pick them (SCHEMA.md), with the kept keys of
/// each plane ([`top_fraction_keys`]: within the sequence, sequence-major).
fn key_fraction(c: &Case, percent: usize) -> (Vec<bool>, Vec<f32>, Vec<Vec<u32>>) {
    let (p, mh) = (c.seqlens.as_ref().expect("key_fraction is for packed cases"), c.mask_heads);
    let scores = key_fraction_scores(c, percent).expect("a packed case");
    let kept = top_fraction_keys(&scores, &p.lens_k, mh, percent);
    let mut vis = vec![false; scores.len()];
    let mut start = 0;
    for (b, &len) in p.lens_k.iter().enumerate() {
        for (h, keys) in kept[b * mh..][..mh].iter().enumerate() {
            keys.iter().for_each(|&j| vis[(start + j as usize) * mh + h] = true);
        }
        start += len;
    }
    let bias = scores.par_iter().map(|&u| normal_quantile(u) as f32).collect();
    (vis, bias, kept)
}

/// The share of `TILE`×`TILE` score tiles of `seqlen_q × seqlen_k` that gather attention
/// computes: each plane's kept keys, compacted in ascending order into tiles of `TILE` slots,
/// against the query tiles, a tile counting where one of its rows sees one of its keys (on the
/// original key positions) under the case's causal flag; averaged over the planes.
fn gathered_fraction(c: &Case, kept: &[Vec<u32>]) -> f64 {
    let (sq, sk) = (c.seqlen_q, c.seqlen_k);
    let (nq, nk) = (sq.div_ceil(TILE), sk.div_ceil(TILE));
    let live: usize = kept
        .par_iter()
        .map(|keys| {
            let sees = |slots: &[u32], i: usize| {
                let r = c.row_keys(i);
                let first = slots.partition_point(|&j| (j as usize) < r.start);
                first < slots.len() && (slots[first] as usize) < r.end
            };
            (0..nq).map(|ti| keys.chunks(TILE).filter(|slots| (ti * TILE..((ti + 1) * TILE).min(sq)).any(|i| sees(slots, i))).count()).sum::<usize>()
        })
        .sum();
    live as f64 / (kept.len().max(1) * nq * nk) as f64
}

/// The share of `TILE`×`TILE` score tiles holding at least one visible score under the case's
/// causal flag, band and mask (`vis` for a dense one, else the kept blocks of `bcsr` and
/// `bitset`): what a block-sparse kernel must compute.
fn computed_fraction(c: &Case, vis: Option<&[bool]>) -> f64 {
    let (sq, sk) = (c.seqlen_q, c.seqlen_k);
    let kept = c.kept_blocks();
    let (nq, nk) = (sq.div_ceil(TILE), sk.div_ceil(TILE));
    let planes = if vis.is_some() || kept.is_some() { c.batch * c.mask_heads } else { 1 };
    let live: usize = (0..planes * nq)
        .into_par_iter()
        .map(|t| {
            let (plane, ti) = (t / nq, t % nq);
            let mut any = vec![false; nk];
            for i in ti * TILE..((ti + 1) * TILE).min(sq) {
                let keys = c.row_keys(i);
                match (vis, &kept) {
                    (Some(v), _) => v[(plane * sq + i) * sk..][keys.clone()].iter().enumerate().for_each(|(j, &x)| any[(keys.start + j) / TILE] |= x),
                    (None, Some((block, kept))) => {
                        let bk = sk.div_ceil(*block);
                        let row = &kept[(plane * sq.div_ceil(*block) + i / block) * bk..][..bk];
                        for (jb, _) in row.iter().enumerate().filter(|(_, k)| **k) {
                            let cols = (jb * block).max(keys.start)..((jb + 1) * block).min(keys.end);
                            if !cols.is_empty() {
                                any[cols.start / TILE..cols.end.div_ceil(TILE)].fill(true);
                            }
                        }
                    }
                    (None, None) if !keys.is_empty() => any[keys.start / TILE..keys.end.div_ceil(TILE)].fill(true),
                    (None, None) => {}
                }
            }
            any.iter().filter(|&&x| x).count()
        })
        .sum();
    live as f64 / (planes * nq * nk) as f64
}

/// A case's [`SparseMask`] (for the sparse mask kinds): its tensors made on `dev` from the same
/// draw as the dense forms; `vis` is the dense mask of `compress_dense` and `index_lists`.
fn sparse_mask(c: &Case, mask: Mask, vis: Option<Vec<bool>>, dev: &Device) -> dmattn::Result<SparseMask> {
    let (b, h) = (c.batch, c.mask_heads);
    let structural = match mask {
        Mask::Window { left } if c.causal => return Ok(SparseMask::causal_window(left)),
        Mask::Window { left } => SparseMask::window(Some(left), None),
        Mask::Compress { cf } => return Ok(SparseMask::compress_causal(cf)),
        Mask::CompressDense { .. } => {
            let vis = vis.expect("compress_dense has a dense mask");
            return Ok(SparseMask::dense(&Tensor::from_vec(vis, &[b, h, c.seqlen_q, c.seqlen_k], dev)?));
        }
        Mask::IndexLists { dense: true, .. } => {
            let vis = vis.expect("index lists have a dense mask");
            SparseMask::dense(&Tensor::from_vec(vis, &[b, h, c.seqlen_q, c.seqlen_k], dev)?)
        }
        Mask::IndexLists { keep, layout, dense: false } => SparseMask::indices(&Tensor::from_vec(index_lists(c, keep, layout), &[b, h, c.seqlen_q, keep], dev)?),
        Mask::Bitset { block, .. } => {
            let (_, kept) = c.kept_blocks().expect("bitset has kept blocks");
            SparseMask::block_bitset(&Tensor::from_vec(kept, &[b, h, c.seqlen_q.div_ceil(block), c.seqlen_k.div_ceil(block)], dev)?, block)
        }
        Mask::Bcsr { block, .. } => {
            let (_, kept) = c.kept_blocks().expect("bcsr has kept blocks");
            let (row_ptr, col_idx, nnz) = bcsr(&kept, b * h, c.seqlen_q.div_ceil(block), c.seqlen_k.div_ceil(block));
            let rows = c.seqlen_q.div_ceil(block);
            SparseMask::bcsr(&Tensor::from_vec(row_ptr, &[b, h, rows + 1], dev)?, &Tensor::from_vec(col_idx, &[b, h, nnz], dev)?, block)
        }
        Mask::Topk { .. } | Mask::Blocks { .. } | Mask::KeyTopk { .. } | Mask::KeyFraction { .. } | Mask::Select { .. } => unreachable!("dense masks are not sparse"),
    };
    Ok(if c.causal { structural.and(SparseMask::causal()) } else { structural })
}

/// Kept flags `[planes, rows, cols]` as BCSR: row pointers `[planes, rows + 1]` and block indices
/// `[planes, nnz]` (`nnz` the largest plane's count; shorter planes are padded with 0, past their
/// last row pointer).
pub(crate) fn bcsr(kept: &[bool], planes: usize, rows: usize, cols: usize) -> (Vec<i32>, Vec<i32>, usize) {
    let per_plane: Vec<&[bool]> = kept.chunks(rows * cols).collect();
    let nnz = per_plane.iter().map(|p| p.iter().filter(|&&k| k).count()).max().unwrap_or(0).max(1);
    let (mut row_ptr, mut col_idx) = (Vec::with_capacity(planes * (rows + 1)), vec![0i32; planes * nnz]);
    for (p, plane) in per_plane.iter().enumerate() {
        let mut n = 0;
        row_ptr.push(0);
        for r in 0..rows {
            for (j, _) in plane[r * cols..][..cols].iter().enumerate().filter(|(_, k)| **k) {
                col_idx[p * nnz + n] = j as i32;
                n += 1;
            }
            row_ptr.push(n as i32);
        }
    }
    (row_ptr, col_idx, nnz)
}

/// A sparse case's mask: as given (its tensors on the GPU) and prepared once, the prepared form
/// reused by every timed call.
pub struct Sparse {
    pub mask: SparseMask,
    pub prepared: PreparedMask,
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
    /// The sparse mask kinds' mask, instead of `mask`.
    pub sparse: Option<Sparse>,
    /// A packed batch's sequences (`varlen`), on the GPU, built once per case.
    pub seqlens: Option<SeqLens>,
    /// A paged case's block table ([`page_table`]), on the GPU, built once per case: every set's
    /// k and v are paged alike, as `[num_pages, page_size, kv_heads, head_dim]`.
    pub pages: Option<PageTable>,
    pub computed_fraction: f64,
}

/// A packed batch's share of computed tiles ([`computed_fraction`] of each sequence as a
/// fixed-length case, or with a key-side mask the [`gathered_fraction`] of its planes' `kept`
/// keys, `mask_heads` planes a sequence), weighted by the sequences' `sq × sk` areas (which
/// [`Case::computed_flops`] adds up).
fn packed_fraction(seqs: &[Case], kept: Option<&[Vec<u32>]>) -> f64 {
    let area = |s: &Case| (s.seqlen_q * s.seqlen_k) as f64;
    let total: f64 = seqs.iter().map(area).sum();
    if total == 0.0 {
        return 1.0;
    }
    let fraction = |b: usize, s: &Case| match kept {
        Some(planes) => gathered_fraction(s, &planes[b * s.mask_heads..][..s.mask_heads]),
        None => computed_fraction(s, None),
    };
    seqs.iter().enumerate().filter(|(_, s)| area(s) > 0.0).map(|(b, s)| fraction(b, s) * area(s)).sum::<f64>() / total
}

/// Enough operand sets that they do not all sit in L2 (256 MiB of q, k, v; 1 to 4 sets).
fn set_count(c: &Case) -> usize {
    rotation_sets(2 * c.head_dim * c.batch * (c.seqlen_q * c.heads + 2 * c.seqlen_k * c.kv_heads))
}

/// Copies of `bytes` of operands that span 256 MiB (1 to 4).
pub(crate) fn rotation_sets(bytes: usize) -> usize {
    (256usize << 20).div_ceil(bytes.max(1)).clamp(1, 4)
}

impl Operands {
    pub fn new(c: &Case, dev: &Device, rng: &mut StdRng) -> dmattn::Result<Operands> {
        let (b, sq, sk, d) = (c.batch, c.seqlen_q, c.seqlen_k, c.head_dim);
        // A packed batch takes the key-side `key_fraction` mask and its bias (drawn over the
        // sequences), and that mask nothing else.
        let key_fraction_mask = matches!(c.mask, Some(Mask::KeyFraction { .. }));
        if c.seqlens.is_some() && !key_fraction_mask && (c.mask.is_some() || c.bias) {
            return Err(dmattn::Error::Unsupported { what: "a packed batch with a mask other than key_fraction, or a bias without it".into(), backend: "dmattn-bench" });
        }
        if c.seqlens.is_none() && key_fraction_mask {
            return Err(dmattn::Error::Unsupported { what: "a key_fraction mask without a packed batch".into(), backend: "dmattn-bench" });
        }
        // A paged case's layout, the same for every set.
        let (lens_k, pages) = match &c.seqlens {
            Some(p) => (&p.lens_k[..], page_table(p)),
            None => (&[][..], None),
        };
        // A packed batch (batch 1, the totals): q `[total_q, heads, d]`, k and v `[total_k,
        // kv_heads, d]`, or with pages the same draw of packed rows (so that a paged case runs on
        // the rows its contiguous case would) scattered into `[num_pages, page_size, kv_heads, d]`.
        let mut draw = |shape: &[usize], kv: bool| {
            let values = normals(shape.iter().product(), rng.random());
            match pages.as_ref().filter(|_| kv) {
                None => bf16_tensor(&values, shape, dev),
                Some(p) => Tensor::from_vec(paged_rows(&values, c.kv_heads * d, lens_k, p), &[p.num_pages, p.page_size, c.kv_heads, d], dev),
            }
        };
        let (q_shape, kv_shape) = match c.seqlens {
            Some(_) => (vec![sq, c.heads, d], vec![sk, c.kv_heads, d]),
            None => (vec![b, sq, c.heads, d], vec![b, sk, c.kv_heads, d]),
        };
        let sets = set_count(c);
        let mut o = Operands { q: vec![], k: vec![], v: vec![], dout: vec![], mask: None, bias: None, sparse: None, seqlens: None, pages: None, computed_fraction: 1.0 };
        for _ in 0..sets {
            o.q.push(draw(&q_shape, false)?);
            o.k.push(draw(&kv_shape, true)?);
            o.v.push(draw(&kv_shape, true)?);
            if c.backward {
                o.dout.push(draw(&q_shape, false)?);
            }
        }
        if let Some(p) = &c.seqlens {
            // Made on the device once, outside the timed calls (as the layers of a model share it).
            o.seqlens = Some(SeqLens::from_lengths(&p.lens_q, &p.lens_k, dev)?);
            if let Some(layout) = &pages {
                o.pages = Some(PageTable::new(&layout.table, p.lens_k.len(), dev)?);
            }
            let kept = match c.mask {
                // Key-side `[total_k, mask_heads]`, shared by every set (paged or not: the
                // packed key order).
                Some(Mask::KeyFraction { percent }) => {
                    let (vis, bias, kept) = key_fraction(c, percent);
                    let shape = [sk, c.mask_heads];
                    o.mask = Some(Tensor::from_vec(vis, &shape, dev)?);
                    if c.bias {
                        o.bias = Some(bf16_tensor(&bias, &shape, dev)?);
                    }
                    Some(kept)
                }
                _ => None,
            };
            o.computed_fraction = packed_fraction(&c.sequences().expect("packed"), kept.as_deref());
            return Ok(o);
        }
        let score_shape = [b, c.mask_heads, c.mask_rows(), sk];
        let (scores, vis) = match c.mask {
            // Query-broadcast: one row of mask and bias per plane, drawn as peers.py draws them.
            Some(Mask::KeyTopk { keep }) => {
                let (vis, bias, kept) = key_topk(c, keep);
                o.computed_fraction = gathered_fraction(c, &kept);
                (Some(bias), Some(vis))
            }
            _ => {
                let scores = (c.bias || matches!(c.mask, Some(Mask::Topk { .. }))).then(|| normals(score_shape.iter().product(), rng.random()));
                let vis = c.mask.and_then(|m| visibility(c, m, scores.as_deref().unwrap_or(&[])));
                o.computed_fraction = computed_fraction(c, vis.as_deref());
                (scores, vis)
            }
        };
        match c.mask {
            Some(m) if m.is_sparse() => {
                // Prepared once here, outside the timed calls (main.rs times `prepare` apart).
                let mask = sparse_mask(c, m, vis, dev)?;
                let prepared = mask.prepare(sq, sk)?;
                o.sparse = Some(Sparse { mask, prepared });
            }
            _ => {
                if let Some(vis) = vis {
                    o.mask = Some(Tensor::from_vec(vis, &score_shape, dev)?);
                }
            }
        }
        if c.bias {
            // The top-k masks rank the bias itself, as Flash-DMA's dynamic mask does.
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
    use dmattn::attention;
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
        let vis = visibility(&c, c.mask.unwrap(), &s).unwrap();
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
        let vis = visibility(&c, c.mask.unwrap(), &[]).unwrap();
        let visible_blocks = (0..64).filter(|b| vis[(b / 8) * 128 * 1024 + (b % 8) * 128]).count();
        assert!(visible_blocks > 0 && visible_blocks < 64);
        assert_eq!(computed_fraction(&c, Some(&vis)), visible_blocks as f64 / 64.0);
        // The same draw as a bitset or BCSR: the same tiles, without a dense mask.
        for mask in [Mask::Bitset { block: 128, density: 0.5 }, Mask::Bcsr { block: 128, density: 0.5 }] {
            assert_eq!(computed_fraction(&Case { mask: Some(mask), ..c.clone() }, None), visible_blocks as f64 / 64.0);
        }
    }

    /// Tiles with a visible score, by brute force over every score of `c`'s band.
    fn brute_fraction(c: &Case, visible: impl Fn(usize, usize) -> bool) -> f64 {
        let (nq, nk) = (c.seqlen_q.div_ceil(TILE), c.seqlen_k.div_ceil(TILE));
        let live = (0..nq * nk)
            .filter(|t| {
                let (ti, tj) = (t / nk, t % nk);
                (ti * TILE..((ti + 1) * TILE).min(c.seqlen_q)).any(|i| (tj * TILE..((tj + 1) * TILE).min(c.seqlen_k)).any(|j| visible(i, j)))
            })
            .count();
        live as f64 / (nq * nk) as f64
    }

    #[test]
    fn computed_fraction_of_bands() {
        // Causal with a left window of 100, bottom-right (sk - sq = 100).
        let c = small(Some(Mask::Window { left: 100 }), true);
        let f = brute_fraction(&c, |i, j| j <= i + 100 && j + 100 >= i + 100);
        assert_eq!(computed_fraction(&c, None), f);
        assert!(f < 17.0 / 20.0);
        // Compressed causal, cf 4: key j visible to query i iff 4 j <= i (no offset).
        let mut c = small(Some(Mask::Compress { cf: 4 }), false);
        c.seqlen_k = 50;
        let f = brute_fraction(&c, |i, j| 4 * j <= i);
        assert_eq!(computed_fraction(&c, None), f);
        // The same pattern as a dense mask: the same tiles.
        let dense = Case { mask: Some(Mask::CompressDense { cf: 4 }), ..c.clone() };
        let vis = visibility(&dense, dense.mask.unwrap(), &[]).unwrap();
        assert!(vis.chunks(50).enumerate().all(|(i, row)| row.iter().enumerate().all(|(j, &v)| v == (4 * j <= i % 200))));
        assert_eq!(computed_fraction(&dense, Some(&vis)), f);
    }

    /// Each sparse kind's `SparseMask`, prepared on the CPU, gives the attention of the dense
    /// mask written from the rule (SCHEMA.md; what peers.py builds).
    #[test]
    fn sparse_masks_are_their_dense_patterns() {
        let dev = Device::Cpu;
        let mut c = small(None, false);
        (c.batch, c.heads, c.kv_heads, c.head_dim) = (2, 2, 1, 16);
        type Rule = Box<dyn Fn(usize, usize, usize) -> bool>;
        let blocks = |c: &Case| {
            let (block, kept) = c.kept_blocks().unwrap();
            let (nq, nk) = (c.seqlen_q.div_ceil(block), c.seqlen_k.div_ceil(block));
            Box::new(move |b: usize, i: usize, j: usize| kept[(b * nq + i / block) * nk + j / block]) as Rule
        };
        let mut cases: Vec<(Case, Rule)> = vec![
            // 200 queries, 300 keys: D(i) = i + 100.
            (Case { mask: Some(Mask::Window { left: 30 }), causal: true, ..c.clone() }, Box::new(|_, i, j| j <= i + 100 && j + 30 >= i + 100)),
            (Case { mask: Some(Mask::Window { left: 30 }), causal: false, ..c.clone() }, Box::new(|_, i, j| j + 30 >= i + 100)),
            (Case { mask: Some(Mask::Compress { cf: 4 }), seqlen_k: 50, ..c.clone() }, Box::new(|_, i, j| j * 4 <= i)),
            (Case { mask: Some(Mask::CompressDense { cf: 4 }), seqlen_k: 50, ..c.clone() }, Box::new(|_, i, j| j * 4 <= i)),
        ];
        for mask in [Mask::Bitset { block: 64, density: 0.5 }, Mask::Bcsr { block: 64, density: 0.5 }] {
            let case = Case { mask: Some(mask), ..c.clone() };
            cases.push((case.clone(), blocks(&case)));
            let causal = Case { causal: true, ..case };
            let kept = blocks(&causal);
            cases.push((causal, Box::new(move |b, i, j| kept(b, i, j) && j <= i + 100)));
        }
        for (c, rule) in cases {
            let (sq, sk) = (c.seqlen_q, c.seqlen_k);
            let vis = visibility(&c, c.mask.unwrap(), &[]);
            let sparse = sparse_mask(&c, c.mask.unwrap(), vis, &dev).unwrap().prepare(sq, sk).unwrap();
            let dense: Vec<bool> = (0..c.batch * sq * sk).map(|n| rule(n / (sq * sk), n / sk % sq, n % sk)).collect();
            let dense = Tensor::from_vec(dense, &[c.batch, 1, sq, sk], &dev).unwrap();
            let input = |rows: usize, heads: usize, seed: f64| {
                Tensor::from_fn(&[c.batch, rows, heads, c.head_dim], dmattn::DType::F32, &dev, move |i| (i as f64 * seed).sin()).unwrap()
            };
            let (q, k, v) = (input(sq, c.heads, 0.37), input(sk, c.kv_heads, 0.11), input(sk, c.kv_heads, 0.23));
            // As main.rs calls it: the case's causal flag besides the mask that includes it.
            let got = dmattn::attention(&q, &k, &v).sparse_mask(&sparse).causal(c.causal).forward().unwrap().out.to_vec::<f32>().unwrap();
            let want = dmattn::attention(&q, &k, &v).mask(&dense).forward().unwrap().out.to_vec::<f32>().unwrap();
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-5, "{}: off by {worst}", c.id);
        }
    }

    fn key_topk_case(keep: usize, seqlen_q: usize, seqlen_k: usize) -> Case {
        let mut c = grid(true, &["gather".into()])[0].clone();
        (c.batch, c.heads, c.kv_heads, c.mask_heads, c.head_dim) = (2, 4, 2, 2, 16);
        (c.seqlen_q, c.seqlen_k, c.mask) = (seqlen_q, seqlen_k, Some(Mask::KeyTopk { keep }));
        c
    }

    #[test]
    fn key_topk_mask_is_query_broadcast_and_keeps_keep_keys_of_largest_bias() {
        let c = key_topk_case(40, 200, 300);
        let o = Operands::new(&c, &Device::Cpu, &mut StdRng::seed_from_u64(1)).unwrap();
        assert!(o.sparse.is_none());
        let (mask, bias) = (o.mask.as_ref().unwrap(), o.bias.as_ref().unwrap());
        assert_eq!(mask.shape(), [2, 2, 1, 300]);
        assert_eq!(bias.shape(), [2, 2, 1, 300]);
        let (mask, bias) = (mask.to_vec::<bool>().unwrap(), bias.to_vec::<bf16>().unwrap());
        let kept = c.kept_keys().unwrap();
        for ((m, b), keys) in mask.chunks(300).zip(bias.chunks(300)).zip(&kept) {
            assert_eq!(m.iter().filter(|&&x| x).count(), 40);
            assert!(keys.iter().all(|&j| m[j as usize]));
            // The kept keys are those of largest bias (bf16 may tie at the edge).
            let least_kept = b.iter().zip(m).filter(|(_, v)| **v).map(|(x, _)| x.to_f32()).fold(f32::INFINITY, f32::min);
            assert!(b.iter().zip(m).all(|(x, v)| *v || x.to_f32() <= least_kept));
        }
        // N(0, 1) bias: mean near 0, variance near 1 over the 1200 keys.
        let x: Vec<f64> = bias.iter().map(|v| v.to_f64()).collect();
        let mean = x.iter().sum::<f64>() / x.len() as f64;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / x.len() as f64;
        assert!(mean.abs() < 0.15 && (var - 1.0).abs() < 0.15, "mean {mean} var {var}");
        assert_eq!(o.computed_fraction, gathered_fraction(&c, &kept));
    }

    /// dmattn takes the operands as main.rs gives them (query-broadcast mask and bias through
    /// `.mask(..)` and `.bias(..)`, causal) and computes what the same mask and bias expanded to
    /// every query row give.
    #[test]
    fn key_topk_operands_run_as_their_expanded_mask() {
        let c = key_topk_case(40, 100, 300);
        let dev = Device::Cpu;
        let o = Operands::new(&c, &dev, &mut StdRng::seed_from_u64(2)).unwrap();
        let (mask, bias) = (o.mask.as_ref().unwrap(), o.bias.as_ref().unwrap());
        let expand = |row: Vec<bf16>| -> Vec<bf16> { row.chunks(c.seqlen_k).flat_map(|r| std::iter::repeat_n(r, c.seqlen_q).flatten().copied()).collect() };
        let shape = [c.batch, c.mask_heads, c.seqlen_q, c.seqlen_k];
        let full_bias = Tensor::from_vec(expand(bias.to_vec::<bf16>().unwrap()), &shape, &dev).unwrap();
        let rows: Vec<bool> = mask.to_vec::<bool>().unwrap();
        let full_mask: Vec<bool> = rows.chunks(c.seqlen_k).flat_map(|r| std::iter::repeat_n(r, c.seqlen_q).flatten().copied()).collect();
        let full_mask = Tensor::from_vec(full_mask, &shape, &dev).unwrap();
        let run = |m: &Tensor, b: &Tensor| {
            attention(&o.q[0], &o.k[0], &o.v[0]).mask(m).bias(b).causal(true).forward().unwrap().out.to_vec::<bf16>().unwrap()
        };
        assert_eq!(run(mask, bias), run(&full_mask, &full_bias));
    }

    #[test]
    fn gathered_fraction_counts_the_gathered_tiles() {
        for (causal, seqlen_q, seqlen_k, keep) in [(true, 200, 300, 100), (true, 300, 200, 70), (false, 200, 300, 100), (true, 1, 300, 100)] {
            let c = Case { causal, ..key_topk_case(keep, seqlen_q, seqlen_k) };
            let kept = c.kept_keys().unwrap();
            // Slot s of a plane holds its s-th kept key; a (query tile, slot tile) counts where a
            // row of it sees a key of it.
            let live: usize = kept
                .iter()
                .map(|keys| {
                    let (nq, ns) = (seqlen_q.div_ceil(TILE), keys.len().div_ceil(TILE));
                    (0..nq * ns)
                        .filter(|t| {
                            let (ti, ts) = (t / ns, t % ns);
                            (ti * TILE..((ti + 1) * TILE).min(seqlen_q)).any(|i| {
                                keys[ts * TILE..((ts + 1) * TILE).min(keys.len())].iter().any(|&j| !causal || j as usize + seqlen_q <= i + seqlen_k)
                            })
                        })
                        .count()
                })
                .sum();
            let rect = kept.len() * seqlen_q.div_ceil(TILE) * seqlen_k.div_ceil(TILE);
            assert_eq!(gathered_fraction(&c, &kept), live as f64 / rect as f64, "causal {causal} sq {seqlen_q} sk {seqlen_k}");
        }
        // Without causal every query tile computes every slot tile: 4 x 2 of 4 x 5.
        let c = Case { causal: false, ..key_topk_case(100, 200, 300) };
        assert_eq!(gathered_fraction(&c, &c.kept_keys().unwrap()), 8.0 / 20.0);
    }

    /// A packed case's operands are the packed shapes with its `SeqLens`, and dmattn runs them
    /// as main.rs calls it (causal, `.seqlens(..)`), forward and backward.
    #[test]
    fn packed_operands_run_as_a_packed_batch() {
        let mut c = grid(true, &["varlen".into()])[0].clone();
        let (lens_q, lens_k) = (vec![70, 0, 130, 5], vec![70, 3, 130, 200]);
        (c.heads, c.kv_heads, c.head_dim, c.seqlen_q, c.seqlen_k) = (4, 2, 16, 205, 403);
        c.seqlens = Some(dmattn_bench::cases::Packed { lens_q: lens_q.clone(), lens_k: lens_k.clone(), page_size: None });
        let o = Operands::new(&c, &Device::Cpu, &mut StdRng::seed_from_u64(3)).unwrap();
        assert_eq!((o.q[0].shape(), o.k[0].shape(), o.v[0].shape(), o.dout[0].shape()), (&[205, 4, 16][..], &[403, 2, 16][..], &[403, 2, 16][..], &[205, 4, 16][..]));
        let seqs = o.seqlens.as_ref().unwrap();
        assert_eq!((seqs.batch(), seqs.total_q(), seqs.total_k(), seqs.max_seqlen_q(), seqs.max_seqlen_k()), (4, 205, 403, 130, 200));
        assert!(o.mask.is_none() && o.bias.is_none() && o.sparse.is_none());
        let fwd = attention(&o.q[0], &o.k[0], &o.v[0]).seqlens(seqs).causal(c.causal).forward().unwrap();
        assert_eq!((fwd.out.shape(), fwd.lse.shape()), (&[205, 4, 16][..], &[4, 205][..]));
        let grads = fwd.backward(&o.dout[0]).unwrap();
        assert_eq!(grads.dk.shape(), &[403, 2, 16]);
        // Tiles of each sequence, weighted by its area: 70 x 70 causal has 3 of 4 tiles (2 x 2),
        // 130 x 130 causal 6 of 9, 5 x 200 (bottom-right: row 0 sees keys 0..=195) all 4; the
        // sequence of no queries has no area.
        let want = (0.75 * 4900.0 + 6.0 / 9.0 * 16900.0 + 1000.0) / (4900.0 + 16900.0 + 1000.0);
        assert!((o.computed_fraction - want).abs() < 1e-12, "{} vs {want}", o.computed_fraction);
    }

    /// A paged case's operands are its contiguous case's packed rows (the same draw), each set's
    /// k and v scattered into the pages of the one shared table; dmattn run on them as main.rs
    /// calls it (`.kv_pages(..)`) gives the contiguous case's output bit for bit.
    #[test]
    fn paged_operands_are_the_packed_rows_in_pages() {
        let mut c = grid(true, &["varlen".into()])[2].clone();
        let lens_k = vec![70, 3, 130, 200];
        (c.heads, c.kv_heads, c.head_dim, c.seqlen_q, c.seqlen_k) = (4, 2, 16, 12, 403);
        c.seqlens = Some(dmattn_bench::cases::Packed { lens_q: vec![1, 3, 0, 8], lens_k: lens_k.clone(), page_size: Some(64) });
        let contiguous = Case { seqlens: Some(dmattn_bench::cases::Packed { page_size: None, ..c.seqlens.clone().unwrap() }), ..c.clone() };
        let dev = Device::Cpu;
        let paged = Operands::new(&c, &dev, &mut StdRng::seed_from_u64(4)).unwrap();
        let packed = Operands::new(&contiguous, &dev, &mut StdRng::seed_from_u64(4)).unwrap();
        assert!(packed.pages.is_none() && paged.sets() == packed.sets() && paged.sets() > 1);
        // 2 + 1 + 3 + 4 pages of 64 keys; the longest sequence needs 4.
        let layout = page_table(c.seqlens.as_ref().unwrap()).unwrap();
        let table = paged.pages.as_ref().unwrap();
        assert_eq!((table.batch(), table.max_pages(), layout.num_pages), (4, 4, 10));
        let width = c.kv_heads * c.head_dim;
        for s in 0..paged.sets() {
            assert_eq!(paged.q[s].to_vec::<bf16>().unwrap(), packed.q[s].to_vec::<bf16>().unwrap());
            for (pages, rows) in [(&paged.k[s], &packed.k[s]), (&paged.v[s], &packed.v[s])] {
                assert_eq!(pages.shape(), &[10, 64, 2, 16]);
                let (pages, rows) = (pages.to_vec::<bf16>().unwrap(), rows.to_vec::<bf16>().unwrap());
                let mut row = 0;
                for (b, &len) in lens_k.iter().enumerate() {
                    for j in 0..len {
                        let at = table.page(b, j / 64).unwrap() as usize * 64 + j % 64;
                        assert_eq!(pages[at * width..][..width], rows[row * width..][..width], "set {s} sequence {b} key {j}");
                        row += 1;
                    }
                }
            }
            let run = |o: &Operands| {
                let mut call = attention(&o.q[s], &o.k[s], &o.v[s]).seqlens(o.seqlens.as_ref().unwrap()).causal(c.causal);
                if let Some(t) = &o.pages {
                    call = call.kv_pages(t);
                }
                let fwd = call.forward().unwrap();
                (fwd.out.to_vec::<bf16>().unwrap(), fwd.lse.to_vec::<f32>().unwrap())
            };
            let (got, want) = (run(&paged), run(&packed));
            assert!(got.0 == want.0 && got.1.iter().map(|x| x.to_bits()).eq(want.1.iter().map(|x| x.to_bits())), "set {s}");
        }
    }

    /// A small packed `key_fraction` case shaped as the varlen group's masked decode: 4
    /// sequences (one of no queries), 4 heads, 2 kv heads (a mask plane each), dim 16.
    fn key_fraction_case(page_size: Option<usize>) -> Case {
        let mut c = grid(true, &["varlen".into()])[3].clone();
        assert_eq!(c.mask, Some(Mask::KeyFraction { percent: 10 }));
        (c.heads, c.kv_heads, c.mask_heads, c.head_dim, c.seqlen_q, c.seqlen_k) = (4, 2, 2, 16, 12, 403);
        c.seqlens = Some(dmattn_bench::cases::Packed { lens_q: vec![1, 3, 0, 8], lens_k: vec![70, 3, 130, 200], page_size });
        c
    }

    /// The mask and bias are key-side `[total_k, mask_heads]` in the packed key order, keep each
    /// (sequence, mask head)'s ceil(10 %) keys of largest bias, and are the same in every draw.
    #[test]
    fn key_fraction_operands_keep_the_top_share_of_each_sequence() {
        let c = key_fraction_case(None);
        let dev = Device::Cpu;
        let o = Operands::new(&c, &dev, &mut StdRng::seed_from_u64(5)).unwrap();
        let (mask, bias) = (o.mask.as_ref().unwrap(), o.bias.as_ref().unwrap());
        assert!(o.sparse.is_none() && o.pages.is_none() && mask.shape() == [403, 2] && bias.shape() == [403, 2]);
        let (mask, bias) = (mask.to_vec::<bool>().unwrap(), bias.to_vec::<bf16>().unwrap());
        let kept = c.kept_keys().unwrap();
        let mut start = 0;
        for (b, (&len, want)) in [70, 3, 130, 200].iter().zip([7, 1, 13, 20]).enumerate() {
            for h in 0..2 {
                let plane = |j: usize| (start + j) * 2 + h;
                let keys: Vec<u32> = (0..len).filter(|&j| mask[plane(j)]).map(|j| j as u32).collect();
                assert_eq!((keys.len(), &keys), (want, &kept[b * 2 + h]), "sequence {b} head {h}");
                // The kept keys are those of largest bias (bf16 may tie at the edge).
                let least_kept = keys.iter().map(|&j| bias[plane(j as usize)].to_f32()).fold(f32::INFINITY, f32::min);
                assert!((0..len).all(|j| mask[plane(j)] || bias[plane(j)].to_f32() <= least_kept), "sequence {b} head {h}");
            }
            start += len;
        }
        // Another draw of the operands has the same mask and bias (q, k and v differ).
        let again = Operands::new(&c, &dev, &mut StdRng::seed_from_u64(6)).unwrap();
        assert_eq!(again.mask.unwrap().to_vec::<bool>().unwrap(), mask);
        assert_eq!(again.bias.unwrap().to_vec::<bf16>().unwrap(), bias);
        assert_ne!(again.q[0].to_vec::<bf16>().unwrap(), o.q[0].to_vec::<bf16>().unwrap());
        // Gathered tiles, one query tile a sequence: 1 of 2 key tiles (70 keys, 7 kept), 1 of 1,
        // none of the sequence without queries, 1 of 4 (200 keys, 20 kept), weighted by area.
        assert_eq!(o.computed_fraction, (0.5 * 70.0 + 9.0 + 0.25 * 1600.0) / (70.0 + 9.0 + 1600.0));
    }

    /// dmattn takes them as main.rs gives them (`.seqlens(..)`, `.mask(..)`, `.bias(..)`,
    /// causal) and computes what each sequence's fixed-length call with its key-side mask and
    /// bias `[1, mask_heads, 1, len_k]` gives; the paged twin (`.kv_pages(..)`, the same mask and
    /// bias in the packed key order) gives the same output bit for bit.
    #[test]
    fn key_fraction_operands_run_as_each_sequences_key_side_mask() {
        let (c, dev) = (key_fraction_case(None), Device::Cpu);
        let o = Operands::new(&c, &dev, &mut StdRng::seed_from_u64(7)).unwrap();
        let run = |o: &Operands| {
            let (mask, bias) = (o.mask.as_ref().unwrap(), o.bias.as_ref().unwrap());
            let mut call = attention(&o.q[0], &o.k[0], &o.v[0]).seqlens(o.seqlens.as_ref().unwrap()).mask(mask).bias(bias).causal(c.causal);
            if let Some(t) = &o.pages {
                call = call.kv_pages(t);
            }
            call.forward().unwrap().out.to_vec::<bf16>().unwrap()
        };
        let got = run(&o);
        let (q, k, v) = (o.q[0].to_vec::<bf16>().unwrap(), o.k[0].to_vec::<bf16>().unwrap(), o.v[0].to_vec::<bf16>().unwrap());
        let (mask, bias) = (o.mask.as_ref().unwrap().to_vec::<bool>().unwrap(), o.bias.as_ref().unwrap().to_vec::<bf16>().unwrap());
        let p = c.seqlens.as_ref().unwrap();
        let qw = c.heads * c.head_dim;
        let (mut sq0, mut sk0) = (0, 0);
        for (&sq, &sk) in p.lens_q.iter().zip(&p.lens_k) {
            if sq > 0 {
                // This sequence's rows of packed q `[total_q, heads, d]` and k, v `[total_k,
                // kv_heads, d]`, as a batch of one.
                let rows = |data: &[bf16], first: usize, n: usize, heads: usize| {
                    let width = heads * c.head_dim;
                    Tensor::from_vec(data[first * width..][..n * width].to_vec(), &[1, n, heads, c.head_dim], &dev).unwrap()
                };
                let (qs, ks, vs) = (rows(&q, sq0, sq, c.heads), rows(&k, sk0, sk, c.kv_heads), rows(&v, sk0, sk, c.kv_heads));
                // [total_k, mask_heads] -> this sequence's [1, mask_heads, 1, len_k].
                let side = |h: usize, j: usize| (sk0 + j) * c.mask_heads + h;
                let m: Vec<bool> = (0..c.mask_heads * sk).map(|n| mask[side(n / sk, n % sk)]).collect();
                let b: Vec<bf16> = (0..c.mask_heads * sk).map(|n| bias[side(n / sk, n % sk)]).collect();
                let (m, b) = (Tensor::from_vec(m, &[1, c.mask_heads, 1, sk], &dev).unwrap(), Tensor::from_vec(b, &[1, c.mask_heads, 1, sk], &dev).unwrap());
                let want = attention(&qs, &ks, &vs).mask(&m).bias(&b).causal(c.causal).forward().unwrap().out.to_vec::<bf16>().unwrap();
                assert_eq!(got[sq0 * qw..][..sq * qw], want[..], "sequence at query {sq0}");
            }
            (sq0, sk0) = (sq0 + sq, sk0 + sk);
        }
        let paged = Operands::new(&key_fraction_case(Some(64)), &dev, &mut StdRng::seed_from_u64(7)).unwrap();
        assert!(paged.pages.is_some() && paged.mask.as_ref().unwrap().shape() == [403, 2]);
        assert_eq!(run(&paged), got);
    }

    #[test]
    fn bcsr_lists_the_kept_blocks_of_each_plane() {
        // Two planes of 2 x 3 blocks.
        let kept = [true, false, true, false, false, false, /* plane 1 */ true, true, true, false, true, false];
        let (row_ptr, col_idx, nnz) = bcsr(&kept, 2, 2, 3);
        assert_eq!(nnz, 4);
        assert_eq!(row_ptr, [0, 2, 2, 0, 3, 4]);
        assert_eq!(col_idx, [0, 2, 0, 0, 0, 1, 2, 1]);
    }
}
