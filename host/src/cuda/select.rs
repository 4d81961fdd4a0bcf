//! Key selection on the GPU: the launch plan as a value, then its launches writing the requested
//! output. One CTA a row (`dmattn_select_keys_{16,32}`, one launch) where rows fill the GPU, or
//! wide (`dmattn_select_wide_{16,32}`, a few launches over chunks of a row) where they are few
//! or too long for a CTA's shared memory.
use super::broadcast_view;
use super::launch::{Launch, launch};
use crate::device::{CudaDevice, Device};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::select::{Output, Plan};
use crate::tensor::Tensor;
use crate::memory::DeviceBuffer;
use dmattn_abi::{
    SELECT_CANDIDATES, SELECT_FIXED_WORDS, SELECT_THREADS, SELECT_WIDE_ALL, SELECT_WIDE_COUNT, SELECT_WIDE_ROW_WORDS, SELECT_WIDE_TALLY, SELECT_WIDE_THREADS, SELECT_WIDE_WRITE, SelectParams,
    SelectWideParams, View4, names, select_ctas_per_sm, select_digits,
};

/// Shared memory of a CTA of the kernel over `elem_bytes`-wide keys beside the others its
/// launch bounds fit on an SM with `smem_limit` bytes a block (the SM's, less the 1 KB it
/// reserves a CTA): a row's radix keys are cached only within it, as fewer resident rows cost
/// more than re-reading a row from L2.
fn cta_share(smem_limit: u32, elem_bytes: u32) -> u32 {
    (smem_limit + 1024) / select_ctas_per_sm(elem_bytes) - 1024
}

/// How a selection runs on a device: its kernel, shared memory and grid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SelectLaunch {
    pub kernel: &'static str,
    pub smem_bytes: u32,
    pub cached: bool,
    pub grid: u32,
    /// Entries of the candidate list.
    pub cand_cap: u32,
}

/// The launch of `plan` over a bias of `elem_bytes`-wide elements on a GPU with `sms` SMs and
/// `smem_limit` bytes of shared memory per CTA; an error when a row's bitmaps do not fit.
pub(crate) fn plan_launch(plan: &Plan, elem_bytes: u32, sms: u32, smem_limit: u32) -> Result<SelectLaunch> {
    let row_words = plan.sk.div_ceil(32) as u64;
    let vote_words = if plan.block == 0 { 0 } else { plan.sk.div_ceil(plan.block).div_ceil(32) as u64 };
    let base = (4 * (SELECT_FIXED_WORDS as u64 + SELECT_CANDIDATES as u64 + 2 * row_words + vote_words)).next_multiple_of(16);
    let with_cache = base + 32 * row_words * elem_bytes as u64;
    // Rows that do not fill the SMs gain nothing from resident neighbours: cached up to half
    // an SM's shared memory.
    let share = if plan.row_count() as u64 <= sms as u64 { smem_limit / 2 } else { cta_share(smem_limit, elem_bytes) };
    let cached = with_cache <= share as u64;
    if base > smem_limit as u64 {
        let max_keys = 32 * ((smem_limit as u64 / 4).saturating_sub((SELECT_FIXED_WORDS + SELECT_CANDIDATES) as u64 + 8) / 3);
        return Err(Error::Param {
            arg: "bias",
            reason: format!("rows of {} keys exceed the CUDA backend's limit of about {max_keys} keys per row on this GPU (its shared memory)", plan.sk),
        });
    }
    // A long row's threshold bin holds more keys (about 1/16 of a row of N(0, 1) values at most
    // at 11 bits): list them all where the shared memory the row leaves allows, so that the
    // whole-row passes stay for heavily tied rows.
    let extra = if cached { 0 } else { (plan.sk as u64 / 16).saturating_sub(SELECT_CANDIDATES as u64).min((smem_limit as u64 - base) / 4) };
    let smem = if cached { with_cache } else { base + 4 * extra };
    let kernel = if elem_bytes == 2 { names::SELECT_KEYS_16 } else { names::SELECT_KEYS_32 };
    // Rows beyond a few waves go round the grid-stride loop.
    let grid = (plan.row_count() as u64).min(16 * sms as u64) as u32;
    Ok(SelectLaunch { kernel, smem_bytes: smem as u32, cached, grid, cand_cap: SELECT_CANDIDATES + extra as u32 })
}

/// A wide selection's launches: `chunks` CTAs a row of `chunk_words` 32-key words each, one
/// launch a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WideLaunch {
    pub kernel: &'static str,
    pub chunk_words: u32,
    pub chunks: u32,
    /// One launch each; `[SELECT_WIDE_ALL]`: one cooperative launch.
    pub steps: Vec<u32>,
}

