//! Validation shared by every backend: shapes, broadcasts, dtypes, devices and parameters of one
//! attention call, checked once into a [`Problem`].
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::pages::PageTable;
use crate::seqlens::SeqLens;
use crate::sparse::PreparedMask;
use crate::tensor::Tensor;
use dmattn_abi::Band;

/// Sizes of one attention call: q `[batch, seqlen_q, heads, head_dim]`,
/// k/v `[batch, seqlen_k, kv_heads, head_dim]`; for a packed batch ([`SeqLens`]) the number of
/// sequences and the longest sequence's lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl Dims {
    /// Query heads sharing one kv head.
    pub fn kv_group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Index of the mask/bias head that query head `h` reads, for a mask/bias with `n` heads
    /// (1, `kv_heads` or `heads`).
    pub fn broadcast_head(&self, n: usize, h: usize) -> usize {
        if n == 1 {
            0
        } else if n == self.heads {
            h
        } else {
            h / self.kv_group()
        }
    }
}

/// A validated attention call.
#[derive(Clone, Debug)]
pub struct Problem {
    pub dims: Dims,
    pub dtype: DType,
    /// The `[{1|b}, {1|hk|h}]` planes of the mask's data part (dense, bits or blocks).
    pub mask: Option<[usize; 2]>,
    pub bias: Option<[usize; 4]>,
    /// The parametric rule: the sparse mask's band, with causal.
    pub band: Band,
    pub scale: f64,
    /// 0 = off.
    pub softcap: f64,
    /// Backward in a fixed order (bit-identical runs).
    pub deterministic: bool,
    /// A packed variable-length batch: q/k/v are `[total, heads, head_dim]`, and a mask or bias
    /// one of [`PackedLayout`]'s layouts.
    pub seqs: Option<SeqLens>,
    /// A packed batch's bias layout.
    pub packed_bias: Option<PackedLayout>,
    /// A packed batch's mask layout (its planes are `[1, heads]` in [`Problem::mask`]).
    pub packed_mask: Option<PackedLayout>,
    /// A packed batch's K/V as pages of a paged KV cache (forward only).
    pub pages: Option<KvPages>,
}

/// K/V as `[num_pages, page_size, kv_heads, head_dim]` pages, each sequence's keys where its
/// row of `table` says.
#[derive(Clone, Debug)]
pub struct KvPages {
    pub table: PageTable,
    pub page_size: usize,
}

fn shape4(t: &Tensor, arg: &'static str, expected: &str) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(t.shape()).map_err(|_| Error::Shape { arg, expected: expected.into(), got: t.shape().to_vec() })
}

/// Checks `t` is `[{1|b}, {1|hk|h}, {1|sq}, {1|sk}]`.
fn broadcast_shape(t: &Tensor, arg: &'static str, d: &Dims) -> Result<[usize; 4]> {
    let expected = format!(
        "[{{1|{}}}, {{1|{}|{}}}, {{1|{}}}, {{1|{}}}] (broadcastable to [batch, heads, seqlen_q, seqlen_k])",
        d.batch, d.kv_heads, d.heads, d.seqlen_q, d.seqlen_k
    );
    let s = shape4(t, arg, &expected)?;
    let ok = (s[0] == 1 || s[0] == d.batch)
        && (s[1] == 1 || s[1] == d.kv_heads || s[1] == d.heads)
        && (s[2] == 1 || s[2] == d.seqlen_q)
        && (s[3] == 1 || s[3] == d.seqlen_k);
    if ok { Ok(s) } else { Err(Error::Shape { arg, expected, got: s.to_vec() }) }
}

pub struct Inputs<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub mask: Option<&'a Tensor>,
    pub indices: Option<&'a Tensor>,
    pub sparse: Option<&'a PreparedMask>,
    pub bias: Option<&'a Tensor>,
    pub causal: bool,
    pub scale: Option<f64>,
    pub softcap: f64,
    pub deterministic: bool,
    pub seqs: Option<&'a SeqLens>,
    pub pages: Option<&'a PageTable>,
}

