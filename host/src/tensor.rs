//! Tensors: a dtype, a strided layout and storage on the CPU or a CUDA device.
use crate::device::{CudaDevice, Device};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::memory::DeviceBuffer;
use cudarc::driver::result::memcpy_dtoh_async;
use cudarc::driver::{CudaSlice, CudaView, DevicePtr, DeviceRepr};
use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

static POISON: AtomicBool = AtomicBool::new(false);

/// While on, every output buffer dmattn allocates starts as 0xFF bytes (NaN), on the CPU and the
/// GPU alike, so a test sees any element a kernel leaves unwritten. Off by default.
pub fn set_output_poisoning(on: bool) {
    POISON.store(on, Ordering::Relaxed);
}

#[derive(Clone)]
pub(crate) enum Storage {
    Cpu(Arc<Vec<u8>>),
    Cuda(Arc<DeviceMemory>, CudaDevice),
}

/// Device memory a tensor reads or writes.
pub(crate) enum DeviceMemory {
    /// Allocated by dmattn on its device's stream (freed there, in stream order, when the last
    /// tensor over it is dropped).
    Owned(DeviceBuffer),
    /// The caller's: `bytes` bytes at `ptr`, kept allocated by `owner` or, without one, by the
    /// caller's promise ([`Tensor::from_raw_parts`]).
    External { ptr: u64, bytes: usize, _owner: Option<Arc<dyn Any + Send + Sync>> },
}

impl DeviceMemory {
    fn bytes(&self) -> usize {
        match self {
            DeviceMemory::Owned(buf) => buf.bytes(),
            DeviceMemory::External { bytes, .. } => *bytes,
        }
    }

    fn ptr(&self) -> u64 {
        match self {
            DeviceMemory::Owned(buf) => buf.ptr(),
            DeviceMemory::External { ptr, .. } => *ptr,
        }
    }
}

/// A strided view of storage. Strides are in elements; dimensions of size 1 may have any stride.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    /// First element, in elements from the start of the storage.
    pub offset: usize,
}

/// The product of `dims`, `None` where it overflows usize (sizes from the caller's shapes).
pub(crate) fn checked_product(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

impl Layout {
    pub fn contiguous(shape: &[usize]) -> Self {
        // Saturating: a stride past usize belongs to a shape with a 0 dimension (no element
        // uses it) or one whose elements overflow usize ([`Layout::checked_numel`] rejects it).
        let mut strides = vec![1usize; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1].saturating_mul(shape[i + 1]);
        }
        Layout { shape: shape.to_vec(), strides, offset: 0 }
    }

    /// Elements of the shape (saturating at `usize::MAX`: a tensor's layout was checked not to
    /// overflow when the tensor was made).
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }

    /// Elements of the shape, `None` where their number overflows usize.
    fn checked_numel(&self) -> Option<usize> {
        checked_product(&self.shape)
    }

    /// Bytes of a contiguous `dtype` tensor of `shape`, or a typed error naming `arg` where they
    /// overflow usize.
    fn contiguous_bytes(shape: &[usize], dtype: DType, arg: &'static str) -> Result<(Layout, usize)> {
        let layout = Layout::contiguous(shape);
        match layout.checked_numel().and_then(|n| n.checked_mul(dtype.size_in_bytes())) {
            Some(bytes) => Ok((layout, bytes)),
            None => Err(Error::Shape { arg, expected: format!("a shape of fewer than 2^{} bytes of {dtype:?}", usize::BITS), got: shape.to_vec() }),
        }
    }

    pub fn is_contiguous(&self) -> bool {
        let c = Layout::contiguous(&self.shape);
        self.shape.iter().zip(self.strides.iter().zip(&c.strides)).all(|(&n, (&s, &cs))| n == 1 || s == cs)
    }

    /// One past the furthest element, in elements from the start of the storage; `None` where
    /// the elements or that offset overflow usize.
    fn extent(&self) -> Option<usize> {
        if self.checked_numel()? == 0 {
            return Some(self.offset);
        }
        let last = self.shape.iter().zip(&self.strides).try_fold(self.offset, |at, (&n, &s)| at.checked_add((n - 1).checked_mul(s)?))?;
        last.checked_add(1)
    }

    /// Storage index of every element in row-major logical order.
    pub(crate) fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.numel();
        (0..n).map(move |mut flat| {
            let mut at = self.offset;
            for d in (0..self.shape.len()).rev() {
                at += (flat % self.shape[d]) * self.strides[d];
                flat /= self.shape[d];
            }
            at
        })
    }
}