impl WideLaunch {
    /// u32 words of the workspace, zeroed before the first step: the rows', then the grid
    /// barrier's counter.
    pub fn work_words(&self, rows: usize) -> usize {
        rows * (SELECT_WIDE_ROW_WORDS + 2 * self.chunks) as usize + 1
    }

    pub fn cooperative(&self) -> bool {
        self.steps == [SELECT_WIDE_ALL]
    }
}

/// How a selection runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SelectRun {
    Rows(SelectLaunch),
    Wide(WideLaunch),
}

/// Rows at least this long, as few as the SMs, run wide: one CTA would take the row alone (a
/// 32K-key row took 0.041 ms one CTA a row, H100).
const WIDE_MIN_KEYS: usize = 16384;

std::thread_local! {
    static FORCED_WIDE: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
    static FORCED_LAUNCHES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Testing hook: while `Some(words)`, every selection this thread runs that may run wide (no
/// block smoothing) does, in chunks of `words` 32-key words (1 to 256), so that small rows
/// exercise the chunk boundaries; `Some(0)`: one CTA a row wherever that fits (the benchmark's
/// comparison). `None`: the plan's own choice.
#[doc(hidden)]
pub fn force_wide_selection(chunk_words: Option<u32>) {
    FORCED_WIDE.with(|f| f.set(chunk_words.map(|w| w.min(SELECT_WIDE_THREADS))));
}

/// Testing hook: while `true`, a wide selection this thread runs takes a launch a step even
/// where its grid would fit one cooperative launch.
#[doc(hidden)]
pub fn force_select_launches(on: bool) {
    FORCED_LAUNCHES.with(|f| f.set(on));
}

/// How `plan` runs over `elem_bytes`-wide bias elements on a GPU with `sms` SMs and
/// `smem_limit` bytes of shared memory per CTA, the wide chunks `forced` where given. A wide grid
/// of at most `resident` CTAs (those the GPU holds at once; 0: none) runs as one cooperative
/// launch, a larger one a launch a step.
pub(crate) fn plan_run(plan: &Plan, elem_bytes: u32, sms: u32, smem_limit: u32, forced: Option<u32>, resident: u32) -> Result<SelectRun> {
    let rows = plan.row_count();
    let row_words = plan.sk.div_ceil(32);
    let one_row = plan_launch(plan, elem_bytes, sms, smem_limit);
    // The wide steps count blocks of keys along grid y; block smoothing needs the whole row.
    let wide_serves = plan.block == 0 && rows <= u16::MAX as usize;
    let few_long = rows <= sms as usize && plan.sk >= WIDE_MIN_KEYS;
    let wide = match forced {
        Some(0) => one_row.is_err(),
        Some(_) => true,
        None => few_long || one_row.is_err(),
    };
    if !wide_serves || !wide {
        return one_row.map(SelectRun::Rows);
    }
    // About two CTAs an SM over all rows, 32 to 256 words each.
    let per_row = (2 * sms as usize).div_ceil(rows);
    let chunk_words = forced.filter(|&w| w > 0).unwrap_or_else(|| row_words.div_ceil(per_row).clamp(32, SELECT_WIDE_THREADS as usize) as u32);
    let chunks = row_words.div_ceil(chunk_words as usize) as u32;
    // One launch saves the others' latency (four dependent launches took ~0.05 ms whatever the
    // row's length).
    let steps = if chunks as u64 * rows as u64 <= resident as u64 {
        vec![SELECT_WIDE_ALL]
    } else {
        let mut steps: Vec<u32> = if plan.k == 0 { vec![] } else { (0..select_digits(8 * elem_bytes)).map(|d| SELECT_WIDE_COUNT + d).collect() };
        steps.extend([SELECT_WIDE_TALLY, SELECT_WIDE_WRITE]);
        steps
    };
    let kernel = if elem_bytes == 2 { names::SELECT_WIDE_16 } else { names::SELECT_WIDE_32 };
    Ok(SelectRun::Wide(WideLaunch { kernel, chunk_words, chunks, steps }))
}

/// Runs `plan` (checked by `SelectKeys::plan`) over `bias` and `mask` on `dev`, into a new tensor.
pub(crate) fn select_keys(dev: &CudaDevice, plan: &Plan, out: Output, bias: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    let (elem_bytes, inf_bits) = match bias.dtype() {
        DType::BF16 => (2, 0x7f80),
        DType::F16 => (2, 0x7c00),
        DType::F32 => (4, 0x7f80_0000),
        other => {
            return Err(Error::DType { arg: "bias", expected: "f16, bf16 or f32 on the CUDA backend".into(), got: other });
        }
    };
    // The kernels count rows, keys and list entries in 32 bits. A k past the row's keys keeps
    // them all, as the row's keys do.
    if plan.rows.iter().chain([&plan.sk]).any(|&d| d > u32::MAX as usize) {
        return Err(Error::Shape { arg: "bias", expected: "dims below 2^32 on the CUDA backend (with the mask's broadcast)".into(), got: plan.shape(Output::Mask) });
    }
    if out == Output::Indices && plan.width > u32::MAX as usize {
        return Err(Error::Param { arg: "k", reason: format!("index lists of {} entries: the CUDA backend's are below 2^32", plan.width) });
    }
    let plan = &Plan { k: plan.k.min(plan.sk), ..plan.clone() };
    let plan_with = |resident| plan_run(plan, elem_bytes, dev.sms(), dev.smem_per_block(), FORCED_WIDE.with(|f| f.get()), resident);
    let mut run = plan_with(0)?;
    if let SelectRun::Wide(w) = &run
        && !FORCED_LAUNCHES.with(|f| f.get())
    {
        run = plan_with(dev.resident_ctas(w.kernel, SELECT_WIDE_THREADS, 4 * SELECT_FIXED_WORDS)?)?;
    }
    let device = Device::Cuda(dev.clone());
    let row_words = plan.sk.div_ceil(32);
    let rows = plan.row_count();
    // The packed form's rows are whole u32 words (what the kernel stores), viewed as their bytes.
    let (tensor, view) = match out {
        Output::Packed => {
            let words = Tensor::empty(&[plan.rows[0], plan.rows[1], plan.rows[2], 4 * row_words], DType::U8, &device)?;
            let shape = plan.shape(out);
            let strides = [plan.rows[1] * plan.rows[2] * 4 * row_words, plan.rows[2] * 4 * row_words, 4 * row_words, 1];
            let view = words.as_strided(&shape, &strides, 0)?;
            (words, view)
        }
        _ => {
            let t = Tensor::empty(&plan.shape(out), if out == Output::Mask { DType::Bool } else { DType::I32 }, &device)?;
            (t.clone(), t)
        }
    };
    let ptr = tensor.device_ptr().expect("CUDA tensor");
    let at = |o: Output| if o == out { ptr } else { 0 };
    let params = SelectParams {
        bias: broadcast_view(bias),
        mask: mask.map_or(View4::ABSENT, broadcast_view),
        out_mask: at(Output::Mask),
        out_bits: at(Output::Packed),
        out_indices: at(Output::Indices),
        dims: [plan.rows[0], plan.rows[1], plan.rows[2], plan.sk].map(|x| x as u32),
        k: plan.k as u32,
        block: plan.block as u32,
        width: plan.width as u32,
        row_words: row_words as u32,
        inf_bits,
        cached: 0,
        cand_cap: 0,
        _pad: 0,
    };
    match run {
        _ if rows == 0 => {}
        SelectRun::Rows(l) => {
            let params = SelectParams { cached: l.cached as u32, cand_cap: l.cand_cap, ..params };
            launch(dev, &Launch::kernel(l.kernel, (l.grid, 1, 1), SELECT_THREADS, l.smem_bytes), params)?;
        }
        SelectRun::Wide(w) => {
            // Dropped after the launches are queued: freed in stream order.
            let work = DeviceBuffer::filled(dev.stream(), 4 * w.work_words(rows), 0)?;
            for &step in &w.steps {
                let wide = SelectWideParams { sel: params, work: work.ptr(), chunk_words: w.chunk_words, chunks: w.chunks, step, _pad: 0 };
                let l = Launch::kernel(w.kernel, (w.chunks, rows as u32, 1), SELECT_WIDE_THREADS, 4 * SELECT_FIXED_WORDS);
                launch(dev, &if w.cooperative() { l.cooperative() } else { l }, wide)?;
            }
        }
    }
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(rows: usize, sk: usize, block: usize) -> Plan {
        Plan { rows: [1, 1, rows], sk, k: 16, block, width: 16 }
    }

    #[test]
    fn rows_that_fit_are_cached_and_long_rows_read_again() {
        let h100 = 227 * 1024;
        // Five CTAs an SM: 44.6 KB each, which 8K bf16 keys fit with the rest (19 KB).
        assert_eq!(cta_share(h100, 2), 45670);
        let l = plan_launch(&plan(32768, 8192, 0), 2, 132, h100).unwrap();
        assert!(l.cached && l.smem_bytes <= cta_share(h100, 2) && l.kernel == names::SELECT_KEYS_16);
        assert_eq!(l.grid, 16 * 132);
        // 32K bf16 keys would take 64 KB more: read again instead, as are 16K f32 keys.
        let l = plan_launch(&plan(32768, 32768, 0), 2, 132, h100).unwrap();
        assert!(!l.cached && l.smem_bytes <= cta_share(h100, 2), "{l:?}");
        let l = plan_launch(&plan(1000, 16384, 0), 4, 132, h100).unwrap();
        assert!(!l.cached && l.grid == 1000 && l.kernel == names::SELECT_KEYS_32);
        // A few rows (one an SM or fewer) are cached up to half an SM's shared memory.
        let l = plan_launch(&plan(4, 32768, 0), 2, 132, h100).unwrap();
        assert!(l.cached && l.smem_bytes > cta_share(h100, 2), "{l:?}");
        // 512K keys: the two bitmaps (128 KB) fit an H100, not an SM 8.6 GPU (99 KB).
        let long = plan_launch(&plan(1, 1 << 19, 0), 2, 132, h100).unwrap();
        // Its threshold bin listed in the shared memory the bitmaps leave.
        assert!(!long.cached && long.smem_bytes <= h100 && long.cand_cap > 16384, "{long:?}");
        let e = plan_launch(&plan(1, 1 << 19, 0), 2, 84, 99 * 1024).unwrap_err();
        assert!(matches!(e, Error::Param { arg: "bias", .. }), "{e}");
    }

    #[test]
    fn few_long_rows_run_wide() {
        let h100 = 227 * 1024;
        let wide = |p: &Plan, bytes, forced| match plan_run(p, bytes, 132, h100, forced, 0).unwrap() {
            SelectRun::Wide(w) => Some(w),
            SelectRun::Rows(_) => None,
        };
        // One 512K-key row: about two CTAs an SM, a histogram launch a digit, tally, write.
        let w = wide(&plan(1, 1 << 19, 0), 2, None).unwrap();
        assert_eq!((w.chunk_words, w.chunks), (63, 261));
        assert_eq!(w.steps, [SELECT_WIDE_COUNT, SELECT_WIDE_COUNT + 1, SELECT_WIDE_TALLY, SELECT_WIDE_WRITE]);
        assert_eq!(w.work_words(1), (SELECT_WIDE_ROW_WORDS + 2 * 261) as usize + 1);
        // Where the GPU holds the grid at once: one cooperative launch.
        let coop = plan_run(&plan(1, 1 << 19, 0), 2, 132, h100, None, 4 * 132).unwrap();
        assert!(matches!(&coop, SelectRun::Wide(w) if w.cooperative() && w.steps == [SELECT_WIDE_ALL]), "{coop:?}");
        let many = plan_run(&plan(1000, 1 << 20, 0), 2, 132, h100, None, 4 * 132).unwrap();
        assert!(matches!(&many, SelectRun::Wide(w) if !w.cooperative()), "{many:?}");
        // f32 keys take three digits; a relu selection none.
        assert_eq!(wide(&plan(8, 1 << 16, 0), 4, None).unwrap().steps.len(), 5);
        let relu = Plan { k: 0, ..plan(8, 1 << 16, 0) };
        assert_eq!(wide(&relu, 2, None).unwrap().steps, [SELECT_WIDE_TALLY, SELECT_WIDE_WRITE]);
        // Past one CTA's shared memory: wide, however many rows.
        let w = wide(&plan(1000, 1 << 20, 0), 2, None).unwrap();
        assert_eq!((w.chunk_words, w.chunks), (256, 128));
        // Rows that fill the GPU, short rows and smoothed rows run one CTA a row.
        assert!(wide(&plan(32768, 32768, 0), 2, None).is_none());
        assert!(wide(&plan(4, 8192, 0), 2, None).is_none());
        assert!(wide(&plan(4, 32768, 16), 2, None).is_none());
        assert!(plan_run(&plan(1, 1 << 20, 16), 2, 132, h100, None, 0).is_err());
        // Forced: any chunk size, smoothing excepted.
        assert_eq!(wide(&plan(3, 100, 0), 2, Some(1)).unwrap().chunks, 4);
        assert!(wide(&plan(3, 100, 2), 2, Some(1)).is_none());
        // Forced to one CTA a row where that fits.
        assert!(wide(&plan(1, 1 << 19, 0), 2, Some(0)).is_none());
        assert!(wide(&plan(1, 1 << 20, 0), 2, Some(0)).is_some());
    }

    #[test]
    fn block_votes_take_shared_memory() {
        let a = plan_launch(&plan(1, 1 << 16, 0), 2, 132, 227 * 1024).unwrap();
        let b = plan_launch(&plan(1, 1 << 16, 1), 2, 132, 227 * 1024).unwrap();
        // One vote bit per key with blocks of 1.
        assert_eq!(b.smem_bytes - a.smem_bytes, (1 << 16) / 8);
    }
}