/// q and k as `[batch, seqlen, heads, head_dim]`: their shapes, or for a packed batch
/// (`[total, heads, head_dim]`, checked against `seqs`) the sequences and the longest lengths.
fn qk_shapes(inp: &Inputs) -> Result<([usize; 4], [usize; 4])> {
    let Some(seqs) = inp.seqs else {
        if inp.pages.is_some() {
            return Err(Error::Param { arg: "block_table", reason: "paged K/V need a packed batch: give its SeqLens (.seqlens)".into() });
        }
        let q = shape4(inp.q, "q", "[batch, seqlen_q, heads, head_dim]")?;
        let kv_expected = format!("[{}, seqlen_k, kv_heads, {}] (batch and head_dim of q)", q[0], q[3]);
        let k = shape4(inp.k, "k", &kv_expected)?;
        if k[0] != q[0] || k[3] != q[3] {
            return Err(Error::Shape { arg: "k", expected: kv_expected, got: k.to_vec() });
        }
        return Ok((q, k));
    };
    let packed = |t: &Tensor, arg: &'static str, total: usize, head_dim: Option<usize>| -> Result<[usize; 3]> {
        let expected = match head_dim {
            None => format!("[{total}, heads, head_dim] (total rows = the last entry of cu_seqlens_q)"),
            Some(d) => format!("[{total}, kv_heads, {d}] (total rows = the last entry of cu_seqlens_k; head_dim of q)"),
        };
        match <[usize; 3]>::try_from(t.shape()) {
            Ok(s) if s[0] == total && head_dim.is_none_or(|d| s[2] == d) => Ok(s),
            _ => Err(Error::Shape { arg, expected, got: t.shape().to_vec() }),
        }
    };
    let q = packed(inp.q, "q", seqs.total_q(), None)?;
    let k = match inp.pages {
        None => packed(inp.k, "k", seqs.total_k(), Some(q[2]))?,
        Some(_) => {
            let [_, _, kv_heads, head_dim] = paged_shape(inp.k, q[2])?;
            [seqs.total_k(), kv_heads, head_dim]
        }
    };
    if !seqs.device().same(&inp.q.device()) {
        return Err(Error::Device { arg: "seqlens", expected: format!("{} (the device of q)", inp.q.device()), got: seqs.device().to_string() });
    }
    let b = seqs.batch();
    Ok(([b, seqs.max_seqlen_q(), q[1], q[2]], [b, seqs.max_seqlen_k(), k[1], k[2]]))
}

/// Paged k `[num_pages, page_size, kv_heads, head_dim]`: a page size the kernels take (a power
/// of two up to 2^31: a key's page and row in it are a 32-bit shift and mask, and keys are
/// counted in 32 bits), at least one page.
fn paged_shape(k: &Tensor, head_dim: usize) -> Result<[usize; 4]> {
    let expected = format!("[num_pages, page_size, kv_heads, {head_dim}] (page_size a power of two up to 2^31; head_dim of q)");
    match <[usize; 4]>::try_from(k.shape()) {
        Ok(s) if s[3] == head_dim && s[1].is_power_of_two() && s[1] <= 1 << 31 && s[0] > 0 && s[2] > 0 => Ok(s),
        _ => Err(Error::Shape { arg: "k", expected, got: k.shape().to_vec() }),
    }
}

/// A packed batch's K/V pages (`qk_shapes` took no pages without one): the table serves the
/// sequences with k's pages, on q's device.
fn kv_pages(inp: &Inputs) -> Result<Option<KvPages>> {
    let (Some(table), Some(seqs)) = (inp.pages, inp.seqs) else { return Ok(None) };
    if !table.device().same(&inp.q.device()) {
        return Err(Error::Device { arg: "block_table", expected: format!("{} (the device of q)", inp.q.device()), got: table.device().to_string() });
    }
    let (num_pages, page_size) = (inp.k.shape()[0], inp.k.shape()[1]);
    table.check(seqs, num_pages, page_size)?;
    Ok(Some(KvPages { table: table.clone(), page_size }))
}

