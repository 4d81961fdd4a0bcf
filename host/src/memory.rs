//! Device memory dmattn allocates: raw stream-ordered allocations from the device's pool, freed
//! in stream order when dropped. Not cudarc's `CudaSlice`: in a context that tracks events (a
//! caller's context, with cudarc's default) every use of a slice waits on events recorded at its
//! last use, and a stream being captured into a CUDA graph may not wait on an event recorded
//! outside the capture. These buffers record and wait on nothing: the one stream orders them.
use crate::error::Result;
use cudarc::driver::{CudaStream, result};
use std::sync::Arc;

pub(crate) struct DeviceBuffer {
    ptr: u64,
    bytes: usize,
    /// The stream it was allocated on, and is freed on.
    stream: Arc<CudaStream>,
}

impl DeviceBuffer {
    /// `bytes` uninitialised bytes (at least one: a zero-byte allocation has no address).
    pub(crate) fn uninit(stream: &Arc<CudaStream>, bytes: usize) -> Result<Self> {
        let stream = stream.clone();
        stream.context().bind_to_thread()?;
        let size = bytes.max(1);
        // Safety: a fresh allocation of `size` bytes on a live stream of the bound context;
        // without stream-ordered allocation the stream is idle before the plain one.
        let ptr = unsafe {
            if stream.context().has_async_alloc() {
                result::malloc_async(stream.cu_stream(), size)?
            } else {
                stream.synchronize()?;
                result::malloc_sync(size)?
            }
        };
        Ok(DeviceBuffer { ptr, bytes, stream })
    }

    /// `bytes` bytes set to `value`, in stream order.
    pub(crate) fn filled(stream: &Arc<CudaStream>, bytes: usize, value: u8) -> Result<Self> {
        let buf = Self::uninit(stream, bytes)?;
        // Safety: the buffer holds `bytes.max(1)` bytes.
        unsafe { result::memset_d8_async(buf.ptr, value, bytes.max(1), buf.stream.cu_stream())? };
        Ok(buf)
    }

    /// A copy of `data`, queued on the stream (the driver stages pageable memory before it
    /// returns, so `data` may go right after).
    pub(crate) fn from_host(stream: &Arc<CudaStream>, data: &[u8]) -> Result<Self> {
        let buf = Self::uninit(stream, data.len())?;
        // Safety: the buffer holds `data.len()` bytes.
        unsafe { result::memcpy_htod_async(buf.ptr, data, buf.stream.cu_stream())? };
        Ok(buf)
    }

    /// `len` bytes from `offset`, read back after the stream's queued work (waits for it).
    pub(crate) fn to_host(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        assert!(offset + len <= self.bytes, "read past the buffer");
        let mut out = vec![0u8; len];
        self.stream.context().bind_to_thread()?;
        // Safety: the range lies inside the buffer; the copy is synchronised before `out` is read.
        unsafe { result::memcpy_dtoh_async(&mut out, self.ptr + offset as u64, self.stream.cu_stream())? };
        self.stream.synchronize()?;
        Ok(out)
    }

    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Errors here are the stream's earlier ones, surfaced by the next call that checks.
        let ctx = self.stream.context();
        let _ = ctx.bind_to_thread();
        // Safety: allocated on this stream; work queued over it runs before the free.
        unsafe {
            if ctx.has_async_alloc() {
                let _ = result::free_async(self.ptr, self.stream.cu_stream());
            } else {
                let _ = self.stream.synchronize();
                let _ = result::free_sync(self.ptr);
            }
        }
    }
}
