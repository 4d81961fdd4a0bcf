//! Gather attention: a mask that does not vary along the queries (`[.., .., 1, sk]`) keeps the same
//! keys for every query of a plane, so the call runs as attention over those keys alone. Preparing
//! the mask compacts each plane's kept keys into an ascending list, with each key's rank (kept keys
//! at or before it), reading nothing back. Each forward runs the forward's gather variant, which
//! reads K and V rows and a key-side bias at the listed keys (a bias with a query dimension is
//! gathered along the lists first), and finds each query row's run of visible kept keys from two
//! ranks of the band's ends (causal stays causal on the original positions). The backward reads
//! the lists' lengths back once, then runs the ordinary kernels over the gathered keys, whose mask is written from the band on the original positions,
//! and scatters dK, dV and dbias back (keys no query sees get zeros). Work and memory are
//! O(queries x kept keys) instead of O(queries x keys).
use super::launch::{Launch, launch};
use super::{BACKEND, FwdMask, capturing, device_elem};
use crate::attention::{Forward, ForwardBuffers, GradientBuffers, Gradients, Saved};
use crate::device::CudaDevice;
use crate::dtype::DType::{Bool, U8};
use crate::error::{Error, Result};
use crate::memory::DeviceBuffer;
use crate::problem::{Dims, Problem};
use crate::sparse::{MaskData, PreparedMask as Prepared};
use crate::tensor::Tensor;
use dmattn_abi::{
    BLOCK_MAP_K, BLOCK_MAP_Q, Band, COMPACT_KEYS_PER_THREAD, COMPACT_THREADS, GATHER_THREADS, GatherMaskParams, GatherParams, INDICES_ROW_SMEM, IndicesParams, KeyCompactParams, KeyLists, ListsBand, ScatterParams, View4,
    names,
};
use std::sync::{Arc, OnceLock};

/// Bytes of a gathered element (the CUDA kernels' f16 and bf16).
const ELEM: u64 = 2;

/// The kept keys of each plane `[mb, mh]` of a query-broadcast mask, on the device.
pub(crate) struct KeyListsBuf {
    /// `[mb, mh]`.
    pub planes: [usize; 2],
    pub seqlen_k: usize,
    /// One allocation (one call's worth of allocator work) holding the three arrays below.
    buf: DeviceBuffer,
    /// i32 `[planes, sk]`: each plane's kept keys ascending, then -1.
    pos: u64,
    /// i32 `[planes, sk]`: kept keys at or before each key (a kept key's place in `pos` is its
    /// rank less one).
    ranks: u64,
    /// u32 `[planes]`: the lists' lengths (then the compaction's chunk counts).
    counts: u64,
    /// The mask compacted, for the dense-tile form (see [`KeyListsBuf::dense_tiles`]).
    mask: Tensor,
    packed: bool,
    seqlen_q: usize,
    /// The longest list, read back on first use.
    longest: OnceLock<usize>,
    dense: OnceLock<super::PreparedMask>,
}

impl KeyListsBuf {
    pub fn memory_bytes(&self) -> usize {
        self.buf.bytes()
    }

    /// Elements between planes of the lists and ranks (`KeyCompactParams::plane_stride`).
    fn plane_stride(&self) -> usize {
        stride_for(self.seqlen_k)
    }

    /// The longest list's kept keys (0: the mask hides every key). Read back from the device once
    /// (waits for it).
    pub fn longest(&self) -> Result<usize> {
        if let Some(&n) = self.longest.get() {
            return Ok(n);
        }
        let [mb, mh] = self.planes;
        let host = self.buf.to_host((self.counts - self.buf.ptr()) as usize, 4 * mb * mh)?;
        let n = host.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")) as usize).max().unwrap_or(0);
        Ok(*self.longest.get_or_init(|| n))
    }

    /// Keys per plane of the gathered problem: the longest list rounded up to a 64-key block (one
    /// block where every list is empty). Reads the lengths back once.
    fn width(&self) -> Result<usize> {
        Ok(self.longest()?.div_ceil(BLOCK_MAP_K as usize).max(1) * BLOCK_MAP_K as usize)
    }

    /// Gathered keys per plane in the backward: [`KeyListsBuf::width`], where that is at most
    /// `GATHER_MAX_DENSITY` of the keys (else the backward runs on dense tiles).
    pub fn backward_width(&self) -> Result<Option<usize>> {
        let width = self.width()?;
        Ok((width as f64 <= GATHER_MAX_DENSITY * self.seqlen_k as f64).then_some(width))
    }

    /// The mask in the dense-tile form (block classes and packed bits), made on first use: the
    /// backward of a mask keeping more than `GATHER_MAX_DENSITY` of the keys, or of a call on a
    /// stream being captured into a CUDA graph (where nothing may be read back), runs on it.
    pub fn dense_tiles(&self, dev: &CudaDevice) -> Result<super::PreparedMask> {
        if let Some(m) = self.dense.get() {
            return Ok(m.clone());
        }
        let m = super::prepare::pack_score_mask(dev, &self.mask, self.packed, self.seqlen_q, self.seqlen_k)?;
        Ok(self.dense.get_or_init(|| m).clone())
    }

    /// The lists at `at` (`pos` or `ranks`) as read by an operand whose `(batch,
    /// head)` plane is `(x, y)`, `y` counting `heads` heads of a problem with `dims`.
    fn lists(&self, at: u64, heads: usize, dims: &Dims) -> KeyLists {
        let [mb, mh] = self.planes;
        let sk = self.plane_stride() as u64;
        // The mask's heads are 1, kv_heads or heads; an operand with query heads reads a kv-head
        // mask's plane through the group.
        let head_div = source_head_div(dims, mh, heads);
        KeyLists {
            ptr: at,
            batch: if mb > 1 { mh as u64 * sk } else { 0 },
            head: if mh > 1 { sk } else { 0 },
            head_div,
            _pad: 0,
        }
    }
}

