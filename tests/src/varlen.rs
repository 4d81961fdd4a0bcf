//! Packed variable-length batches: random cases, and the check that a packed call equals each
//! of its sequences run as its own fixed-length call on the CPU reference.
use crate::sparse::{BandCtor, Kind, MaskSpec, plane_head, random_indices, random_spec};
use dmattn::SparseMask;
use crate::*;
use dmattn::{PageTable, SeqLens};
use rand::seq::SliceRandom;
use proptest::test_runner::TestCaseError;

/// One packed batch: each sequence's (query, key) lengths, and the call's options.
#[derive(Clone, Debug)]
pub struct VarlenCase {
    pub lens: Vec<(usize, usize)>,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// A parametric sparse mask applied to every sequence.
    pub band: Option<BandCtor>,
    pub softcap: f64,
    /// A bias with this many heads (1, kv_heads or heads): key-side `[total_k, heads]`, or with
    /// `bias_per_query` query-based `[total_q, heads, max_seqlen_k]`.
    pub bias_heads: Option<usize>,
    pub bias_per_query: bool,
    /// A bool mask (its layouts are the bias's).
    pub mask: Option<VarlenMask>,
    pub dtype: DType,
    /// K/V as the pages of a paged KV cache of this page size (forward only).
    pub page_size: Option<usize>,
    /// A sparse mask with data (never with `mask`).
    pub sparse: Option<VarlenSparse>,
}

/// A packed batch's sparse mask with data ([`SparseMask::prepare_packed`]), drawn from the
/// case's seed in the layout of a fixed-length call of `[sequences, max_seqlen_q,
/// max_seqlen_k]` (each sequence its own positions): parts of `kinds` (with `planes`, a plane
/// per sequence or one for all), or with `indices` index lists (given to `Attention::indices`
/// where the case has no band, else ANDed with the band).
#[derive(Clone, Debug)]
pub struct VarlenSparse {
    pub kinds: Vec<Kind>,
    pub indices: bool,
}

/// A drawn [`VarlenSparse`]: its mask (or index lists) and what it shows, `[pb, ph, rows,
/// max_seqlen_k]` flags with `rows` 1 or `max_seqlen_q`.
pub struct SparseData {
    pub spec: Option<MaskSpec>,
    pub indices: Option<Tensor>,
    pub shape: [usize; 4],
    pub keep: Vec<bool>,
}

/// A packed batch's bool mask: `heads` heads (1, kv_heads or heads), key-side `[total_k, heads]`
/// or with `per_query` query-based `[total_q, heads, max_seqlen_k]`, each flag true with
/// probability `density`.
#[derive(Clone, Copy, Debug)]
pub struct VarlenMask {
    pub heads: usize,
    pub per_query: bool,
    pub density: f64,
}

/// A packed batch's tensors: q `[total_q, h, d]`, k/v `[total_k, hk, d]`, dO like q.
pub struct Packed {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub dout: Tensor,
    pub bias: Option<Tensor>,
    pub mask: Option<Tensor>,
    /// The case's K/V pages, where it has a page size.
    pub pages: Option<Pages>,
    pub sparse: Option<SparseData>,
}

/// k and v as pages `[num_pages, page_size, hk, d]` and the block table's `[batch, max_pages]`
/// entries. The pages are views ([`Pages::k`], [`Pages::v`]) of `[num_pages, page_size + pad,
/// hk, d]` tensors whose `pad` rows after each page are NaN: pages that are not runs of rows of
/// one tensor take the kernels' general page addressing.
pub struct Pages {
    k: Tensor,
    v: Tensor,
    pad: usize,
    pub table: Vec<i32>,
}

impl Pages {
    fn view(&self, t: &Tensor) -> Tensor {
        let [n, rows, heads, d] = t.shape()[..] else { unreachable!("pages are 4-D") };
        t.as_strided(&[n, rows - self.pad, heads, d], &[rows * heads * d, heads * d, d, 1], 0).unwrap()
    }

    pub fn k(&self) -> Tensor {
        self.view(&self.k)
    }

    pub fn v(&self) -> Tensor {
        self.view(&self.v)
    }
}