/// The layout of a packed batch's bias or mask, chosen by its rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedLayout {
    /// `[total_k, {1|hk|h}]`: each sequence's queries see its keys' values (a bias is `[1,
    /// heads, 1, total_k]` in [`Problem::bias`]).
    KeySide,
    /// `[total_q, {1|hk|h}, max_seqlen_k]`: a value per query and key, keys counted from the
    /// sequence's first (`[1, heads, total_q, max_seqlen_k]`); columns past a sequence's keys
    /// are never read.
    PerQuery,
}

/// A packed batch's bias or mask (`arg`): key-side `[total_k, {1|hk|h}]` or query-based
/// `[total_q, {1|hk|h}, max_seqlen_k]`, as the broadcast shape its kernels and reference read
/// (see [`PackedLayout`]).
fn packed_layout(t: &Tensor, arg: &'static str, seqs: &SeqLens, d: &Dims) -> Result<([usize; 4], PackedLayout)> {
    let heads_ok = |h: usize| h == 1 || h == d.kv_heads || h == d.heads;
    let (tq, tk, mk) = (seqs.total_q(), seqs.total_k(), seqs.max_seqlen_k());
    match *t.shape() {
        [rows, heads] if rows == tk && heads_ok(heads) => Ok(([1, heads, 1, tk], PackedLayout::KeySide)),
        [rows, heads, keys] if rows == tq && heads_ok(heads) && keys == mk => Ok(([1, heads, tq, mk], PackedLayout::PerQuery)),
        _ => Err(Error::Shape {
            arg,
            expected: format!(
                "[{tk}, {{1|{hk}|{h}}}] (key-side: total_k rows) or [{tq}, {{1|{hk}|{h}}}, {mk}] (query-based: total_q rows, max_seqlen_k keys)",
                hk = d.kv_heads,
                h = d.heads
            ),
            got: t.shape().to_vec(),
        }),
    }
}

impl Problem {
    /// Checks a call's inputs, in this order (the first failure is the error): the shapes of q,
    /// k and v, the sequence lengths and pages (with their devices), the dtypes, the mask, index
    /// lists and sparse mask (with its device), what paged K/V and causal exclude, the bias, the
    /// devices of k, v, mask, index lists and bias, then scale and softcap.
    pub fn new(inp: &Inputs) -> Result<Problem> {
        let dims = qkv_dims(inp)?;
        let pages = kv_pages(inp)?;
        let dtype = qkv_dtype(inp)?;
        let device = inp.q.device();
        let (mask, packed_mask) = mask_planes(inp, &dims)?;
        let (mask, packed_mask) = index_planes(inp, &dims, mask, packed_mask)?;
        let packed_mask = sparse_packing(inp, packed_mask)?;
        let (mask, mut band) = sparse_planes(inp, &dims, mask, &device)?;
        if pages.is_some() && packed_mask == Some(PackedLayout::PerQuery) {
            let what = "a query-based mask, index lists or a sparse mask with data with paged K/V (a key-side mask is taken)".into();
            return Err(Error::Unsupported { what, backend: "CPU or CUDA" });
        }
        if inp.causal {
            if band.compress != 0 {
                return Err(Error::Param {
                    arg: "causal",
                    reason: "set with a compress_causal sparse mask, whose diagonal replaces the causal one".into(),
                });
            }
            band.right = 0;
        }
        let (bias, packed_bias) = bias_shape(inp, &dims)?;
        let operands = [("k", Some(inp.k)), ("v", Some(inp.v)), ("mask", inp.mask), ("indices", inp.indices), ("bias", inp.bias)];
        for (arg, t) in operands.into_iter().filter_map(|(arg, t)| Some((arg, t?))) {
            if !t.device().same(&device) {
                return Err(Error::Device { arg, expected: format!("{device} (the device of q)"), got: t.device().to_string() });
            }
        }
        let scale = inp.scale.unwrap_or(1.0 / (dims.head_dim as f64).sqrt());
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::Param { arg: "scale", reason: format!("{scale} is not a finite positive number") });
        }
        if !(inp.softcap.is_finite() && inp.softcap >= 0.0) {
            return Err(Error::Param { arg: "softcap", reason: format!("{} is not finite and >= 0", inp.softcap) });
        }
        Ok(Problem { dims, dtype, mask, bias, band, scale, softcap: inp.softcap, deterministic: inp.deterministic, seqs: inp.seqs.cloned(), packed_bias, packed_mask, pages })
    }
}