/// Keys the gathered backward keeps at most, as a fraction of all keys: above it the dense-tile
/// path (whose block classes skip key tiles without a kept key) is used. The gathered path's cost
/// is its width in 64-key tiles plus the gathers, scatters and its mask, about one tile's work per
/// query tile. The forward gathers at any density: its gather variant visits only the tiles of
/// each query tile's run of kept keys.
const GATHER_MAX_DENSITY: f64 = 0.5;

/// Elements per plane of key lists over `sk` keys: whole 64-key blocks, so that a gathered problem
/// of the longest list rounded up to a block reads only the plane's own entries.
fn stride_for(sk: usize) -> usize {
    sk.next_multiple_of(BLOCK_MAP_K as usize)
}

/// Compacts a query-broadcast score mask (bool or bit-packed, `[mb, mh, 1, {1|sk}]`) for calls with
/// `sq` queries into key lists and ranks, queued on the stream with nothing read back (so also
/// inside a CUDA graph capture). `None` for a mask it does not take.
pub(crate) fn compact(dev: &CudaDevice, mask: &Tensor, packed: bool, sq: usize, sk: usize) -> Result<Option<KeyListsBuf>> {
    let s = mask.shape();
    if s.len() != 4 || s[2] != 1 || s[3] == 1 || mask.dtype() != if packed { U8 } else { Bool } {
        return Ok(None);
    }
    if packed && mask.strides()[3] != 1 {
        return Err(Error::Layout { arg: "packed_bits", backend: BACKEND, reason: "the bytes of a row must be contiguous".into() });
    }
    let (mb, mh) = (s[0], s[1]);
    let planes = mb * mh;
    // Planes run along grid y.
    if planes > 65535 {
        return Ok(None);
    }
    let stream = dev.stream();
    let stride = stride_for(sk);
    let chunks = sk.div_ceil((COMPACT_THREADS * COMPACT_KEYS_PER_THREAD) as usize);
    // pos and ranks (whole 64-key blocks per plane: 256-byte aligned), then the counts.
    let array = (4 * planes * stride) as u64;
    let buf = DeviceBuffer::uninit(stream, 2 * array as usize + 4 * planes * (1 + chunks))?;
    let (pos, ranks, counts) = (buf.ptr(), buf.ptr() + array, buf.ptr() + 2 * array);
    let params = KeyCompactParams {
        mask: super::broadcast_view(mask),
        pos,
        ranks,
        counts,
        chunk_counts: counts + 4 * planes as u64,
        dims: [mb as u32, mh as u32, sk as u32],
        packed: packed as u32,
        plane_stride: stride as u32,
        _pad: 0,
    };
    let grid = (chunks as u32, planes as u32, 1);
    launch(dev, &Launch::kernel(names::KEY_COUNT, grid, COMPACT_THREADS, 4 * 33), params)?;
    launch(dev, &Launch::kernel(names::KEY_COMPACT, grid, COMPACT_THREADS, 4 * 33), params)?;
    Ok(Some(KeyListsBuf {
        planes: [mb, mh],
        seqlen_k: sk,
        buf,
        pos,
        ranks,
        counts,
        mask: mask.clone(),
        packed,
        seqlen_q: sq,
        longest: OnceLock::new(),
        dense: OnceLock::new(),
    }))
}

/// A call rewritten over gathered keys: the problem and operands the kernels run on, and what the
/// backward needs to scatter its gradients back.
struct GatheredCall {
    problem: Problem,
    saved: Saved,
    lists: Arc<KeyListsBuf>,
    /// How the gathered problem's bias was made from the call's: `Some(true)` gathered along the
    /// key lists, `Some(false)` copied to every query head; `None`: it is the call's own (or none).
    bias_lists: Option<bool>,
}

/// Strides in bytes of a contiguous `dims` array.
fn contiguous_bytes(dims: [usize; 4]) -> [u64; 4] {
    let mut s = [0u64; 4];
    let mut acc = ELEM;
    for i in (0..4).rev() {
        s[i] = acc;
        acc *= dims[i] as u64;
    }
    s
}

/// A tensor's strides in bytes, zero on size-1 dims, permuted by `order`.
fn byte_strides(t: &Tensor, order: [usize; 4]) -> [u64; 4] {
    order.map(|d| if t.shape()[d] == 1 { 0 } else { t.strides()[d] as u64 * ELEM })
}

fn gather_launch(dev: &CudaDevice, params: GatherParams) -> Result<()> {
    let units = params.dims.iter().fold((params.row_bytes / params.unit) as u64, |n, &d| n * d as u64);
    let blocks = units.div_ceil(GATHER_THREADS as u64).clamp(1, 65535) as u32;
    launch(dev, &Launch::kernel(names::GATHER_ROWS, (blocks, 1, 1), GATHER_THREADS, 0), params)
}

/// Heads of a gathered operand whose own heads are `own` and whose mask has `mask`: the finer.
fn gathered_heads(d: &Dims, own: usize, mask: usize) -> usize {
    if own == d.heads || mask == d.heads {
        d.heads
    } else if own == d.kv_heads || mask == d.kv_heads {
        d.kv_heads
    } else {
        1
    }
}

/// Divisor from a gathered operand's head to its source's head (`src` heads of `gathered`).
fn source_head_div(d: &Dims, src: usize, gathered: usize) -> u32 {
    if src == d.kv_heads && gathered == d.heads && src != gathered { d.kv_group() as u32 } else { 1 }
}