impl Packed {
    pub fn to(&self, device: &Device) -> Packed {
        let mv = |t: &Tensor| t.to_device(device).unwrap();
        Packed {
            q: mv(&self.q),
            k: mv(&self.k),
            v: mv(&self.v),
            dout: mv(&self.dout),
            bias: self.bias.as_ref().map(mv),
            mask: self.mask.as_ref().map(mv),
            pages: self.pages.as_ref().map(|p| Pages { k: mv(&p.k), v: mv(&p.v), pad: p.pad, table: p.table.clone() }),
            sparse: self.sparse.as_ref().map(|d| SparseData { spec: d.spec.clone(), indices: d.indices.as_ref().map(mv), shape: d.shape, keep: d.keep.clone() }),
        }
    }
}

impl VarlenCase {
    pub fn seqlens(&self, device: &Device) -> SeqLens {
        let (q, k): (Vec<usize>, Vec<usize>) = self.lens.iter().copied().unzip();
        SeqLens::from_lengths(&q, &k, device).unwrap()
    }

    /// A query-based bias with NaN in the columns past each row's sequence's keys (never read:
    /// a read shows in the output); a key-side one as it is.
    fn pad_with_nan(&self, bias: Tensor, hb: usize) -> Tensor {
        if !self.bias_per_query {
            return bias;
        }
        let (values, mk, keys) = (bias.to_f64_vec().unwrap(), self.max_k(), self.row_keys());
        Tensor::from_fn(bias.shape(), self.dtype, &Device::Cpu, |i| if i % mk >= keys[i / (hb * mk)] { f64::NAN } else { values[i] }).unwrap()
    }

    /// Each packed query row's sequence's key count.
    fn row_keys(&self) -> Vec<usize> {
        self.lens.iter().flat_map(|&(q, k)| std::iter::repeat_n(k, q)).collect()
    }

    /// The bias's shape with `hb` heads.
    fn bias_shape(&self, hb: usize) -> Vec<usize> {
        self.packed_shape(self.bias_per_query, hb)
    }

    /// A packed operand's shape with `heads` heads: query-based `[total_q, heads,
    /// max_seqlen_k]` or key-side `[total_k, heads]`.
    fn packed_shape(&self, per_query: bool, heads: usize) -> Vec<usize> {
        let (tq, tk) = self.totals();
        if per_query { vec![tq, heads, self.max_k()] } else { vec![tk, heads] }
    }

    fn max_k(&self) -> usize {
        self.lens.iter().map(|&(_, k)| k).max().unwrap_or(0)
    }

    /// Where sequence `b`'s bias value of (head `hh`, query `i`, key `j`) is in the packed bias
    /// with `hb` heads.
    fn bias_index(&self, b: usize, hb: usize, hh: usize, i: usize, j: usize) -> usize {
        self.packed_index(self.bias_per_query, b, hb, hh, i, j)
    }

    /// Where sequence `b`'s value of (head `hh`, query `i`, key `j`) is in a packed operand of
    /// `heads` heads, query-based or key-side.
    fn packed_index(&self, per_query: bool, b: usize, heads: usize, hh: usize, i: usize, j: usize) -> usize {
        let (q0, k0) = self.lens[..b].iter().fold((0, 0), |(a, c), &(q, k)| (a + q, c + k));
        if per_query { ((q0 + i) * heads + hh) * self.max_k() + j } else { (k0 + j) * heads + hh }
    }

    fn totals(&self) -> (usize, usize) {
        self.lens
            .iter()
            .fold((0, 0), |(a, b), &(q, k)| (a + q, b + k))
    }

    /// Random inputs and output gradient on the CPU, in the case's dtype.
    pub fn inputs(&self, rng: &mut StdRng) -> Packed {
        let (tq, tk) = self.totals();
        let mut rand_tensor = |shape: &[usize]| {
            let n: usize = shape.iter().product();
            let vals: Vec<f64> = (0..n)
                .map(|_| {
                    2.0 * (rng.random::<f64>() + rng.random::<f64>() + rng.random::<f64>() - 1.5)
                })
                .collect();
            Tensor::from_fn(shape, self.dtype, &Device::Cpu, |i| vals[i]).unwrap()
        };
        let (q_shape, kv_shape) = (
            [tq, self.heads, self.head_dim],
            [tk, self.kv_heads, self.head_dim],
        );
        let mut packed = Packed {
            q: rand_tensor(&q_shape),
            k: rand_tensor(&kv_shape),
            v: rand_tensor(&kv_shape),
            dout: rand_tensor(&q_shape),
            bias: self.bias_heads.map(|hb| self.pad_with_nan(rand_tensor(&self.bias_shape(hb)), hb)),
            mask: self.mask.map(|m| {
                let shape = self.packed_shape(m.per_query, m.heads);
                let keep = (0..shape.iter().product()).map(|_| rng.random_bool(m.density)).collect();
                Tensor::from_vec(keep, &shape, &Device::Cpu).unwrap()
            }),
            pages: None,
            sparse: None,
        };
        packed.pages = self.page_size.map(|ps| self.paged(&packed, ps, rng));
        packed.sparse = self.sparse.as_ref().map(|sp| self.sparse_data(sp, rng));
        packed
    }

