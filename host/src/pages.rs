//! A paged KV cache's block table: which pages of k and v `[num_pages, page_size, kv_heads,
//! head_dim]` hold each sequence's keys.
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::seqlens::SeqLens;
use crate::tensor::Tensor;
use std::sync::Arc;

/// The block table of a paged KV cache, as FlashAttention and FlashInfer take it: int32
/// `[batch, max_pages]`, sequence `b`'s key `j` at row `j % page_size` of page
/// `table[b][j / page_size]` of k and v. Only the entries a sequence's keys reach are read (the
/// rest may hold anything, such as -1); they must be pages of the k and v a call passes, which
/// each call checks on the host copy this keeps. Validated once and reused by the layers of a
/// decoding step; held on the device the calls run on.
///
/// ```
/// # fn main() -> dmattn::Result<()> {
/// use dmattn::{attention, DType, Device, PageTable, SeqLens, Tensor};
/// let dev = Device::Cpu;
/// // Two sequences of 1 query over 70 and 3 keys, in pages of 64 keys: the first in pages 2
/// // and 0, the second in page 1.
/// let lens = SeqLens::from_lengths(&[1, 1], &[70, 3], &dev)?;
/// let table = PageTable::new(&[2, 0, 1, -1], 2, &dev)?;
/// let q = Tensor::from_fn(&[2, 4, 32], DType::F32, &dev, |i| (i as f64 * 0.37).sin())?;
/// let kv = Tensor::from_fn(&[3, 64, 2, 32], DType::F32, &dev, |i| (i as f64 * 0.11).cos())?;
/// let fwd = attention(&q, &kv, &kv).seqlens(&lens).kv_pages(&table).forward()?;
/// assert_eq!(fwd.out.shape(), &[2, 4, 32]);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PageTable {
    inner: Arc<Inner>,
}

struct Inner {
    table: Vec<i32>,
    batch: usize,
    max_pages: usize,
    device: Tensor,
}

impl PageTable {
    /// From the row-major `[batch, table.len() / batch]` entries, copied to `device`.
    pub fn new(table: &[i32], batch: usize, device: &Device) -> Result<PageTable> {
        if batch == 0 || table.is_empty() || table.len() % batch != 0 {
            return Err(Error::Shape { arg: "block_table", expected: format!("[{batch}, max_pages] (batch rows of at least one entry)"), got: vec![table.len()] });
        }
        let max_pages = table.len() / batch;
        let tensor = Tensor::from_vec(table.to_vec(), &[batch, max_pages], device)?;
        Self::checked(table.to_vec(), batch, max_pages, tensor)
    }

    /// From an int32 `[batch, max_pages]` tensor, on its device: read back once (a CUDA tensor's
    /// read waits for the device) and copied, so that later writes to the tensor (a framework's
    /// table, updated in place between decoding steps) need a new `PageTable`.
    pub fn from_tensor(table: &Tensor) -> Result<PageTable> {
        if table.dtype() != DType::I32 {
            return Err(Error::DType { arg: "block_table", expected: "I32".into(), got: table.dtype() });
        }
        let [batch, max_pages] = <[usize; 2]>::try_from(table.shape())
            .ok()
            .filter(|s| s.iter().all(|&n| n > 0))
            .ok_or_else(|| Error::Shape { arg: "block_table", expected: "[batch, max_pages], both at least 1".into(), got: table.shape().to_vec() })?;
        let entries = table.to_vec::<i32>()?;
        // A copy: the kernels read what was validated, whatever the caller's tensor holds later.
        let tensor = Tensor::from_vec(entries.clone(), &[batch, max_pages], &table.device())?;
        Self::checked(entries, batch, max_pages, tensor)
    }

    fn checked(table: Vec<i32>, batch: usize, max_pages: usize, device: Tensor) -> Result<PageTable> {
        // The kernels index it in 32 bits.
        if table.len() > u32::MAX as usize {
            return Err(Error::Shape { arg: "block_table", expected: "fewer than 2^32 entries".into(), got: vec![batch, max_pages] });
        }
        Ok(PageTable { inner: Arc::new(Inner { table, batch, max_pages, device }) })
    }

    /// Sequences (table rows).
    pub fn batch(&self) -> usize {
        self.inner.batch
    }

    /// Entries per row.
    pub fn max_pages(&self) -> usize {
        self.inner.max_pages
    }

    /// The device the table is on (a call's must be its q's).
    pub fn device(&self) -> Device {
        self.inner.device.device()
    }

    /// Sequence `b`'s `i`-th entry; `None` past the table.
    pub fn page(&self, b: usize, i: usize) -> Option<i32> {
        (b < self.inner.batch && i < self.inner.max_pages).then(|| self.inner.table[b * self.inner.max_pages + i])
    }

    /// An entry a validated call reads.
    fn entry(&self, b: usize, i: usize) -> i32 {
        self.inner.table[b * self.inner.max_pages + i]
    }

    /// The table on the device (int32 `[batch, max_pages]`, contiguous).
    pub(crate) fn device_tensor(&self) -> &Tensor {
        &self.inner.device
    }

    /// Checks that the table serves `seqs` with `num_pages` pages of `page_size` keys: a row per
    /// sequence, and every entry a sequence's keys reach a page of k and v. Then the page of
    /// sequence `b`'s key `j` is `self.page(b, j / page_size)`, in range.
    pub(crate) fn check(&self, seqs: &SeqLens, num_pages: usize, page_size: usize) -> Result<()> {
        if self.batch() != seqs.batch() {
            return Err(Error::Shape { arg: "block_table", expected: format!("[{}, max_pages] (a row per sequence of seqlens)", seqs.batch()), got: vec![self.batch(), self.max_pages()] });
        }
        for b in 0..seqs.batch() {
            let pages = seqs.rows(b).1.len().div_ceil(page_size);
            if pages > self.max_pages() {
                let reason = format!("row {b} has {} entries, its {} keys need {pages} pages of {page_size}", self.max_pages(), seqs.rows(b).1.len());
                return Err(Error::Param { arg: "block_table", reason });
            }
            if let Some(i) = (0..pages).find(|&i| !(0..num_pages as i64).contains(&(self.entry(b, i) as i64))) {
                let reason = format!("entry [{b}][{i}] is {}, not a page of k and v (0..{num_pages})", self.entry(b, i));
                return Err(Error::Param { arg: "block_table", reason });
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for PageTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageTable").field("batch", &self.inner.batch).field("max_pages", &self.inner.max_pages).finish()
    }
}