/// K and V of a call gathered along `lists` into `rows` key rows per plane (zeros past a list's
/// end) and `kv_heads` heads (see [`gathered_heads`]).
fn gather_kv(dev: &CudaDevice, p: &Problem, saved: &Saved, lists: &KeyListsBuf, rows: usize, kv_heads: usize) -> Result<(Tensor, Tensor)> {
    let d = p.dims;
    let (k_view, v_view) = (super::qkv_view(&saved.k, "k")?, super::qkv_view(&saved.v, "v")?);
    let kv_dims = [d.batch, rows, kv_heads, d.head_dim];
    let mut kv = Vec::with_capacity(2);
    for view in [k_view, v_view] {
        let out = Tensor::empty(&kv_dims, p.dtype, &saved.q.device())?;
        let dst = contiguous_bytes(kv_dims);
        let s = view.stride.map(|x| x * ELEM);
        gather_launch(dev, GatherParams {
            src: view.ptr,
            src_stride: [s[0], s[2], 0, s[1]],
            dst: out.device_ptr().expect("CUDA tensor"),
            dst_stride: [dst[0], dst[2], 0, dst[1]],
            dims: [d.batch as u32, kv_heads as u32, 1, rows as u32],
            row_bytes: (d.head_dim as u64 * ELEM) as u32,
            unit: 16,
            src_head_div: source_head_div(&d, d.kv_heads, kv_heads),
            skip_missing: 0,
            lists: lists.lists(lists.pos, kv_heads, &d),
        })?;
        kv.push(out);
    }
    Ok((kv.remove(0), kv.remove(0)))
}

/// The bias of a call over keys gathered along `lists` into `rows` per plane, for a problem with
/// `kv_heads` heads of K and V: a bias with a key dimension is gathered along the lists, at the
/// finer of its own and the mask's batch and heads (rows past a list's end zeros, or with
/// `skip_missing` left unwritten). A key-broadcast one is read as it is, unless K and V were
/// gathered per query head and it has kv heads, which the gathered problem cannot broadcast: it
/// is copied out to every query head. Returns the bias and how it was made (see
/// [`GatheredCall::bias_lists`]).
fn gather_bias(dev: &CudaDevice, p: &Problem, saved: &Saved, lists: &KeyListsBuf, rows: usize, kv_heads: usize, skip_missing: bool) -> Result<(Option<Tensor>, Option<bool>)> {
    let d = p.dims;
    let [mb, mh] = lists.planes;
    let Some(b) = &saved.bias else { return Ok((None, None)) };
    let [bb, bh, bq, bk] = <[usize; 4]>::try_from(b.shape()).expect("validated bias");
    let per_kv_head = bh == d.kv_heads && bh != 1 && bh != d.heads && kv_heads == d.heads;
    if bk == 1 && !per_kv_head {
        return Ok((Some(b.clone()), None));
    }
    let (gb, gh, gk) = if bk > 1 { (if bb > 1 || mb > 1 { d.batch } else { 1 }, gathered_heads(&d, bh, mh), rows) } else { (bb, d.heads, 1) };
    let dims = [gb, gh, bq, gk];
    let out = Tensor::empty(&dims, b.dtype(), &saved.q.device())?;
    let with_lists = if bk > 1 { Some(lists.lists(lists.pos, gh, &d)) } else { None };
    gather_launch(dev, GatherParams {
        src: b.device_ptr().expect("CUDA tensor"),
        src_stride: byte_strides(b, [0, 1, 2, 3]),
        dst: out.device_ptr().expect("CUDA tensor"),
        dst_stride: contiguous_bytes(dims),
        dims: dims.map(|x| x as u32),
        row_bytes: ELEM as u32,
        unit: ELEM as u32,
        src_head_div: source_head_div(&d, bh, gh),
        skip_missing: skip_missing as u32,
        lists: with_lists.unwrap_or_default(),
    })?;
    Ok((Some(out), Some(bk > 1)))
}

/// Whether the forward's gather variant takes the band: it has no sinks (whose keys are a second
/// run of a row's gathered keys).
fn gather_variant_takes(band: &Band) -> bool {
    band.left == Band::NONE || band.sinks == 0
}

/// A call whose prepared mask holds key lists, on the forward's gather variant: the kernel reads K
/// and V rows at the listed keys and finds each query tile's tiles and per-score bounds from the
/// ranks; it reads a key-side bias (`[.., .., 1, sk]`) at the listed keys, and a bias with both a
/// query and a key dimension is gathered into columns as many as the call's keys first (each
/// plane's list fills its first ones; the rest are never read). Nothing is read back. A band with sinks runs the ordinary kernels over the
/// gathered problem instead (which reads the lists' lengths back).
pub(crate) fn forward(dev: &CudaDevice, p: Problem, saved: Saved, lists: &Arc<KeyListsBuf>, into: ForwardBuffers) -> Result<Forward> {
    if !gather_variant_takes(&p.band) {
        return on_gathered(dev, p, saved, lists, |p, s| super::forward(dev, p, s, into));
    }
    let d = p.dims;
    // Element type and bias dtype first: the bias gather copies 16-bit elements.
    let elem = super::check_operands(&p, &saved)?;
    // The kernel reads a key-side bias at the listed keys itself.
    let bias = match &saved.bias {
        Some(b) if super::key_side(b) => Some(b.clone()),
        _ => gather_bias(dev, &p, &saved, lists, d.seqlen_k, d.kv_heads, true)?.0,
    };
    let problem = Problem { mask: None, bias: bias.as_ref().map(|b| b.shape().try_into().expect("4 dims")), ..p.clone() };
    let inner = Saved { mask: None, bias, ..saved.clone() };
    let plan = super::fwd_plan(dev.gpu(), &problem, elem, FwdMask::Gathered)?;
    let keys = (lists.lists(lists.ranks, d.heads, &d), lists.pos);
    let (out, lse) = super::run_forward(dev, &plan, &problem, &inner, into, Some(keys))?;
    Ok(Forward { out, lse, problem: p, saved })
}