    /// The fixed-length call whose batch entries are the sequences, padded to the longest (at
    /// least 1: `prepare_packed`'s lengths).
    fn padded(&self) -> Case {
        let max_q = self.lens.iter().map(|&(q, _)| q).max().unwrap_or(0).max(1);
        Case::new(self.lens.len(), max_q, self.max_k().max(1), self.heads, self.kv_heads, self.head_dim)
    }

    fn sparse_data(&self, sp: &VarlenSparse, rng: &mut StdRng) -> SparseData {
        let padded = self.padded();
        if sp.indices {
            let (shape, idx, keep) = random_indices(rng, &padded);
            let indices = Tensor::from_vec(idx, &shape, &Device::Cpu).unwrap();
            return SparseData { spec: None, indices: Some(indices), shape: [shape[0], shape[1], shape[2], padded.seqlen_k], keep };
        }
        let spec = random_spec(rng, &padded, &sp.kinds);
        let [pb, ph] = spec.planes();
        let keep = spec.data_table(padded.seqlen_q, padded.seqlen_k);
        SparseData { spec: Some(spec), indices: None, shape: [pb, ph, padded.seqlen_q, padded.seqlen_k], keep }
    }

    /// The packed k and v as pages of `page_size` keys: each sequence's pages drawn at random
    /// from a pool with a few spare pages, table entries past a sequence's pages -1, and every
    /// page row no key owns NaN (a read of one shows in the output).
    fn paged(&self, packed: &Packed, page_size: usize, rng: &mut StdRng) -> Pages {
        let need: Vec<usize> = self.lens.iter().map(|&(_, k)| k.div_ceil(page_size)).collect();
        let spare = rng.random_range(0..3);
        let num_pages = need.iter().sum::<usize>() + spare + 1;
        let max_pages = need.iter().copied().max().unwrap_or(0) + rng.random_range(1..3);
        let mut ids: Vec<usize> = (0..num_pages).collect();
        ids.shuffle(rng);
        let mut table = vec![-1i32; self.lens.len() * max_pages];
        let width = self.kv_heads * self.head_dim;
        let (mut owner, mut next, mut k0) = (vec![None; num_pages * page_size], 0, 0);
        for (b, &(_, sk)) in self.lens.iter().enumerate() {
            for (i, page) in ids[next..next + need[b]].iter().enumerate() {
                table[b * max_pages + i] = *page as i32;
                for r in 0..page_size.min(sk - i * page_size) {
                    owner[page * page_size + r] = Some(k0 + i * page_size + r);
                }
            }
            (next, k0) = (next + need[b], k0 + sk);
        }
        // Half the cases: 1-2 NaN rows after each page.
        let pad = if rng.random_bool(0.5) { 0 } else { rng.random_range(1..3) };
        let pages_of = |t: &Tensor| {
            let rows = t.to_f64_vec().unwrap();
            Tensor::from_fn(&[num_pages, page_size + pad, self.kv_heads, self.head_dim], self.dtype, &Device::Cpu, |i| {
                let (page, r) = (i / width / (page_size + pad), i / width % (page_size + pad));
                let owner = if r < page_size { owner[page * page_size + r] } else { None };
                owner.map_or(f64::NAN, |row| rows[row * width + i % width])
            })
            .unwrap()
        };
        Pages { k: pages_of(&packed.k), v: pages_of(&packed.v), pad, table }
    }

