//! Packed variable-length batches: where each sequence's queries and keys are in q
//! `[total_q, heads, head_dim]` and k/v `[total_k, kv_heads, head_dim]` (`cu_seqlens`).
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::memory::DeviceBuffer;
use std::sync::{Arc, Mutex};

/// The sequence boundaries of a packed batch, validated once and reused by every call (the
/// layers of a model share them): `cu_seqlens_q` and `cu_seqlens_k`, int32 prefix sums of
/// `batch + 1` entries starting at 0, sequence `b` owning query rows `cu_q[b]..cu_q[b + 1]` and
/// key rows `cu_k[b]..cu_k[b + 1]`. Sequences of length 0 are allowed. Held on the device the
/// calls run on (a CUDA call reads them there; building them from host slices copies them once).
///
/// ```
/// # fn main() -> dmattn::Result<()> {
/// use dmattn::{attention, DType, Device, SeqLens, Tensor};
/// let dev = Device::Cpu;
/// // Three documents of 5, 0 and 3 tokens, each attending causally to itself.
/// let lens = SeqLens::from_lengths(&[5, 0, 3], &[5, 0, 3], &dev)?;
/// let q = Tensor::from_fn(&[8, 2, 16], DType::F32, &dev, |i| (i as f64 * 0.37).sin())?;
/// let fwd = attention(&q, &q, &q).seqlens(&lens).causal(true).forward()?;
/// assert_eq!((fwd.out.shape(), fwd.lse.shape()), (&[8, 2, 16][..], &[2, 8][..]));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SeqLens {
    inner: Arc<Inner>,
}

struct Inner {
    cu_q: Vec<usize>,
    cu_k: Vec<usize>,
    max_q: usize,
    max_k: usize,
    /// The prefix sums as int32 `[batch + 1]` on the device.
    device_q: Tensor,
    device_k: Tensor,
    /// Forward work orders built for these lengths, by tile, heads and band (`cuda::packed`).
    orders: Mutex<Vec<([u32; 8], Arc<DeviceBuffer>)>>,
}

/// Checks one prefix-sum array: at least two entries, starting at 0, non-decreasing, within
/// int32.
fn check_cu(arg: &'static str, cu: &[i64]) -> Result<Vec<usize>> {
    if cu.len() < 2 {
        return Err(Error::Shape { arg, expected: "[batch + 1] with batch >= 1 (prefix sums starting at 0)".into(), got: vec![cu.len()] });
    }
    if cu[0] != 0 {
        return Err(Error::Param { arg, reason: format!("starts at {}, must start at 0", cu[0]) });
    }
    if let Some(i) = (1..cu.len()).find(|&i| cu[i] < cu[i - 1]) {
        return Err(Error::Param { arg, reason: format!("decreases at entry {i} ({} after {}): must be non-decreasing", cu[i], cu[i - 1]) });
    }
    let last = cu[cu.len() - 1];
    if last > i32::MAX as i64 {
        return Err(Error::Param { arg, reason: format!("ends at {last}, past the int32 range") });
    }
    Ok(cu.iter().map(|&x| x as usize).collect())
}

fn max_len(cu: &[usize]) -> usize {
    cu.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
}

impl SeqLens {
    /// From the prefix sums, copied to `device`.
    pub fn new(cu_seqlens_q: &[i32], cu_seqlens_k: &[i32], device: &Device) -> Result<SeqLens> {
        let wide = |cu: &[i32]| cu.iter().map(|&x| x as i64).collect::<Vec<_>>();
        Self::checked(wide(cu_seqlens_q), wide(cu_seqlens_k), device)
    }

    /// From each sequence's query and key lengths.
    pub fn from_lengths(lens_q: &[usize], lens_k: &[usize], device: &Device) -> Result<SeqLens> {
        let sums = |lens: &[usize]| {
            std::iter::once(0).chain(lens.iter().scan(0i64, |acc, &n| {
                *acc = acc.saturating_add(n.min(i64::MAX as usize) as i64);
                Some(*acc)
            }))
            .collect::<Vec<_>>()
        };
        Self::checked(sums(lens_q), sums(lens_k), device)
    }