/// The unfused forward (`materialized`) over the gathered problem.
pub(crate) fn forward_materialized(dev: &CudaDevice, p: Problem, saved: Saved, lists: &Arc<KeyListsBuf>) -> Result<Forward> {
    on_gathered(dev, p, saved, lists, |p, s| super::materialized::forward(dev, p, s))
}

/// Runs `fwd` on the gathered call's problem and operands, returning the call's own forward (the
/// backward builds its gathered call again from the lists).
fn on_gathered(dev: &CudaDevice, p: Problem, saved: Saved, lists: &Arc<KeyListsBuf>, fwd: impl FnOnce(Problem, Saved) -> Result<Forward>) -> Result<Forward> {
    let call = gathered(dev, &p, &saved, lists)?;
    let inner = fwd(call.problem, call.saved)?;
    Ok(Forward { out: inner.out, lse: inner.lse, problem: p, saved })
}

/// Rewrites a call whose prepared mask holds key lists into the gathered call: the longest list's
/// keys (rounded up to a 64-key block, read back once) per plane, zeros past each list, and the
/// gathered problem's mask written from the band on the original key positions.
fn gathered(dev: &CudaDevice, p: &Problem, saved: &Saved, lists: &Arc<KeyListsBuf>) -> Result<GatheredCall> {
    let d = p.dims;
    let w = lists.width()?;
    // Element type and bias dtype first: the gathers copy 16-bit elements.
    super::check_operands(p, saved)?;
    // A mask per query head under GQA gives each query head its own keys: K and V are gathered per
    // query head, and the kernels see as many kv heads as heads.
    let kv_heads = gathered_heads(&d, d.kv_heads, lists.planes[1]);
    let (k, v) = gather_kv(dev, p, saved, lists, w, kv_heads)?;
    let (bias, bias_lists) = gather_bias(dev, p, saved, lists, w, kv_heads, false)?;
    let device = saved.q.device();
    let [mb, mh] = lists.planes;

    // The gathered keys' mask: the band on their original positions, and the lists' ends.
    let (sq, k_blocks, q_blocks) = (d.seqlen_q, w / BLOCK_MAP_K as usize, d.seqlen_q.div_ceil(BLOCK_MAP_Q as usize));
    let planes = mb * mh;
    // A kernel tile overhanging the last row reads a word and a class past it (see `prepare`).
    let bits_bytes = 8 * planes * sq * k_blocks + super::prepare::PAD;
    let buf = DeviceBuffer::uninit(dev.stream(), bits_bytes + planes * q_blocks * k_blocks + super::prepare::PAD)?;
    let params = GatherMaskParams {
        pos: lists.pos,
        pos_plane: lists.plane_stride() as u64,
        classes: buf.ptr() + bits_bytes as u64,
        bits: buf.ptr(),
        band: p.band,
        seqlen_q: sq as u32,
        seqlen_k: d.seqlen_k as u32,
        q_blocks: q_blocks as u32,
        k_blocks: k_blocks as u32,
    };
    launch(dev, &Launch::kernel(names::GATHER_MASK, (k_blocks as u32, q_blocks as u32, planes as u32), 64, 4 * 64), params)?;
    let strides = |dims: [usize; 4]| super::prepare::strides(dims);
    let mask = super::PreparedMask::new(
        View4 { ptr: params.classes, stride: strides([mb, mh, q_blocks, k_blocks]) },
        View4 { ptr: params.bits, stride: strides([mb, mh, sq, k_blocks]) },
        [mb, mh],
        vec![buf],
    );
    let dims = Dims { seqlen_k: w, kv_heads, ..d };
    let problem = Problem { dims, mask: Some([mb, mh]), bias: bias.as_ref().map(|b| b.shape().try_into().expect("4 dims")), band: Band::ALL, ..p.clone() };
    let prepared = Prepared::on_device(MaskData::Cuda(mask), [mb, mh], sq, w, device);
    let saved = Saved { q: saved.q.clone(), k, v, mask: Some(prepared), bias };
    Ok(GatheredCall { problem, saved, lists: lists.clone(), bias_lists })
}


/// How the gathered backward (batch 1) runs as batch entries of its own, each over the same
/// gathered keys with its own dK/dV partial, summed by the scatter. Its kernels parallelise over
/// key tiles, and a gathered problem has few (16 for 1024 keys), so each entry gets its own CTAs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunks {
    /// One call, unfolded.
    One,
    /// `n` runs of `sq / n` consecutive queries.
    Rows(usize),
    /// `n` sets of query heads, entry `c` taking heads `j` with `j % n == c`: each a `1 / n` share
    /// of every kv group (`n` divides the group).
    Heads(usize),
}

impl Chunks {
    fn count(self) -> usize {
        match self {
            Chunks::One => 1,
            Chunks::Rows(n) | Chunks::Heads(n) => n,
        }
    }
}