    /// The packed call on `inputs` (their device), its band prepared there; on the pages where
    /// the case has a page size (and the inputs its pages).
    pub fn forward(
        &self,
        inputs: &Packed,
        seqs: &SeqLens,
        deterministic: bool,
    ) -> dmattn::Result<Forward> {
        let band = self
            .band
            .map(|b| b.build().prepare(seqs.max_seqlen_q().max(1), seqs.max_seqlen_k().max(1)))
            .transpose()?;
        let pages = match (&inputs.pages, self.page_size) {
            (Some(p), Some(_)) => Some((p.k(), p.v(), PageTable::new(&p.table, self.lens.len(), &inputs.q.device())?)),
            _ => None,
        };
        let mut call = match &pages {
            Some((k, v, table)) => attention(&inputs.q, k, v).kv_pages(table),
            None => attention(&inputs.q, &inputs.k, &inputs.v),
        };
        call = call
            .seqlens(seqs)
            .causal(self.causal)
            .softcap(self.softcap)
            .deterministic(deterministic);
        if let Some(b) = &inputs.bias {
            call = call.bias(b);
        }
        if let Some(m) = &inputs.mask {
            call = call.mask(m);
        }
        let (sparse, indices) = match &inputs.sparse {
            // Index lists alone go through `Attention::indices`.
            Some(SparseData { indices: Some(t), .. }) if self.band.is_none() => (None, Some(t)),
            Some(d) => {
                let data = match (&d.spec, &d.indices) {
                    (Some(spec), _) => spec.build(&inputs.q.device())?,
                    (None, Some(t)) => SparseMask::indices(t),
                    (None, None) => SparseMask::all(),
                };
                let mask = self.band.map_or_else(SparseMask::all, BandCtor::build).and(data);
                (Some(mask.prepare_packed(seqs)?), None)
            }
            None => (band, None),
        };
        if let Some(b) = &sparse {
            call = call.sparse_mask(b);
        }
        if let Some(t) = indices {
            call = call.indices(t);
        }
        call.forward()
    }

    /// Sequence `b` as a fixed-length case with a dense mask for the band and the packed mask
    /// (`mask`: its flags) together, and its inputs.
    fn sequence(&self, inputs: &[Vec<f64>; 4], bias: Option<&[f64]>, mask: Option<&[bool]>, sparse: Option<&SparseData>, b: usize) -> (Case, crate::Inputs, Tensor) {
        let (q0, k0) = self.lens[..b]
            .iter()
            .fold((0, 0), |(a, c), &(q, k)| (a + q, c + k));
        let (sq, sk) = self.lens[b];
        let (qw, kw) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let t = |v: &[f64], at: usize, width: usize, shape: [usize; 4]| {
            Tensor::from_fn(&shape, self.dtype, &Device::Cpu, |i| v[at * width + i]).unwrap()
        };
        let case = Case {
            causal: self.causal,
            softcap: self.softcap,
            dtype: self.dtype,
            bias: self.bias_heads.map(|hb| [1, hb, if self.bias_per_query { sq } else { 1 }, sk]),
            ..Case::new(1, sq, sk, self.heads, self.kv_heads, self.head_dim)
        };
        // The packed bias as the sequence's `[1, hb, {1|sq}, sk]`.
        let seq_bias = bias.zip(self.bias_heads).map(|(v, hb)| {
            let rows = if self.bias_per_query { sq } else { 1 };
            Tensor::from_fn(&[1, hb, rows, sk], self.dtype, &Device::Cpu, |e| {
                let (hh, i, j) = (e / (rows * sk), e / sk % rows, e % sk);
                v[self.bias_index(b, hb, hh, i, j)]
            })
            .unwrap()
        });
        let seq_inputs = crate::Inputs {
            q: t(&inputs[0], q0, qw, case.q_shape()),
            k: t(&inputs[1], k0, kw, case.kv_shape()),
            v: t(&inputs[2], k0, kw, case.kv_shape()),
            mask: None,
            bias: seq_bias,
        };
        let dout = t(&inputs[3], q0, qw, case.q_shape());
        // The band's and the mask's flags as one dense `[1, heads, sq, sk]` mask (causal folded
        // into the band's).
        let h = self.heads;
        let band = self.band.map(|band| MaskSpec::band(band, 0).visible(&case, case.causal));
        let packed = mask.zip(self.mask).map(|(flags, m)| {
            (0..h * sq * sk)
                .map(|e| {
                    let (hh, i, j) = (e / (sq * sk), e / sk % sq, e % sk);
                    flags[self.packed_index(m.per_query, b, m.heads, plane_head(m.heads, h, self.kv_heads, hh), if m.per_query { i } else { 0 }, j)]
                })
                .collect::<Vec<bool>>()
        });
        // The sparse mask's flags: the sequence's plane, its own positions.
        let sparse = sparse.map(|d| {
            let [pb, ph, rows, mk] = d.shape;
            (0..h * sq * sk)
                .map(|e| {
                    let (hh, i, j) = (e / (sq * sk), e / sk % sq, e % sk);
                    let plane = if pb == 1 { 0 } else { b } * ph + plane_head(ph, h, self.kv_heads, hh);
                    d.keep[(plane * rows + if rows == 1 { 0 } else { i }) * mk + j]
                })
                .collect::<Vec<bool>>()
        });
        let and = |a: Option<Vec<bool>>, b: Option<Vec<bool>>| match (a, b) {
            (Some(a), Some(b)) => Some(a.iter().zip(&b).map(|(x, y)| *x && *y).collect()),
            (a, b) => a.or(b),
        };
        let dense = and(and(band, packed), sparse);
        match dense {
            Some(keep) => {
                let shape = [1, h, sq, sk];
                let case = Case { mask: Some(shape), causal: case.causal && self.band.is_none(), ..case };
                let seq_inputs = crate::Inputs { mask: Some(Tensor::from_vec(keep, &shape, &Device::Cpu).unwrap()), ..seq_inputs };
                (case, seq_inputs, dout)
            }
            None => (case, seq_inputs, dout),
        }
    }
}

