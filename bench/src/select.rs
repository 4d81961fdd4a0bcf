//! The `select` group's inputs and call: `dmattn::select_keys` alone (Flash-DMA's `create_mask`,
//! no attention) on a bf16 N(0, 1) bias, optionally within a causal bool mask (SCHEMA.md), with a
//! few rows of one call checked against the host's top-k, so that a fast wrong selection is not
//! reported as a time.
use crate::data::{normals_as, rotation_sets};
use dmattn::{Device, Tensor, select_keys};
use dmattn_bench::cases::{Case, Mask, SelectOutput, top_keys};
use half::bf16;
use rand::{Rng, rngs::StdRng};
use rayon::prelude::*;

/// A `select` case's operands: `sets` rotated copies of the bias (one where a bias spans 256 MiB,
/// as the 4 GiB per-query one does), the causal mask of `within_causal` shared by all, and the
/// kept keys a few rows of set 0 must give.
pub struct SelectInputs {
    pub bias: Vec<Tensor>,
    pub within: Option<Tensor>,
    /// (output row, its kept keys ascending) for the rows [`SelectInputs::check`] reads back.
    expected: Vec<(usize, Vec<u32>)>,
}

/// The keys query `i` sees under bottom-right causal: `j <= i + sk - sq`, so the first this many.
fn causal_keys(i: usize, sq: usize, sk: usize) -> usize {
    (i + sk + 1).saturating_sub(sq).min(sk)
}

/// The output rows checked: the first two, the middle and the last (row 0 of a causal case has
/// one eligible key, fewer than `keep`).
fn checked_rows(rows: usize) -> Vec<usize> {
    let mut r = vec![0, 1.min(rows - 1), rows / 2, rows - 1];
    r.dedup();
    r.sort_unstable();
    r.dedup();
    r
}

impl SelectInputs {
    pub fn new(c: &Case, dev: &Device, rng: &mut StdRng) -> dmattn::Result<SelectInputs> {
        let Some(Mask::Select { keep, within_causal, .. }) = c.mask else { panic!("{} is no select case", c.id) };
        let shape = c.select_bias_shape();
        let (sq, sk, bias_rows) = (c.seqlen_q, c.seqlen_k, shape[2]);
        let mut bias = Vec::new();
        let mut expected = Vec::new();
        for set in 0..rotation_sets(2 * shape.iter().product::<usize>()) {
            let host = normals_as(shape.iter().product(), rng.random(), bf16::from_f32);
            if set == 0 {
                // Output row r = (plane, query i): bias row `plane` (key-side) or r; under
                // causal, keys j <= i + sk - sq are eligible.
                for r in checked_rows(c.batch * c.mask_heads * sq) {
                    let (plane, i) = (r / sq, r % sq);
                    let row = &host[if bias_rows == 1 { plane } else { r } * sk..][..sk];
                    let eligible = if within_causal { causal_keys(i, sq, sk) } else { sk };
                    let values: Vec<f64> = row[..eligible].iter().map(|x| x.to_f64()).collect();
                    expected.push((r, if eligible == 0 { vec![] } else { top_keys(&values, eligible, keep).remove(0) }));
                }
            }
            bias.push(Tensor::from_vec(host, &shape, dev)?);
        }
        let within = if within_causal {
            let mut vis = vec![false; sq * sk];
            vis.par_chunks_mut(sk).enumerate().for_each(|(i, row)| row[..causal_keys(i, sq, sk)].fill(true));
            Some(Tensor::from_vec(vis, &[1, 1, sq, sk], dev)?)
        } else {
            None
        };
        // Comparisons of the selection's plans in one run: `DMATTN_BENCH_SELECT_CHUNK=0` runs one
        // CTA a row wherever that fits, `=n` wide in chunks of n words (dmattn's testing hook).
        if let Some(words) = std::env::var("DMATTN_BENCH_SELECT_CHUNK").ok().and_then(|v| v.parse().ok()) {
            dmattn::force_wide_selection(Some(words));
        }
        // `DMATTN_BENCH_SELECT_LAUNCHES=1`: the wide selection a launch a step, not one
        // cooperative launch.
        dmattn::force_select_launches(std::env::var_os("DMATTN_BENCH_SELECT_LAUNCHES").is_some());
        Ok(SelectInputs { bias, within, expected })
    }

    pub fn sets(&self) -> usize {
        self.bias.len()
    }

    /// One call on bias set `set`: the case's output, as a user makes it.
    pub fn call(&self, c: &Case, set: usize) -> dmattn::Result<Tensor> {
        let Some(Mask::Select { keep, output, .. }) = c.mask else { panic!("{} is no select case", c.id) };
        let mut select = select_keys(&self.bias[set]).top_k(keep);
        if let Some(m) = &self.within {
            select = select.within(m);
        }
        match output {
            SelectOutput::Indices => select.indices(),
            SelectOutput::Mask => select.mask(),
        }
    }