/// The gathered backward's [`Chunks`]. None where the backward splits the gathered problem's
/// query tiles itself (`BwdPlan::q_split_shift`: head dims up to 64, and 128 without a bias on
/// Hopper; not deterministic): its shares add into one f32 dK/dV, which leaves the scatter one row
/// to read per key, not one per chunk.
fn query_chunks(dev: &CudaDevice, call: &GatheredCall) -> Result<Chunks> {
    if let Some(forced) = FORCED_CHUNKS.with(|f| f.get()) {
        let d = &call.problem.dims;
        let fits = match forced {
            Chunks::One => true,
            Chunks::Rows(n) => d.seqlen_q.is_multiple_of(n * BLOCK_MAP_Q as usize),
            Chunks::Heads(n) => heads_fold(&call.problem).is_multiple_of(n),
        };
        if d.batch == 1 && fits {
            return Ok(forced);
        }
    }
    if super::backward_plan(dev, &call.problem, &call.saved, true)?.1.q_split_shift > 0 {
        return Ok(Chunks::One);
    }
    Ok(chunks_for(&call.problem, dev.sms() as usize))
}

std::thread_local! {
    static FORCED_CHUNKS: std::cell::Cell<Option<Chunks>> = const { std::cell::Cell::new(None) };
}

/// Testing hook: while `Some(n)`, a gathered backward this thread runs takes `n` query chunks
/// (a power of two; by query rows, or with `by_heads` by query heads) wherever its queries fold
/// into them (batch 1; whole 64-row blocks, or `n` dividing the kv group and a bias with no
/// head of its own per query head), whatever the plan would choose; `None`: the plan's own choice.
#[doc(hidden)]
pub fn force_gather_query_chunks(chunks: Option<usize>, by_heads: bool) {
    let forced = chunks.filter(|n| n.is_power_of_two()).map(|n| match n {
        1 => Chunks::One,
        n if by_heads => Chunks::Heads(n),
        n => Chunks::Rows(n),
    });
    FORCED_CHUNKS.with(|f| f.set(forced));
}

/// The heads-folds a gathered problem allows: the largest power of two dividing its kv group, 1
/// where it has a batch or a bias per query head (a fold is a strided view of each operand).
fn heads_fold(p: &Problem) -> usize {
    let d = p.dims;
    let group = d.heads / d.kv_heads;
    if d.batch != 1 || p.bias.is_some_and(|b| b[1] == d.heads && group > 1) {
        return 1;
    }
    1 << group.trailing_zeros()
}

/// [`query_chunks`] for a gathered problem on a GPU of `sms` SMs: towards four CTAs per SM, by
/// query heads where the kv group allows as many, else by rows (powers of two of at least 512
/// queries each, on whole 64-row blocks; batch 1, a bias without a query dimension). Heads first:
/// a key tile's work falls along its keys under causal, so row chunks give CTAs of a full chunk's
/// work or nearly none, which pack into waves badly (a model of the 32K d128 top-2048 call: 22 %
/// over the even share, head chunks 3 %).
fn chunks_for(p: &Problem, sms: usize) -> Chunks {
    let d = p.dims;
    let ctas = (d.seqlen_k / BLOCK_MAP_K as usize).max(1) * d.kv_heads;
    let target = (4 * sms).div_ceil(ctas);
    let mut rows = 1;
    if d.batch == 1 && p.bias.is_none_or(|b| b[2] == 1) {
        while 2 * rows <= target && d.seqlen_q.is_multiple_of(2 * rows * BLOCK_MAP_Q as usize) && d.seqlen_q / (2 * rows) >= 512 {
            rows *= 2;
        }
    }
    // The largest power of two not past the target, as the rows'.
    let heads = heads_fold(p).min(1 << target.max(1).ilog2());
    match (rows, heads) {
        (_, h) if h >= rows && h > 1 => Chunks::Heads(h),
        (1, _) => Chunks::One,
        (r, _) => Chunks::Rows(r),
    }
}

/// `[1, sq, h, d]` (any strides) seen as the `[n, rows, heads, d]` of `chunks`.
fn fold_rows(t: &Tensor, chunks: Chunks) -> Result<Tensor> {
    let (s, st) = (t.shape(), t.strides());
    let (shape, strides) = match chunks {
        Chunks::One => return Ok(t.clone()),
        Chunks::Rows(n) => ([n, s[1] / n, s[2], s[3]], [s[1] / n * st[1], st[1], st[2], st[3]]),
        Chunks::Heads(n) => ([n, s[1], s[2] / n, s[3]], [st[2], st[1], n * st[2], st[3]]),
    };
    t.as_strided(&shape, &strides, t.layout().offset)
}