/// The packed call on `device` against each sequence's fixed-length call on the CPU reference:
/// O within [`gpu_tolerance`] (`tol` on the CPU) by [`rel_err`], LSE within 1e-3 of the largest
/// finite |LSE| and -inf exactly where the reference's is (rows of sequences without keys: O 0,
/// LSE -inf), and with `backward` the gradients within `tol` of the size of their sums, zero for
/// the keys of sequences without queries. Outputs are poisoned: an unwritten element fails.
pub fn check_varlen(
    case: &VarlenCase,
    device: &Device,
    seed: u64,
    backward: bool,
    deterministic: bool,
    tol: f64,
) -> Result<(), TestCaseError> {
    dmattn::set_output_poisoning(true);
    let cpu = case.inputs(&mut seeded_rng(seed));
    let values = [&cpu.q, &cpu.k, &cpu.v, &cpu.dout].map(|t| t.to_f64_vec().unwrap());
    let bias = cpu.bias.as_ref().map(|t| t.to_f64_vec().unwrap());
    let mask: Option<Vec<bool>> = cpu.mask.as_ref().map(|t| t.to_f64_vec().unwrap().into_iter().map(|x| x != 0.0).collect());
    let inputs = cpu.to(device);
    let seqs = case.seqlens(device);
    let fwd = case
        .forward(&inputs, &seqs, deterministic)
        .map_err(|e| TestCaseError::fail(format!("packed forward: {e}")))?;
    let (out, lse) = (fwd.out.to_f64_vec().unwrap(), fwd.lse.to_f64_vec().unwrap());

    // The reference, sequence by sequence, in the packed layouts.
    let (tq, tk) = case.totals();
    let (h, qw, kw) = (
        case.heads,
        case.heads * case.head_dim,
        case.kv_heads * case.head_dim,
    );
    let mut want_out = vec![0.0; tq * qw];
    let mut want_lse = vec![f64::NEG_INFINITY; h * tq];
    let mut want = [vec![0.0; tq * qw], vec![0.0; tk * kw], vec![0.0; tk * kw]];
    let mut sizes = want.clone();
    // dbias in the bias's layout.
    let hb = case.bias_heads.unwrap_or(0);
    let db_len = case.bias_heads.map_or(0, |hb| case.bias_shape(hb).iter().product());
    let (mut want_db, mut size_db) = (vec![0.0; db_len], vec![0.0; db_len]);
    let (mut q0, mut k0) = (0, 0);
    for (b, &(sq, sk)) in case.lens.iter().enumerate() {
        if sq > 0 && sk > 0 {
            let (seq_case, seq_inputs, dout) = case.sequence(&values, bias.as_deref(), mask.as_deref(), cpu.sparse.as_ref(), b);
            let r = seq_case
                .forward(&seq_inputs)
                .map_err(|e| TestCaseError::fail(format!("reference of sequence {b}: {e}")))?;
            want_out[q0 * qw..][..sq * qw].copy_from_slice(&r.out.to_f64_vec().unwrap());
            let l = r.lse.to_f64_vec().unwrap();
            for hh in 0..h {
                want_lse[hh * tq + q0..][..sq].copy_from_slice(&l[hh * sq..][..sq]);
            }
            if backward {
                let g = grads_vec(&r.backward(&dout).unwrap());
                let (spec, data) = (naive::Spec::of(&seq_case), naive::Data::of(&seq_inputs));
                let m = gradient_sizes(&spec, &data, &naive::forward(&spec, &data), &dout);
                for (i, (at, w)) in [(q0, qw), (k0, kw), (k0, kw)].into_iter().enumerate() {
                    let rows = if i == 0 { sq } else { sk };
                    want[i][at * w..][..rows * w].copy_from_slice(g[i].as_ref().unwrap());
                    sizes[i][at * w..][..rows * w].copy_from_slice(m[i].as_ref().unwrap());
                }
                if let (Some(gb), Some(mb)) = (&g[3], &m[3]) {
                    let rows = if case.bias_per_query { sq } else { 1 };
                    for (hh, i, j) in (0..hb).flat_map(|hh| (0..rows).flat_map(move |i| (0..sk).map(move |j| (hh, i, j)))) {
                        let at = case.bias_index(b, hb, hh, i, j);
                        want_db[at] = gb[(hh * rows + i) * sk + j];
                        size_db[at] = mb[(hh * rows + i) * sk + j];
                    }
                }
            }
        }
        (q0, k0) = (q0 + sq, k0 + sk);
    }
    prop_assert!(
        out.iter().all(|x| x.is_finite()),
        "non-finite output (unwritten or NaN) for {case:?}"
    );
    let err = rel_err(&out, &want_out);
    prop_assert!(err <= tol, "out rel err {err:.3e} > {tol:.3e} for {case:?}");
    let scale = want_lse
        .iter()
        .filter(|x| x.is_finite())
        .fold(1.0f64, |m, x| m.max(x.abs()));
    let lse_err = max_abs_err_inf(&lse, &want_lse);
    prop_assert!(
        lse_err <= 1e-3 * scale,
        "lse max err {lse_err:.3e} for {case:?}"
    );
    if backward {
        let got = grads_vec(
            &fwd.backward(&inputs.dout)
                .map_err(|e| TestCaseError::fail(format!("packed backward: {e}")))?,
        );
        let [dq, dk, dv] = want;
        let [sq, sk, sv] = sizes;
        compare_gradients(
            case,
            &got,
            &[Some(dq), Some(dk), Some(dv), case.bias_heads.map(|_| want_db)],
            &[Some(sq), Some(sk), Some(sv), case.bias_heads.map(|_| size_db)],
            tol,
        )?;
        // A query-based bias's columns past its row's keys: exactly zero.
        if let (Some(db), true) = (&got[3], case.bias_per_query) {
            let (mk, keys) = (case.max_k(), case.row_keys());
            let stray = db.iter().enumerate().find(|&(i, &x)| i % mk >= keys[i / (hb * mk)] && x != 0.0);
            prop_assert!(stray.is_none(), "dbias {stray:?} past its row's keys is not zero for {case:?}");
        }
        // Keys of sequences no query reads: exactly zero.
        let mut k0 = 0;
        for &(sq, sk) in &case.lens {
            if sq == 0 {
                for g in &got[1..3] {
                    prop_assert!(
                        g.as_ref().unwrap()[k0 * kw..][..sk * kw]
                            .iter()
                            .all(|&x| x == 0.0),
                        "dk/dv of a sequence without queries not zero for {case:?}"
                    );
                }
                if let (Some(db), false) = (&got[3], case.bias_per_query) {
                    prop_assert!(db[k0 * hb..][..sk * hb].iter().all(|&x| x == 0.0), "dbias of a sequence without queries not zero for {case:?}");
                }
            }
            k0 += sk;
        }
    }
    Ok(())
}