/// The problem's dimensions from q and k (v must have k's shape): none empty (a packed batch's
/// sequences may be), the query heads a multiple of the kv heads.
fn qkv_dims(inp: &Inputs) -> Result<Dims> {
    let (q, k) = qk_shapes(inp)?;
    let [batch, seqlen_q, heads, head_dim] = q;
    if inp.v.shape() != inp.k.shape() {
        return Err(Error::Shape { arg: "v", expected: format!("{:?} (the shape of k)", inp.k.shape()), got: inp.v.shape().to_vec() });
    }
    let [_, seqlen_k, kv_heads, _] = k;
    // A packed batch's sequences may be empty; heads and head_dim may not.
    let empty = if inp.seqs.is_some() { q[2] == 0 || q[3] == 0 || k[2] == 0 } else { q.iter().chain(&k).any(|&n| n == 0) };
    if empty {
        let (arg, got) = if q.contains(&0) { ("q", q) } else { ("k", k) };
        return Err(Error::Shape { arg, expected: "every dimension at least 1".into(), got: got.to_vec() });
    }
    if heads % kv_heads != 0 {
        return Err(Error::Shape { arg: "k", expected: format!("kv_heads dividing the {heads} query heads"), got: inp.k.shape().to_vec() });
    }
    Ok(Dims { batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim })
}

/// q's dtype, a float one, which k and v share.
fn qkv_dtype(inp: &Inputs) -> Result<DType> {
    let dtype = inp.q.dtype();
    if !dtype.is_float() {
        return Err(Error::DType { arg: "q", expected: "f16, bf16, f32 or f64".into(), got: dtype });
    }
    for (arg, t) in [("k", inp.k), ("v", inp.v)] {
        if t.dtype() != dtype {
            return Err(Error::DType { arg, expected: format!("{dtype:?} (the dtype of q)"), got: t.dtype() });
        }
    }
    Ok(dtype)
}

/// The bool mask's (batch, heads) planes, and for a packed batch its layout.
fn mask_planes(inp: &Inputs, dims: &Dims) -> Result<(Option<[usize; 2]>, Option<PackedLayout>)> {
    let Some(m) = inp.mask else { return Ok((None, None)) };
    if m.dtype() != DType::Bool {
        return Err(Error::DType { arg: "mask", expected: "Bool".into(), got: m.dtype() });
    }
    Ok(match inp.seqs {
        None => {
            let s = broadcast_shape(m, "mask", dims)?;
            (Some([s[0], s[1]]), None)
        }
        Some(seqs) => {
            let (s, layout) = packed_layout(m, "mask", seqs, dims)?;
            (Some([1, s[1]]), Some(layout))
        }
    })
}

/// Index lists in place of a mask (never beside one or a sparse mask): their (batch, heads)
/// planes; a packed batch's are prepared per sequence into the query-based layout.
fn index_planes(
    inp: &Inputs,
    dims: &Dims,
    mask: Option<[usize; 2]>,
    packed_mask: Option<PackedLayout>,
) -> Result<(Option<[usize; 2]>, Option<PackedLayout>)> {
    let Some(t) = inp.indices else { return Ok((mask, packed_mask)) };
    if mask.is_some() || inp.sparse.is_some() {
        return Err(Error::Param { arg: "indices", reason: "given with a mask or a sparse mask: pass one of them".into() });
    }
    let Dims { batch, seqlen_q, heads, kv_heads, .. } = *dims;
    let s = crate::sparse::check_indices_shape(t, seqlen_q)?;
    if !((s[0] == 1 || s[0] == batch) && (s[1] == 1 || s[1] == kv_heads || s[1] == heads)) {
        let expected = format!("[{{1|{batch}}}, {{1|{kv_heads}|{heads}}}, {{1|{seqlen_q}}}, w] (key indices, -1 = padding)");
        return Err(Error::Shape { arg: "indices", expected, got: s.to_vec() });
    }
    Ok(if inp.seqs.is_some() { (Some([1, s[1]]), Some(PackedLayout::PerQuery)) } else { (Some([s[0], s[1]]), packed_mask) })
}