/// The gathered call (batch 1) as the batch entries of `chunks`: q, out, the prepared mask and
/// (written here) LSE folded, K, V and the bias broadcast over them.
fn fold(dev: &CudaDevice, call: &GatheredCall, out: &Tensor, lse: &Tensor, chunks: Chunks) -> Result<Forward> {
    let d = call.problem.dims;
    let n = chunks.count();
    let (rows, heads) = match chunks {
        Chunks::Heads(_) => (d.seqlen_q, d.heads / n),
        _ => (d.seqlen_q / n, d.heads),
    };
    let saved = &call.saved;
    let broadcast = |t: &Tensor| {
        let (s, st) = (t.shape(), t.strides());
        t.as_strided(&[n, s[1], s[2], s[3]], &[0, st[1], st[2], st[3]], t.layout().offset)
    };
    // LSE [1, h, sq] -> [n, heads, rows]: an identity-list copy of f32 pieces, entry `c`'s head
    // `j` (row `i`) from head `j n + c` (row `i`), or from head `j` (row `c rows + i`).
    let lse_f = Tensor::empty(&[n, heads, rows], lse.dtype(), &lse.device())?;
    let (chunk_at, head_at) = match chunks {
        Chunks::Heads(_) => (4 * d.seqlen_q as u64, 4 * (n * d.seqlen_q) as u64),
        _ => (4 * rows as u64, 4 * d.seqlen_q as u64),
    };
    gather_launch(dev, GatherParams {
        src: lse.device_ptr().expect("CUDA tensor"),
        src_stride: [0, chunk_at, head_at, 4],
        dst: lse_f.device_ptr().expect("CUDA tensor"),
        dst_stride: [0, 4 * (heads * rows) as u64, 4 * rows as u64, 4],
        dims: [1, n as u32, heads as u32, rows as u32],
        row_bytes: 4,
        unit: 2,
        src_head_div: 1,
        skip_missing: 0,
        lists: KeyLists::default(),
    })?;
    let Some(MaskData::Cuda(m)) = saved.mask.as_ref().and_then(|m| m.data.as_ref()) else { unreachable!("a gathered call has a GPU mask") };
    let (mut classes, mut bits) = (m.classes, m.bits);
    // Every head chunk sees the whole mask; a row chunk its rows.
    (classes.stride[0], bits.stride[0]) = match chunks {
        Chunks::Heads(_) => (0, 0),
        _ => ((rows / BLOCK_MAP_Q as usize) as u64 * classes.stride[2], rows as u64 * bits.stride[2]),
    };
    let planes = [n, m.planes[1]];
    let mask = Prepared::on_device(MaskData::Cuda(m.viewed(classes, bits, planes)), planes, rows, d.seqlen_k, saved.q.device());
    let problem = Problem { dims: Dims { batch: n, seqlen_q: rows, heads, ..d }, mask: Some(planes), ..call.problem.clone() };
    let saved = Saved {
        q: fold_rows(&saved.q, chunks)?,
        k: broadcast(&saved.k)?,
        v: broadcast(&saved.v)?,
        mask: Some(mask),
        bias: saved.bias.clone(),
    };
    Ok(Forward { out: fold_rows(out, chunks)?, lse: lse_f, problem, saved })
}

/// Copies `src`, contiguous `[b, s, h, d]` 16-bit elements, into `dst` of the same shape and any
/// strides (the head dim's 1): a row of `d` per `(b, s, h)`.
pub(super) fn copy_rows(dev: &CudaDevice, src: &Tensor, dst: &Tensor) -> Result<()> {
    let [b, s, h, d] = <[usize; 4]>::try_from(dst.shape()).expect("4 dims");
    let [sb, ss, sh, _] = <[usize; 4]>::try_from(dst.strides()).expect("4 dims").map(|x| ELEM * x as u64);
    let from = contiguous_bytes([b, s, h, d]);
    let dst_ptr = dst.device_ptr().expect("CUDA tensor");
    let aligned = [dst_ptr, sb, ss, sh].iter().all(|x| x.is_multiple_of(16)) && (ELEM * d as u64).is_multiple_of(16);
    gather_launch(dev, GatherParams {
        src: src.device_ptr().expect("CUDA tensor"),
        src_stride: [from[0], from[2], 0, from[1]],
        dst: dst_ptr,
        dst_stride: [sb, sh, 0, ss],
        dims: [b as u32, h as u32, 1, s as u32],
        row_bytes: (ELEM * d as u64) as u32,
        unit: if aligned { 16 } else { 2 },
        src_head_div: 1,
        skip_missing: 0,
        lists: KeyLists::default(),
    })
}