/// A packed batch's sparse mask with data: index lists, or a score mask (any, key-side ones
/// included) and up to two block masks (bitset, dense blocks, BCSR; blocks of 64 or 128).
pub fn varlen_sparse() -> impl Strategy<Value = VarlenSparse> {
    let block = || prop::sample::select(vec![64usize, 128]);
    let score = prop::sample::select(vec![None, Some(Kind::Dense), Some(Kind::Packed), Some(Kind::KeySide), Some(Kind::KeySidePacked)]);
    let blocks = prop::collection::vec(prop_oneof![block().prop_map(Kind::Bitset), block().prop_map(Kind::DenseBlocks), block().prop_map(Kind::Bcsr)], 0..=2);
    let parts = (score, blocks).prop_map(|(score, blocks)| {
        let kinds: Vec<Kind> = score.into_iter().chain(blocks).collect();
        VarlenSparse { kinds: if kinds.is_empty() { vec![Kind::Dense] } else { kinds }, indices: false }
    });
    prop_oneof![3 => parts, 1 => Just(VarlenSparse { kinds: Vec::new(), indices: true })]
}

/// A sequence length: often 0, 1 or around a tile edge.
fn seq_len(max: usize) -> impl Strategy<Value = usize> {
    prop_oneof![3 => 0usize..=max, 1 => prop::sample::select(vec![0, 1, 63, 64, 65, 127, 128, 129, 192, 257.min(max)])]
}