/// A sparse mask with data was prepared for this call's kind (packed for this batch's lengths,
/// or fixed-length); a packed batch's then reads it in the query-based layout.
fn sparse_packing(inp: &Inputs, packed_mask: Option<PackedLayout>) -> Result<Option<PackedLayout>> {
    let Some(sp) = inp.sparse.filter(|sp| sp.from_data) else { return Ok(packed_mask) };
    match (inp.seqs, &sp.seqs) {
        (Some(seqs), Some(prepared)) if seqs.same_lengths(prepared) => Ok(Some(PackedLayout::PerQuery)),
        (Some(_), _) => Err(Error::Param {
            arg: "sparse_mask",
            reason: "its data was not prepared for this packed batch: prepare it with SparseMask::prepare_packed(&seqlens)".into(),
        }),
        (None, Some(_)) => Err(Error::Param {
            arg: "sparse_mask",
            reason: "prepared for a packed batch (prepare_packed): prepare it with SparseMask::prepare for a fixed-length call".into(),
        }),
        (None, None) => Ok(packed_mask),
    }
}

/// The sparse mask's band (all keys without one) and, where it has data, its planes in place of
/// `mask`'s. A parametric rule ANDs with a bool mask as causal does; parts with data combine
/// only when prepared, so a bool mask beside them is an error.
fn sparse_planes(inp: &Inputs, dims: &Dims, mask: Option<[usize; 2]>, device: &Device) -> Result<(Option<[usize; 2]>, Band)> {
    let Some(sp) = inp.sparse else { return Ok((mask, Band::ALL)) };
    if mask.is_some() && sp.from_data {
        return Err(Error::Param {
            arg: "mask",
            reason: "given with a sparse mask that has data: combine them (SparseMask::dense(mask).and(..)) and prepare that".into(),
        });
    }
    let Dims { batch, seqlen_q, seqlen_k, heads, kv_heads, .. } = *dims;
    // A packed batch's: at least its longest sequences' (preparing clamps a rule only to the
    // lengths it is prepared for, so longer ones are exact for each sequence).
    let fits = match inp.seqs {
        None => (sp.seqlen_q, sp.seqlen_k) == (seqlen_q, seqlen_k),
        Some(_) => sp.seqlen_q >= seqlen_q && sp.seqlen_k >= seqlen_k,
    };
    if !fits {
        return Err(Error::Shape {
            arg: "sparse_mask",
            expected: format!("prepared for seqlen_q {seqlen_q} and seqlen_k {seqlen_k}"),
            got: vec![sp.seqlen_q, sp.seqlen_k],
        });
    }
    let [pb, ph] = sp.planes;
    if !((pb == 1 || pb == batch) && (ph == 1 || ph == kv_heads || ph == heads)) {
        return Err(Error::Shape {
            arg: "sparse_mask",
            expected: format!("planes [{{1|{batch}}}, {{1|{kv_heads}|{heads}}}] (batch, heads)"),
            got: sp.planes.to_vec(),
        });
    }
    if sp.from_data && !sp.device().same(device) {
        return Err(Error::Device { arg: "sparse_mask", expected: format!("{device} (the device of q)"), got: sp.device().to_string() });
    }
    Ok((sp.data.as_ref().map(|_| sp.planes).or(mask), sp.band))
}

/// The bias's broadcast shape, and for a packed batch its layout.
fn bias_shape(inp: &Inputs, dims: &Dims) -> Result<(Option<[usize; 4]>, Option<PackedLayout>)> {
    let Some(b) = inp.bias else { return Ok((None, None)) };
    if !b.dtype().is_float() {
        return Err(Error::DType { arg: "bias", expected: "f16, bf16, f32 or f64".into(), got: b.dtype() });
    }
    Ok(match inp.seqs {
        None => (Some(broadcast_shape(b, "bias", dims)?), None),
        Some(seqs) => {
            let (shape, layout) = packed_layout(b, "bias", seqs, dims)?;
            (Some(shape), Some(layout))
        }
    })
}