/// The backward of a gathered forward: the kernels' backward on the gathered call (in query
/// chunks, see [`query_chunks`]), then dK, dV and (for a gathered bias) dbias scattered to the keys
/// of the call, summed over chunks and query heads in a fixed order.
pub(crate) fn backward(dev: &CudaDevice, fwd: &Forward, lists: &Arc<KeyListsBuf>, dout: &Tensor, into: GradientBuffers) -> Result<Gradients> {
    let (p, saved) = (&fwd.problem, &fwd.saved);
    // Too dense to pay, or nothing may be read back: the dense-tile backward on the same mask.
    if capturing(dev)? || lists.backward_width()?.is_none() {
        let tiles = lists.dense_tiles(dev)?;
        let mask = saved.mask.as_ref().map(|m| m.with_data(MaskData::Cuda(tiles)));
        let dense = Forward { out: fwd.out.clone(), lse: fwd.lse.clone(), problem: p.clone(), saved: Saved { mask, ..saved.clone() } };
        return super::backward(dev, &dense, dout, into);
    }
    let call = &gathered(dev, p, saved, lists)?;
    let d = p.dims;
    let elem = device_elem("q", p.dtype)?;
    let device = saved.q.device();
    let dbias_into = if call.bias_lists.is_some() { None } else { into.dbias };
    let folded = query_chunks(dev, call)?;
    let chunks = folded.count();
    let g = if chunks > 1 {
        let inner = fold(dev, call, &fwd.out, &fwd.lse, folded)?;
        let dq = super::output(into.dq, saved.q.shape(), p.dtype, &device)?;
        // A head chunk's dq is a strided view of the call's (`super::backward` writes through it).
        let dq_f = fold_rows(&dq, folded)?;
        let g = super::backward(dev, &inner, &fold_rows(dout, folded)?, GradientBuffers { dq: Some(&dq_f), dk: None, dv: None, dbias: dbias_into })?;
        Gradients { dq, ..g }
    } else {
        let inner = Forward { out: fwd.out.clone(), lse: fwd.lse.clone(), problem: call.problem.clone(), saved: call.saved.clone() };
        super::backward(dev, &inner, dout, GradientBuffers { dq: into.dq, dk: None, dv: None, dbias: dbias_into })?
    };
    let scatter = format!("{}{}", names::SCATTER_ROWS_PREFIX, elem.name());
    let run = |params: ScatterParams| {
        let units = params.dims.iter().fold((params.row_elems / params.unit) as u64, |n, &x| n * x as u64);
        let blocks = units.div_ceil(GATHER_THREADS as u64).clamp(1, 65535) as u32;
        launch(dev, &Launch::kernel(&scatter, (blocks, 1, 1), GATHER_THREADS, 0), params)
    };
    let lists = &call.lists;
    let kv_heads = call.problem.dims.kv_heads;
    let mut out = Vec::with_capacity(2);
    for (src, provided, like, arg) in [(&g.dk, into.dk, &saved.k, "dk"), (&g.dv, into.dv, &saved.v, "dv")] {
        let dst = super::output(provided, like.shape(), p.dtype, &device)?;
        let view = super::qkv_view(&dst, arg)?;
        let s = view.stride.map(|x| x * ELEM);
        // `[batch x chunks, width, kv_heads', d]`: a batch entry's chunks are its sources.
        let src_s = contiguous_bytes([d.batch * chunks, call.problem.dims.seqlen_k, kv_heads, d.head_dim]);
        run(ScatterParams {
            src: src.device_ptr().expect("CUDA tensor"),
            src_stride: [src_s[0], src_s[2], 0, src_s[1]],
            dst: view.ptr,
            dst_stride: [s[0], s[2], 0, s[1]],
            dims: [d.batch as u32, d.kv_heads as u32, 1, d.seqlen_k as u32],
            ratio: [chunks as u32, (kv_heads / d.kv_heads) as u32],
            row_elems: d.head_dim as u32,
            unit: 8,
            ranks: lists.lists(lists.ranks, kv_heads, &d),
        })?;
        out.push(dst);
    }
    let (dk, dv) = (out.remove(0), out.remove(0));
    let dbias = match (&saved.bias, g.dbias) {
        (Some(b), Some(gathered)) if let Some(along_keys) = call.bias_lists => {
            let dst = super::output(into.dbias, b.shape(), b.dtype(), &device)?;
            let [bb, bh, bq, sk] = <[usize; 4]>::try_from(b.shape()).expect("validated bias");
            let gs = gathered.shape();
            run(ScatterParams {
                src: gathered.device_ptr().expect("CUDA tensor"),
                src_stride: contiguous_bytes(gs.try_into().expect("4 dims")),
                dst: dst.device_ptr().expect("CUDA tensor"),
                dst_stride: contiguous_bytes([bb, bh, bq, sk]),
                dims: [bb as u32, bh as u32, bq as u32, sk as u32],
                ratio: [(gs[0] / bb) as u32, (gs[1] / bh) as u32],
                row_elems: 1,
                unit: 1,
                ranks: if along_keys { lists.lists(lists.ranks, gs[1], &d) } else { KeyLists::default() },
            })?;
            Some(dst)
        }
        (_, dbias) => dbias,
    };
    Ok(Gradients { dq: g.dq, dk, dv, dbias })
}