/// Random packed batches: 1-6 sequences of lengths 0..=`max_seqlen` (queries and keys drawn
/// apart), 16-bit dtypes, every head dim, GQA, causal, windows, softcap, and key-side or
/// query-based biases and masks (each layout with each: the mixed ones too; masks hiding every
/// key to none), in half the cases a sparse mask with data ([`varlen_sparse`]) instead of the
/// bool mask, with a seed.
pub fn varlen_cases(max_seqlen: usize) -> impl Strategy<Value = (VarlenCase, u64)> {
    let band = prop_oneof![
        4 => Just(None),
        1 => (0usize..300).prop_map(|l| Some(BandCtor::CausalWindow(l))),
        1 => (prop::option::of(0usize..200), prop::option::of(0usize..200)).prop_map(|(l, r)| Some(BandCtor::Window(l, r))),
    ];
    (
        prop::collection::vec((seq_len(max_seqlen), seq_len(max_seqlen)), 1..=6),
        (
            prop::sample::select(vec![DType::BF16, DType::F16]),
            prop::sample::select(vec![32usize, 64, 96, 128, 192, 256]),
        ),
        (1usize..=2, prop::sample::select(vec![1usize, 2, 3]), prop::sample::select(vec![None, Some(0usize), Some(1), Some(2)]), any::<bool>()),
        (
            any::<bool>(),
            band,
            prop_oneof![3 => Just(0.0), 1 => Just(20.0)],
            any::<u64>(),
        ),
        (
            prop::sample::select(vec![None, None, Some(0usize), Some(1), Some(2)]),
            any::<bool>(),
            prop::sample::select(vec![0.0, 0.02, 0.3, 0.8, 1.0]),
            prop_oneof![1 => Just(None), 1 => varlen_sparse().prop_map(Some)],
        ),
    )
        .prop_map(
            |(lens, (dtype, head_dim), (kv_heads, group, bias, bias_per_query), (causal, band, softcap, seed), (mask, mask_per_query, density, sparse))| {
                // A key-side or query-based bias and mask with 1, kv_heads or heads heads; a
                // sparse mask with data rather than the bool mask.
                let heads = |i: usize| [1, kv_heads, kv_heads * group][i];
                let bias_heads = bias.map(heads);
                let mask = mask.filter(|_| sparse.is_none()).map(|i| VarlenMask { heads: heads(i), per_query: mask_per_query, density });
                (
                    VarlenCase {
                        lens,
                        heads: kv_heads * group,
                        kv_heads,
                        head_dim,
                        causal,
                        band,
                        softcap,
                        bias_heads,
                        bias_per_query,
                        mask,
                        dtype,
                        page_size: None,
                        sparse,
                    },
                    seed,
                )
            },
        )
}