#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Storage,
    pub(crate) dtype: DType,
    pub(crate) layout: Layout,
}

/// The device memory of output tensors: every element is written before it is read, by the
/// kernel producing the output, or (`poison`) shows as NaN.
fn output_buffer(dev: &CudaDevice, bytes: usize, poison: bool) -> Result<DeviceBuffer> {
    if poison { DeviceBuffer::filled(dev.stream(), bytes, 0xFF) } else { DeviceBuffer::uninit(dev.stream(), bytes) }
}

impl Tensor {
    /// A contiguous tensor of `shape` holding `data` (row-major), on `device`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: &Device) -> Result<Tensor> {
        let layout = Layout::contiguous(shape);
        if data.len() != layout.numel() {
            return Err(Error::Shape {
                arg: "data",
                expected: format!("{} elements for shape {shape:?}", layout.numel()),
                got: vec![data.len()],
            });
        }
        let size = T::DTYPE.size_in_bytes();
        let mut bytes = vec![0u8; data.len() * size];
        for (v, out) in data.into_iter().zip(bytes.chunks_exact_mut(size)) {
            v.write_le(out);
        }
        Tensor::from_bytes(bytes, T::DTYPE, layout, device)
    }

    /// A contiguous tensor of `shape` whose elements are `f(i)` for the row-major index `i`,
    /// rounded to `dtype`.
    pub fn from_fn(shape: &[usize], dtype: DType, device: &Device, f: impl Fn(usize) -> f64) -> Result<Tensor> {
        let (layout, bytes) = Layout::contiguous_bytes(shape, dtype, "shape")?;
        let size = dtype.size_in_bytes();
        let mut bytes = vec![0u8; bytes];
        for (i, out) in bytes.chunks_exact_mut(size).enumerate() {
            dtype.encode(f(i), out);
        }
        Tensor::from_bytes(bytes, dtype, layout, device)
    }

    pub(crate) fn from_bytes(bytes: Vec<u8>, dtype: DType, layout: Layout, device: &Device) -> Result<Tensor> {
        let storage = match device {
            Device::Cpu => Storage::Cpu(Arc::new(bytes)),
            Device::Cuda(dev) => {
                let buf = DeviceBuffer::from_host(dev.stream(), &bytes)?;
                Storage::Cuda(Arc::new(DeviceMemory::Owned(buf)), dev.clone())
            }
        };
        Ok(Tensor { storage, dtype, layout })
    }

    /// An output buffer its producer writes in full: uninitialised on the GPU, zeroed on the
    /// CPU, or filled with 0xFF bytes (NaN in every float type) while
    /// [`crate::set_output_poisoning`] is on, so that an element a kernel fails to write shows.
    pub(crate) fn empty(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let layout = Layout::contiguous(shape);
        let bytes = layout.numel() * dtype.size_in_bytes();
        let poison = POISON.load(Ordering::Relaxed);
        let storage = match device {
            Device::Cpu => Storage::Cpu(Arc::new(vec![if poison { 0xFF } else { 0 }; bytes])),
            Device::Cuda(dev) => Storage::Cuda(Arc::new(DeviceMemory::Owned(output_buffer(dev, bytes, poison)?)), dev.clone()),
        };
        Ok(Tensor { storage, dtype, layout })
    }

    /// Output buffers as [`Tensor::empty`] makes them, in one allocation (one allocator call
    /// instead of one per tensor: a decoding call's host time is mostly such calls), each part
    /// 256-byte aligned. The memory is freed when the last of them is dropped.
    pub(crate) fn empty_together(parts: &[(&[usize], DType)], device: &Device) -> Result<Vec<Tensor>> {
        let Device::Cuda(dev) = device else {
            return parts.iter().map(|(shape, dtype)| Tensor::empty(shape, *dtype, device)).collect();
        };
        let mut offsets = Vec::with_capacity(parts.len());
        let mut bytes = 0;
        for (shape, dtype) in parts {
            offsets.push(bytes);
            bytes += (Layout::contiguous(shape).numel() * dtype.size_in_bytes()).next_multiple_of(256);
        }
        let memory = Arc::new(DeviceMemory::Owned(output_buffer(dev, bytes, POISON.load(Ordering::Relaxed))?));
        Ok(parts
            .iter()
            .zip(offsets)
            .map(|((shape, dtype), at)| Tensor {
                storage: Storage::Cuda(memory.clone(), dev.clone()),
                dtype: *dtype,
                layout: Layout { offset: at / dtype.size_in_bytes(), ..Layout::contiguous(shape) },
            })
            .collect())
    }

    /// A tensor of `layout` over dmattn's own device buffer (which it keeps alive).
    pub(crate) fn from_device_buffer(buf: DeviceBuffer, dtype: DType, layout: Layout, dev: &CudaDevice) -> Tensor {
        Tensor { storage: Storage::Cuda(Arc::new(DeviceMemory::Owned(buf)), dev.clone()), dtype, layout }
    }

    /// A contiguous tensor of `shape` over a caller's device buffer, without a copy: the tensor
    /// keeps `slice` alive, and dmattn reads or writes it on `device`'s stream, after the work
    /// queued there. Where the context tracks events (cudarc's default), the stream also waits
    /// for the last write to `slice` on another stream. `slice` must belong to `device`'s
    /// context and hold exactly the shape's elements; [`Tensor::as_strided`] gives other views.
    pub fn from_cuda_slice<T: Element + DeviceRepr>(slice: impl Into<Arc<CudaSlice<T>>>, shape: &[usize], device: &CudaDevice) -> Result<Tensor> {
        let slice = slice.into();
        let arg = "slice";
        if slice.context().cu_ctx() != device.context().cu_ctx() {
            return Err(Error::Device { arg, expected: format!("{}", Device::Cuda(device.clone())), got: "a buffer of another CUDA context".into() });
        }
        let layout = Layout::contiguous(shape);
        if slice.len() != layout.numel() {
            return Err(Error::Shape { arg, expected: format!("{} elements for shape {shape:?}", slice.len()), got: shape.to_vec() });
        }
        let (ptr, _record) = slice.device_ptr(device.stream());
        let bytes = slice.len() * T::DTYPE.size_in_bytes();
        let memory = DeviceMemory::External { ptr, bytes, _owner: Some(slice.clone()) };
        Ok(Tensor { storage: Storage::Cuda(Arc::new(memory), device.clone()), dtype: T::DTYPE, layout })
    }

    /// A contiguous tensor of `shape` over the memory a caller's view covers, without a copy.
    ///
    /// # Safety
    /// The viewed memory must stay allocated, and be written by nobody else, until the returned
    /// tensor, every tensor made from it and every [`crate::Forward`] holding it are dropped and
    /// the work dmattn queued on `device`'s stream over it has finished; the view's writes on
    /// other streams must be ordered before `device`'s stream by the caller.
    pub unsafe fn from_cuda_view<T: Element + DeviceRepr>(view: &CudaView<'_, T>, shape: &[usize], device: &CudaDevice) -> Result<Tensor> {
        let (ptr, _record) = view.device_ptr(device.stream());
        let layout = Layout::contiguous(shape);
        if view.len() != layout.numel() {
            return Err(Error::Shape { arg: "view", expected: format!("{} elements for shape {shape:?}", view.len()), got: shape.to_vec() });
        }
        // Safety: forwarded to the caller.
        unsafe { Tensor::from_raw_parts(ptr, view.len(), T::DTYPE, layout, device, None) }
    }

    /// A tensor over `len` elements of `dtype` at device address `ptr` in `device`'s context,
    /// seen through `layout` (shape, strides and offset in elements), without a copy: how a
    /// framework (PyTorch's `data_ptr()`, a candle storage) lends its memory. `owner`, if given,
    /// is kept alive as long as the memory is used.
    ///
    /// # Safety
    /// `ptr` must address `len` elements of `dtype` of device memory of `device`'s context that
    /// stays allocated, and is written by nobody else, as long as `owner` lives, or without an
    /// owner until the tensor, every tensor made from it and every [`crate::Forward`] holding it
    /// are dropped and the work dmattn queued over it on `device`'s stream has finished. Writes
    /// by others must be ordered before that stream's work by the caller.
    pub unsafe fn from_raw_parts(
        ptr: u64,
        len: usize,
        dtype: DType,
        layout: Layout,
        device: &CudaDevice,
        owner: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Result<Tensor> {
        if ptr == 0 && len > 0 {
            return Err(Error::Param { arg: "ptr", reason: "a null device address".into() });
        }
        if !ptr.is_multiple_of(dtype.size_in_bytes() as u64) {
            return Err(Error::Param { arg: "ptr", reason: format!("{ptr:#x} is not aligned to its {:?} elements", dtype) });
        }
        let Some(bytes) = len.checked_mul(dtype.size_in_bytes()) else {
            return Err(Error::Param { arg: "len", reason: format!("{len} elements of {dtype:?} overflow the address space") });
        };
        let memory = DeviceMemory::External { ptr, bytes, _owner: owner };
        let whole = Tensor { storage: Storage::Cuda(Arc::new(memory), device.clone()), dtype, layout: Layout::contiguous(&[len]) };
        whole.as_strided(&layout.shape, &layout.strides, layout.offset)
    }

    /// A view of the same storage with another shape, strides (elements) and offset.
    pub fn as_strided(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<Tensor> {
        let layout = Layout { shape: shape.to_vec(), strides: strides.to_vec(), offset };
        if shape.len() != strides.len() {
            return Err(Error::Param { arg: "strides", reason: format!("{} strides for a {}-D shape", strides.len(), shape.len()) });
        }
        match layout.extent() {
            None => return Err(Error::Param { arg: "strides", reason: format!("the view of shape {shape:?} and strides {strides:?} from element {offset} overflows usize") }),
            Some(extent) if extent > self.storage_len() => {
                return Err(Error::Param { arg: "strides", reason: format!("the view reaches element {extent} of storage holding {}", self.storage_len()) });
            }
            Some(_) => {}
        }
        Ok(Tensor { storage: self.storage.clone(), dtype: self.dtype, layout })
    }

    pub(crate) fn storage_len(&self) -> usize {
        let bytes = match &self.storage {
            Storage::Cpu(b) => b.len(),
            Storage::Cuda(b, _) => b.bytes(),
        };
        bytes / self.dtype.size_in_bytes()
    }

    pub fn shape(&self) -> &[usize] {
        &self.layout.shape
    }

    pub fn strides(&self) -> &[usize] {
        &self.layout.strides
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> Device {
        match &self.storage {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(_, d) => Device::Cuda(d.clone()),
        }
    }

    /// The storage bytes on the host (a device copy for CUDA tensors).
    fn host_bytes(&self) -> Result<Arc<Vec<u8>>> {
        match &self.storage {
            Storage::Cpu(b) => Ok(b.clone()),
            Storage::Cuda(memory, dev) => {
                let mut bytes = vec![0u8; memory.bytes()];
                // Safety: the memory holds `bytes.len()` bytes (an owned buffer's length, or the
                // caller's promise for external memory); the copy is complete after the sync.
                unsafe { memcpy_dtoh_async(&mut bytes, memory.ptr(), dev.stream().cu_stream())? };
                dev.synchronize()?;
                Ok(Arc::new(bytes))
            }
        }
    }

    /// The elements in row-major logical order.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if self.dtype != T::DTYPE {
            return Err(Error::DType { arg: "T", expected: format!("{:?}", self.dtype), got: T::DTYPE });
        }
        let bytes = self.host_bytes()?;
        let size = self.dtype.size_in_bytes();
        Ok(self.layout.indices().map(|i| T::read_le(&bytes[i * size..(i + 1) * size])).collect())
    }

    /// The elements as f64 in row-major logical order (exact for every dtype).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        let bytes = self.host_bytes()?;
        let size = self.dtype.size_in_bytes();
        Ok(self.layout.indices().map(|i| self.dtype.decode(&bytes[i * size..(i + 1) * size])).collect())
    }

    /// A contiguous copy on `device`.
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        let bytes = self.host_bytes()?;
        let size = self.dtype.size_in_bytes();
        let mut packed = Vec::with_capacity(self.layout.numel() * size);
        for i in self.layout.indices() {
            packed.extend_from_slice(&bytes[i * size..(i + 1) * size]);
        }
        Tensor::from_bytes(packed, self.dtype, Layout::contiguous(&self.layout.shape), device)
    }

    /// Device address of the first element (CUDA tensors; `None` on the CPU). Work dmattn
    /// queued over it is ordered on the tensor's device's stream.
    pub fn device_ptr(&self) -> Option<u64> {
        match &self.storage {
            Storage::Cuda(memory, _) => Some(memory.ptr() + (self.layout.offset * self.dtype.size_in_bytes()) as u64),
            Storage::Cpu(_) => None,
        }
    }

    /// The device range `[start, end)` of the bytes this tensor's elements may touch (CUDA
    /// tensors): for telling whether two tensors can overlap.
    pub(crate) fn device_range(&self) -> Option<(u64, u64)> {
        let start = self.device_ptr()?;
        // Every tensor's layout was checked to fit its storage when it was made.
        let extent = self.layout.extent().expect("a tensor's layout fits its storage");
        Some((start, start + ((extent - self.layout.offset) * self.dtype.size_in_bytes()) as u64))
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {:?}, {})", self.layout.shape, self.dtype, self.device())
    }
}