    /// From int32 `[batch + 1]` tensors, on the device they are on: read back once to be
    /// validated (a CUDA tensor's read waits for the device) and copied, as `PageTable` copies its
    /// table, so that the kernels read what was validated whatever the caller's tensors hold later
    /// (a framework's buffers, refilled in place between steps, need a new `SeqLens`, and a CUDA
    /// graph captured over one a new capture).
    pub fn from_tensors(cu_seqlens_q: &Tensor, cu_seqlens_k: &Tensor) -> Result<SeqLens> {
        let read = |arg: &'static str, t: &Tensor| -> Result<Vec<i64>> {
            if t.dtype() != DType::I32 {
                return Err(Error::DType { arg, expected: "I32".into(), got: t.dtype() });
            }
            if t.shape().len() != 1 {
                return Err(Error::Shape { arg, expected: "[batch + 1]".into(), got: t.shape().to_vec() });
            }
            Ok(t.to_vec::<i32>()?.into_iter().map(|x| x as i64).collect())
        };
        let device = cu_seqlens_q.device();
        if !cu_seqlens_k.device().same(&device) {
            return Err(Error::Device { arg: "cu_seqlens_k", expected: format!("{device} (the device of cu_seqlens_q)"), got: cu_seqlens_k.device().to_string() });
        }
        let (q, k) = (read("cu_seqlens_q", cu_seqlens_q)?, read("cu_seqlens_k", cu_seqlens_k)?);
        Self::checked(q, k, &device)
    }

    fn checked(q: Vec<i64>, k: Vec<i64>, device: &Device) -> Result<SeqLens> {
        let cu_q = check_cu("cu_seqlens_q", &q)?;
        let cu_k = check_cu("cu_seqlens_k", &k)?;
        if cu_k.len() != cu_q.len() {
            return Err(Error::Shape { arg: "cu_seqlens_k", expected: format!("[{}] (the batch + 1 of cu_seqlens_q)", cu_q.len()), got: vec![cu_k.len()] });
        }
        let upload = |cu: &[usize]| Tensor::from_vec(cu.iter().map(|&x| x as i32).collect::<Vec<_>>(), &[cu.len()], device);
        let (device_q, device_k) = (upload(&cu_q)?, upload(&cu_k)?);
        let (max_q, max_k) = (max_len(&cu_q), max_len(&cu_k));
        Ok(SeqLens { inner: Arc::new(Inner { cu_q, cu_k, max_q, max_k, device_q, device_k, orders: Mutex::new(Vec::new()) }) })
    }

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.inner.cu_q.len() - 1
    }

    /// Query and key rows of all sequences.
    pub fn total_q(&self) -> usize {
        *self.inner.cu_q.last().expect("validated")
    }

    pub fn total_k(&self) -> usize {
        *self.inner.cu_k.last().expect("validated")
    }

    /// The longest sequence's query and key lengths.
    pub fn max_seqlen_q(&self) -> usize {
        self.inner.max_q
    }

    pub fn max_seqlen_k(&self) -> usize {
        self.inner.max_k
    }

    /// Sequence `b`'s query and key rows.
    pub fn rows(&self, b: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let i = &self.inner;
        (i.cu_q[b]..i.cu_q[b + 1], i.cu_k[b]..i.cu_k[b + 1])
    }

    pub fn device(&self) -> Device {
        self.inner.device_q.device()
    }

    /// Whether both describe the same sequences (the same lengths, in order).
    pub(crate) fn same_lengths(&self, other: &SeqLens) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner) || (self.inner.cu_q == other.inner.cu_q && self.inner.cu_k == other.inner.cu_k)
    }

    /// The prefix sums on the device (int32 `[batch + 1]`).
    pub(crate) fn device_tensors(&self) -> (&Tensor, &Tensor) {
        (&self.inner.device_q, &self.inner.device_k)
    }

    /// The work order of `key`, built by `make` on first use.
    pub(crate) fn cached_order(&self, key: [u32; 8], make: impl FnOnce() -> Result<Arc<DeviceBuffer>>) -> Result<Arc<DeviceBuffer>> {
        // Held while it is built: two threads never build one twice.
        let mut orders = self.inner.orders.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, order)) = orders.iter().find(|(k, _)| *k == key) {
            return Ok(order.clone());
        }
        let order = make()?;
        orders.push((key, order.clone()));
        Ok(order)
    }

    /// The work order of `key` if one was built.
    pub(crate) fn kept_order(&self, key: [u32; 8]) -> Option<Arc<DeviceBuffer>> {
        let orders = self.inner.orders.lock().unwrap_or_else(|e| e.into_inner());
        orders.iter().find(|(k, _)| *k == key).map(|(_, order)| order.clone())
    }
}

impl std::fmt::Debug for SeqLens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqLens").field("cu_seqlens_q", &self.inner.cu_q).field("cu_seqlens_k", &self.inner.cu_k).finish()
    }
}
