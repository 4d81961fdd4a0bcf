//! Per-query index lists (`SparseMask::indices` with a query dimension) run over each query's own
//! keys: the lists laid out once when the mask is prepared, each row's keys ascending
//! ([`from_bits`]), and the forward
//! (`dmattn_abi::ListsParams`) planned as a plain value ([`lists_plan`]) and launched. The
//! backward runs on the dense tiles of the lists' bit-packed mask, which the prepared mask keeps.
use super::launch::{Launch, launch};
use super::prepare::strides;
use super::{Saved, head_div};
use crate::device::CudaDevice;
use crate::error::Result;
use crate::memory::DeviceBuffer;
use crate::problem::Problem;
use crate::tensor::Tensor;
use dmattn_abi::{DeviceElem, FwdParams, LISTS_BITS_SMEM, LISTS_BITS_THREADS, LISTS_HEAD_DIMS, LISTS_ROWS, LISTS_THREADS, LISTS_WARPS, ListBitsParams, ListsParams, View4, lists_smem_bytes, modifiers, names};

/// A mask's per-query lists, each row ascending without padding or repeats, and their lengths.
pub(crate) struct RowLists {
    /// `[pb, ph]`.
    pub planes: [usize; 2],
    /// I32 `[pb, ph, rows, w]` and U32 `[pb, ph, rows]`, zero strides on broadcast planes.
    lists: View4,
    counts: View4,
    buf: DeviceBuffer,
}

impl RowLists {
    pub fn memory_bytes(&self) -> usize {
        self.buf.bytes()
    }
}

/// The lists of shape `[pb, ph, rows, w]` laid out from the keep table they describe, `bits` (U8
/// `[pb, ph, rows, ceil(sk / 8)]`, rows of whole u32 words, as `gather::indices_to_bits` writes
/// it), into a new allocation of `min(w, sk)` entries a row: each row's keys ascending, one CTA
/// a row.
pub(crate) fn from_bits(dev: &CudaDevice, bits: &Tensor, shape: [usize; 4], sk: usize) -> Result<RowLists> {
    // A row keeps at most its width's keys, and at most every key.
    let [pb, ph, rows, w] = shape;
    let w = w.min(sk);
    let lines = pb * ph * rows;
    let buf = DeviceBuffer::uninit(dev.stream(), 4 * lines * (w + 1))?;
    let counts_at = buf.ptr() + (4 * lines * w) as u64;
    let params = ListBitsParams {
        bits: bits.device_ptr().expect("CUDA tensor"),
        out: buf.ptr(),
        counts: counts_at,
        row_words: sk.div_ceil(32) as u32,
        width: w as u32,
    };
    launch(dev, &Launch::kernel(names::LISTS_FROM_BITS, (rows as u32, ph as u32, pb as u32), LISTS_BITS_THREADS, LISTS_BITS_SMEM), params)?;
    let lists = View4 { ptr: buf.ptr(), stride: strides([pb, ph, rows, w]) };
    let mut counts = View4 { ptr: counts_at, stride: strides([pb, ph, rows, 1]) };
    counts.stride[3] = 0;
    Ok(RowLists { planes: [pb, ph], lists, counts, buf })
}

/// How the lists forward runs a call: its kernel and grid `(ceil(sq / LISTS_WARPS), kv_heads *
/// units, batch)`, each warp one query and `rows` query heads of a kv group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ListsPlan {
    pub kernel: String,
    pub grid: (u32, u32, u32),
    pub smem_bytes: u32,
    pub rows: u32,
    pub units: u32,
}

/// The lists forward's plan for `p` over lists of `planes` (`[pb, ph]`), or `None` where it does
/// not take the call (a packed batch, paged K/V, a head dim without a kernel, grids past CUDA's
/// limits). The query heads sharing a list (a kv group's, or all of them) share a warp, up to
/// `LISTS_ROWS`; where each query head has its own list a warp takes one.
pub(crate) fn lists_plan(p: &Problem, elem: DeviceElem, planes: [usize; 2]) -> Option<ListsPlan> {
    let d = p.dims;
    let group = d.kv_group();
    let rows = if planes[1] == d.heads && group > 1 { 1 } else { group.min(LISTS_ROWS as usize) };
    let units = group.div_ceil(rows);
    let grid = (d.seqlen_q.div_ceil(LISTS_WARPS as usize), d.kv_heads * units, d.batch);
    let takes = p.seqs.is_none()
        && p.pages.is_none()
        && LISTS_HEAD_DIMS.contains(&(d.head_dim as u32))
        && grid.0 <= i32::MAX as usize
        && grid.1 <= u16::MAX as usize
        && grid.2 <= u16::MAX as usize;
    // The lean kernel where there is neither a bias nor a softcap.
    let mods = if p.bias.is_some() || p.softcap > 0.0 { modifiers::ALL } else { modifiers::NONE };
    takes.then(|| ListsPlan {
        kernel: format!("{}{}_d{}{}", names::LISTS_FWD_PREFIX, elem.name(), d.head_dim, modifiers::suffix(mods)),
        grid: (grid.0 as u32, grid.1 as u32, grid.2 as u32),
        smem_bytes: lists_smem_bytes(d.head_dim as u32),
        rows: rows as u32,
        units: units as u32,
    })
}