    /// Runs set 0 once more and compares the checked rows with the host's top-k (ties to the
    /// lower key, as `select_keys` breaks them): `Err` says where they differ.
    pub fn check(&self, c: &Case) -> Result<String, String> {
        let out = self.call(c, 0).map_err(|e| format!("checking call: {e}"))?;
        let width = *out.shape().last().unwrap();
        // The output read back once (the whole tensor), then each checked row's kept keys.
        let (lists, flags) = match out.dtype() {
            dmattn::DType::I32 => (out.to_vec::<i32>().map_err(|e| e.to_string())?, vec![]),
            _ => (vec![], out.to_vec::<bool>().map_err(|e| e.to_string())?),
        };
        let row_keys = |r: usize| -> Vec<u32> {
            if flags.is_empty() {
                lists[r * width..][..width].iter().filter(|&&j| j >= 0).map(|&j| j as u32).collect()
            } else {
                flags[r * width..][..width].iter().enumerate().filter(|(_, k)| **k).map(|(j, _)| j as u32).collect()
            }
        };
        for (r, want) in &self.expected {
            let got = row_keys(*r);
            if &got != want {
                let show = |v: &[u32]| format!("{} keys, first {:?}", v.len(), &v[..v.len().min(6)]);
                return Err(format!("row {r}: kept {} where the host's top-k keeps {}", show(&got), show(want)));
            }
        }
        Ok(format!("rows {:?} checked against the host's top-k", self.expected.iter().map(|e| e.0).collect::<Vec<_>>()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmattn_bench::cases::{SelectRows, grid};
    use rand::SeedableRng;

    /// A select case of the grid, shrunk to run on the CPU backend.
    fn small(id: &str, seqlen_q: usize, seqlen_k: usize, keep: usize) -> Case {
        let mut c = grid(false, &["select".into()]).into_iter().find(|c| c.id == id).unwrap();
        (c.seqlen_q, c.seqlen_k) = (seqlen_q, seqlen_k);
        if let Some(Mask::Select { keep: k, .. }) = &mut c.mask {
            *k = keep;
        }
        c
    }

    #[test]
    fn every_output_form_passes_its_check() {
        let dev = Device::Cpu;
        for (id, sq) in [
            ("select/q32768/k32768/per-query/indices", 40),
            ("select/q32768/k32768/per-query/mask", 40),
            ("select/q32768/k32768/key-side+causal/indices", 60),
            ("select/q32768/k32768/key-side+causal/mask", 60),
            ("select/q1/k32768/key-side/indices", 1),
        ] {
            let c = small(id, sq, 60, 9);
            let inputs = SelectInputs::new(&c, &dev, &mut StdRng::seed_from_u64(3)).unwrap();
            assert_eq!(inputs.bias[0].shape(), c.select_bias_shape());
            // Small biases rotate over 4 sets, as attention's operands do.
            assert_eq!(inputs.sets(), 4);
            let out = inputs.call(&c, 1).unwrap();
            let rows = c.batch * c.mask_heads * c.seqlen_q;
            let last = if id.ends_with("indices") { 9 } else { 60 };
            assert_eq!(out.shape(), [c.batch, c.mask_heads, c.seqlen_q, last], "{id}");
            let note = inputs.check(&c).unwrap_or_else(|e| panic!("{id}: {e}"));
            assert!(note.contains("checked"), "{note}");
            assert!(inputs.expected.iter().all(|(r, _)| *r < rows));
            if matches!(c.mask, Some(Mask::Select { within_causal: true, .. })) {
                // Row 0 sees key 0 alone; row 1 keys 0 and 1.
                assert_eq!(inputs.expected[0], (0, vec![0]));
                assert_eq!(inputs.expected[1], (1, vec![0, 1]));
                assert!(matches!(c.mask, Some(Mask::Select { rows: SelectRows::KeySide, .. })));
            }
        }
    }

    #[test]
    fn a_wrong_selection_fails_the_check() {
        let c = small("select/q32768/k32768/per-query/indices", 8, 50, 5);
        let mut inputs = SelectInputs::new(&c, &Device::Cpu, &mut StdRng::seed_from_u64(4)).unwrap();
        inputs.expected[0].1[0] ^= 1;
        assert!(inputs.check(&c).unwrap_err().starts_with("row 0: kept 5 keys"));
    }

    #[test]
    fn large_biases_are_not_rotated() {
        assert_eq!(rotation_sets(4 << 30), 1);
        assert_eq!(rotation_sets(64 << 10), 4);
        assert_eq!(rotation_sets(100 << 20), 3);
        assert_eq!(checked_rows(1), [0]);
        assert_eq!(checked_rows(65536), [0, 1, 32768, 65535]);
    }
}