/// Index lists (`SparseMask::indices`, checked by `check_indices_shape`) as the bit-packed score
/// mask they describe, `[pb, ph, rows, ceil(sk / 8)]` U8 (rows 4-byte aligned). Reads back whether
/// an entry was out of range (waits for the device). With `band` (per-query lists, `rows` =
/// `seqlen_q`), also their rows summed up to tell whether they are a window
/// (`sparse::lists_band`), where the row kernel runs and the lengths are below 2^30 (`None`
/// otherwise): read back with the range flag, no wait of its own.
pub(crate) fn indices_to_bits(dev: &CudaDevice, t: &Tensor, shape: [usize; 4], sk: usize, band: bool) -> Result<(Tensor, Option<ListsBand>)> {
    if capturing(dev)? {
        return Err(Error::Unsupported {
            what: "index lists given inside a CUDA graph capture (their range check reads back from the device): prepare them (SparseMask::indices(..).prepare) before capturing".into(),
            backend: BACKEND,
        });
    }
    let [pb, ph, rows, w] = shape;
    let row_words = sk.div_ceil(32);
    // A row a CTA where the row fits in shared memory (the bits written whole, no zeroing), else
    // an entry a thread into zeroed bits.
    let by_rows = 4 * row_words <= INDICES_ROW_SMEM as usize && rows <= i32::MAX as usize && ph <= u16::MAX as usize && pb <= u16::MAX as usize;
    // The summary's values are i32s of rows and keys, its empty-row count a u32 of every plane's.
    let band = band && by_rows && rows.max(sk) < 1 << 30 && pb * ph * rows < 1 << 31;
    let bytes = 4 * pb * ph * rows * row_words;
    let bits = if by_rows { DeviceBuffer::uninit(dev.stream(), bytes)? } else { DeviceBuffer::filled(dev.stream(), bytes, 0)? };
    // The range flag, then the band's summary.
    let mut init = vec![0u8; 4];
    init.extend(ListsBand::NONE.to_words().iter().flat_map(|w| w.to_le_bytes()));
    let flags = DeviceBuffer::from_host(dev.stream(), &init)?;
    let params = IndicesParams {
        indices: super::broadcast_view(t),
        bits: bits.ptr(),
        error: flags.ptr(),
        band: if band { flags.ptr() + 4 } else { 0 },
        dims: [pb, ph, rows, w].map(|x| x as u32),
        seqlen_k: sk as u32,
        row_words: row_words as u32,
    };
    if by_rows {
        // The band's summary takes the row's first three words once they are written out.
        let smem = 4 * row_words.max(3) as u32;
        launch(dev, &Launch::kernel(names::INDICES_ROW_BITS, (rows as u32, ph as u32, pb as u32), GATHER_THREADS, smem), params)?;
    } else {
        let entries = (pb * ph * rows * w) as u64;
        let blocks = entries.div_ceil(GATHER_THREADS as u64).clamp(1, 65535) as u32;
        launch(dev, &Launch::kernel(names::INDICES_BITS, (blocks, 1, 1), GATHER_THREADS, 0), params)?;
    }
    let read = flags.to_host(0, init.len())?;
    let word = |i: usize| i32::from_le_bytes(read[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    if word(0) != 0 {
        return Err(crate::sparse::index_range_error(sk, None));
    }
    let summary = band.then(|| ListsBand::from_words(std::array::from_fn(|i| word(i + 1))));
    let row_bytes = 4 * row_words;
    let layout = crate::tensor::Layout { shape: vec![pb, ph, rows, sk.div_ceil(8)], strides: vec![ph * rows * row_bytes, rows * row_bytes, row_bytes, 1], offset: 0 };
    Ok((Tensor::from_device_buffer(bits, U8, layout, dev), summary))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn problem(batch: usize, sq: usize, width: usize, kv_heads: usize, bias: Option<[usize; 4]>) -> Problem {
        grouped(batch, sq, width, 2 * kv_heads, kv_heads, bias)
    }

    fn grouped(batch: usize, sq: usize, width: usize, heads: usize, kv_heads: usize, bias: Option<[usize; 4]>) -> Problem {
        let dims = Dims { batch, seqlen_q: sq, seqlen_k: width, heads, kv_heads, head_dim: 64 };
        Problem { dims, dtype: DType::BF16, mask: Some([1, 1]), bias, band: Band::ALL, scale: 0.125, softcap: 0.0, deterministic: false, seqs: None, packed_bias: None, packed_mask: None, pages: None }
    }

    /// Enough chunks for about four CTAs per SM: by query heads where the kv group holds as many
    /// (a power of two dividing it; not under a bias per query head), else by rows, each of at
    /// least 512 queries on whole 64-row blocks; none where folding is not a view.
    #[test]
    fn query_chunks_fill_the_gpu_within_their_limits() {
        use Chunks::*;
        // 1024 gathered keys, one kv head: 16 key tiles; 132 SMs want 33 chunks, more than the
        // group of 2 heads.
        assert_eq!(chunks_for(&problem(1, 32768, 1024, 1, None), 132), Rows(32));
        assert_eq!(chunks_for(&problem(1, 16384, 1024, 1, Some([1, 1, 1, 1024])), 132), Rows(32));
        // At least 512 queries a chunk.
        assert_eq!(chunks_for(&problem(1, 2048, 192, 2, None), 132), Rows(4));
        // Whole 64-row blocks: 3000 queries do not split by rows; their heads do.
        assert_eq!(chunks_for(&problem(1, 3000, 1024, 1, None), 132), Heads(2));
        assert_eq!(chunks_for(&grouped(1, 3000, 1024, 1, 1, None), 132), One);
        // The GPU is full already.
        assert_eq!(chunks_for(&problem(1, 32768, 8192, 8, None), 132), One);
        // Not a view: batches; a bias with a query dimension folds by heads only, one per query
        // head not at all.
        assert_eq!(chunks_for(&problem(2, 32768, 1024, 1, None), 132), One);
        assert_eq!(chunks_for(&problem(1, 32768, 1024, 1, Some([1, 1, 32768, 1024])), 132), Heads(2));
        assert_eq!(chunks_for(&problem(1, 32768, 1024, 1, Some([1, 2, 1, 1024])), 132), Rows(32));
        // The key-side top-2048 call (h16 hk4): 128 CTAs want 4 chunks, its group's 4 heads.
        assert_eq!(chunks_for(&grouped(1, 32768, 2048, 16, 4, Some([1, 4, 1, 2048])), 132), Heads(4));
        assert_eq!(chunks_for(&grouped(1, 8192, 2048, 16, 4, Some([1, 4, 1, 2048])), 132), Heads(4));
        // A group of 6 folds by its factor of two, fewer than the rows the GPU wants.
        assert_eq!(chunks_for(&grouped(1, 32768, 2048, 24, 4, None), 132), Rows(4));
        // An 8-head group folds by the 4 the GPU wants.
        assert_eq!(chunks_for(&grouped(1, 32768, 2048, 32, 4, None), 132), Heads(4));
    }

    /// A head chunk's operands are views: entry `c`, head `j` is the call's head `j n + c`.
    #[test]
    fn head_chunks_are_views_of_every_nth_head() {
        let t = Tensor::from_vec((0..3 * 8 * 4).map(|x| x as f32).collect(), &[1, 3, 8, 4], &crate::Device::Cpu).unwrap();
        let f = fold_rows(&t, Chunks::Heads(4)).unwrap();
        assert_eq!(f.shape(), &[4, 3, 2, 4]);
        let v = f.to_vec::<f32>().unwrap();
        let at = |c: usize, i: usize, j: usize, x: usize| v[((c * 3 + i) * 2 + j) * 4 + x];
        for (c, i, j, x) in [(0, 0, 0, 0), (1, 2, 1, 3), (3, 1, 1, 2)] {
            assert_eq!(at(c, i, j, x), ((i * 8 + j * 4 + c) * 4 + x) as f32);
        }
        let r = fold_rows(&t, Chunks::Rows(1)).unwrap();
        assert_eq!(r.shape(), &[1, 3, 8, 4]);
    }
}