/// Launches `plan` over `lists` with the forward's parameters `fwd` (its outputs in them).
pub(crate) fn launch_lists(dev: &CudaDevice, p: &Problem, plan: &ListsPlan, lists: &RowLists, fwd: FwdParams) -> Result<()> {
    let params = ListsParams {
        fwd,
        lists: lists.lists,
        counts: lists.counts,
        list_head_div: head_div(&p.dims, lists.planes[1]),
        rows: plan.rows,
        units: plan.units,
        _pad: 0,
    };
    launch(dev, &Launch::kernel(&plan.kernel, plan.grid, LISTS_THREADS, plan.smem_bytes), params)
}

/// The prepared mask's per-query lists, where the call's mask has them.
pub(crate) fn row_lists(saved: &Saved) -> Option<&RowLists> {
    super::device_mask(saved)?.rows.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::problem::Dims;
    use dmattn_abi::Band;

    fn problem(batch: usize, heads: usize, kv_heads: usize, sq: usize, head_dim: usize) -> Problem {
        let dims = Dims { batch, seqlen_q: sq, seqlen_k: 4 * sq, heads, kv_heads, head_dim };
        Problem { dims, dtype: DType::BF16, mask: Some([1, 1]), bias: None, band: Band::CAUSAL, scale: 0.125, softcap: 0.0, deterministic: false, seqs: None, packed_bias: None, packed_mask: None, pages: None }
    }

    /// A warp takes a query and the heads sharing its list: a kv group's (at most 16 a warp), one
    /// head where every head has its own list; the grid covers every query, kv head and unit.
    #[test]
    fn warps_take_the_heads_sharing_a_list() {
        let p = problem(2, 2, 1, 32768, 64);
        let plan = lists_plan(&p, DeviceElem::Bf16, [1, 1]).unwrap();
        assert_eq!((plan.kernel.as_str(), plan.grid, plan.rows, plan.units), ("dmattn_lists_fwd_bf16_d64", (8192, 1, 2), 2, 1));
        assert_eq!(plan.smem_bytes, lists_smem_bytes(64));
        // Lists per kv head, h32 hk8: four heads a warp.
        let p = problem(1, 32, 8, 1001, 128);
        let plan = lists_plan(&p, DeviceElem::F16, [1, 8]).unwrap();
        assert_eq!((plan.grid, plan.rows, plan.units), ((251, 8, 1), 4, 1));
        // Lists per query head: one head a warp.
        let plan = lists_plan(&p, DeviceElem::F16, [1, 32]).unwrap();
        assert_eq!((plan.grid, plan.rows, plan.units), ((251, 32, 1), 1, 4));
        // MQA with 40 heads: units of 16, 16 and 8 heads.
        let plan = lists_plan(&problem(1, 40, 1, 64, 32), DeviceElem::Bf16, [1, 1]).unwrap();
        assert_eq!((plan.grid, plan.rows, plan.units), ((16, 3, 1), 16, 3));
        // A bias or a softcap: the variant reading them.
        let biased = Problem { bias: Some([1, 1, 1, 1]), ..problem(2, 2, 1, 32768, 64) };
        assert_eq!(lists_plan(&biased, DeviceElem::Bf16, [1, 1]).unwrap().kernel, "dmattn_lists_fwd_bf16_d64_mods");
        let capped = Problem { softcap: 30.0, ..problem(2, 2, 1, 32768, 64) };
        assert_eq!(lists_plan(&capped, DeviceElem::Bf16, [1, 1]).unwrap().kernel, "dmattn_lists_fwd_bf16_d64_mods");
        // No kernel for d80; none for packed batches.
        assert!(lists_plan(&problem(1, 2, 1, 64, 80), DeviceElem::Bf16, [1, 1]).is_none());
    }

    /// Random lists of 1024 at 32K (every 64x64 tile holds a listed key) run per query; lists
    /// shaped as a window (a band of 17 tiles a row of tiles), or filling a few hundred tiles a
    /// row, do not.
    #[test]
    fn lists_pay_where_their_tiles_are_many() {
        use crate::sparse::lists_pay;
        let entries = (32768 * 1024) as f64;
        assert!(lists_pay(512 * 512, entries));
        // Causal: half the tiles, about half the entries.
        assert!(lists_pay(512 * 513 / 2, entries * 0.5));
        assert!(!lists_pay(512 * 17, entries));
        assert!(!lists_pay(512 * 100, entries));
    }
}
