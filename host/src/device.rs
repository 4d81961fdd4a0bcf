//! Where tensors live and kernels run: the CPU, or one CUDA device with its stream and the
//! loaded kernel module.
use crate::error::{Error, Result};
use crate::memory::DeviceBuffer;
use cudarc::cublas::CudaBlas;
use cudarc::driver::result::{self, mem_pool};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, sys};
use cudarc::nvrtc::Ptx;
use crate::ptx::{Library, PTX_SM80, PTX_SM90A};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

/// What one compiled kernel holds per thread.
#[derive(Clone, Debug)]
pub struct KernelResources {
    pub name: String,
    pub registers: u32,
    /// Local memory per thread: register spills and stack (0 for a kernel that fits).
    pub local_bytes: u32,
}

#[derive(Clone)]
pub enum Device {
    Cpu,
    Cuda(CudaDevice),
}

impl Device {
    /// CUDA device `ordinal`. A typed error, not a panic, where there is no driver or device.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        CudaDevice::new(ordinal).map(Device::Cuda)
    }

    /// CUDA device 0 where there is one, the CPU otherwise, with the reason there is no GPU.
    pub fn cuda_or_cpu() -> (Device, Option<Error>) {
        match Device::cuda(0) {
            Ok(d) => (d, None),
            Err(e) => (Device::Cpu, Some(e)),
        }
    }

    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    /// Whether tensors on `self` and `other` can meet in one call: both the CPU, or one CUDA
    /// context and stream. (Memory dmattn allocated is freed in its stream's order, which only
    /// that stream's work is sure to precede; a tensor for another stream is a new view,
    /// [`crate::Tensor::from_raw_parts`], whose lifetime the caller answers for.)
    pub fn same(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Cpu, Device::Cpu) => true,
            (Device::Cuda(a), Device::Cuda(b)) => a.same_context(b) && a.stream().cu_stream() == b.stream().cu_stream(),
            _ => false,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(d) => write!(f, "cuda:{} ({}, stream {:?})", d.context().ordinal(), d.name(), d.stream().cu_stream()),
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A CUDA context with the stream dmattn's work is ordered on, and dmattn's kernels loaded into
/// the context. Cheap to clone; [`CudaDevice::with_stream`] gives the same context and kernels on
/// another stream.
///
/// [`CudaDevice::new`] makes a context of dmattn's own; [`CudaDevice::from_stream`] takes a
/// caller's (the primary context PyTorch and candle use, or any other) and stream, and leaves the
/// context's settings as they are. A forward or backward call queues its work on the stream of
/// its `q` and returns without waiting for it: it neither synchronises nor reads device data on
/// the host, so it can be captured into a CUDA graph on a capturing stream. Two exceptions: index
/// lists are range-checked on the device when prepared (`SparseMask::prepare`, or lists passed to
/// the call), which reads a flag back (on a capturing stream, an error: prepare them before
/// capturing); and the backward of gather attention (a mask without a query dimension) reads its
/// kept-key counts back once per prepared mask to size its gathered keys (on a capturing stream it
/// runs on dense tiles instead; a decoding call's `.mask()`, which its forward reads as bytes,
/// is compacted by each backward, which then reads the counts back each time). BCSR input is
/// read on the host. A packed batch's work order is
/// built by the first call on its `SeqLens` outside a capture; a call captured before that runs its
/// CTAs in grid order (the same results, possibly slower). A graph reads the device copies its
/// `SeqLens` and `PageTable` hold: they must outlive its replays.
#[derive(Clone)]
pub struct CudaDevice(pub(crate) Arc<CudaInner>);

pub(crate) struct CudaInner {
    pub(crate) kernels: Arc<Kernels>,
    pub(crate) stream: Arc<CudaStream>,
    /// cuBLAS on `stream`, created on first use (the materialising path's products).
    blas: OnceLock<CudaBlas>,
    /// The work-order passes' ticket counter, a u32 (0 between launches; the pass resets it, and
    /// the stream keeps this stream's launches apart).
    order_ticket: DeviceBuffer,
}

/// dmattn's kernels for one context, shared by every [`CudaDevice`] on it. Each kernel is
/// compiled into a module of its own when first asked for (`ptx::Library`).
pub(crate) struct Kernels {
    ctx: Arc<CudaContext>,
    /// The shipped PTX: sm_80, and on Hopper sm_90a.
    libraries: Vec<Library>,
    /// Functions by name, each compiled once, with the dynamic shared memory it was cleared
    /// for. A slot of its own per kernel: threads asking for different kernels compile them at
    /// the same time.
    functions: Mutex<HashMap<String, Arc<Mutex<Option<(CudaFunction, u32)>>>>>,
    /// CTAs resident at once by (kernel, threads, dynamic shared memory) (`resident_ctas`).
    resident: Mutex<HashMap<(String, u32, u32), u32>>,
    name: String,
    /// Streaming multiprocessors: how many CTAs fill the GPU.
    pub(crate) sms: u32,
    /// L2 cache size.
    pub(crate) l2_bytes: usize,
    /// Dynamic shared memory one CTA may opt in to.
    pub(crate) smem_per_block: u32,
}

/// The kernels per context (a kernel loaded twice into one context would be compiled twice),
/// by the context's handle. The entries live as long as the process: a context holds
/// its modules until it is destroyed.
fn loaded_kernels(ctx: &Arc<CudaContext>) -> Result<Arc<Kernels>> {
    static LOADED: Mutex<Vec<(usize, Arc<Kernels>)>> = Mutex::new(Vec::new());
    let mut loaded = LOADED.lock().unwrap();
    let handle = ctx.cu_ctx() as usize;
    if let Some((_, kernels)) = loaded.iter().find(|(h, _)| *h == handle) {
        return Ok(kernels.clone());
    }
    let kernels = Arc::new(Kernels::load(ctx)?);
    loaded.push((handle, kernels.clone()));
    Ok(kernels)
}

impl Kernels {
    fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let (major, minor) = ctx.compute_capability()?;
        if major < 8 {
            return Err(Error::NoCuda(format!("compute capability {major}.{minor}; dmattn needs 8.0 or newer")));
        }
        let mut libraries = vec![Library::of(PTX_SM80)];
        // The Hopper module is PTX 8.3: a driver older than CUDA 12.3 cannot compile it (its
        // declarations alone tell), and the portable module then serves every call.
        if (major, minor) == (9, 0) {
            let hopper = Library::of(PTX_SM90A);
            if ctx.load_module(Ptx::from_src(hopper.prelude())).is_ok() {
                libraries.push(hopper);
            }
        }
        Ok(Kernels {
            ctx: ctx.clone(),
            libraries,
            functions: Mutex::new(HashMap::new()),
            resident: Mutex::new(HashMap::new()),
            name: ctx.name()?,
            sms: ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            l2_bytes: ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
            smem_per_block: ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32,
        })
    }
}

/// A typed error, not a panic, where the driver is missing (cudarc loads libcuda lazily and
/// panics if it is absent).
fn driver_present() -> Result<()> {
    if library_present("cuda") || library_present("nvcuda") {
        Ok(())
    } else {
        Err(Error::NoCuda("libcuda.so (the NVIDIA driver) is not installed".into()))
    }
}

/// Whether the CUDA library `name` loads under one of the names cudarc's dynamic loading tries
/// for it (with CUDA 12 bindings). Where CUDA is linked at build time instead (another crate in
/// the program asked cudarc for that), the library is loaded already and this holds.
pub(crate) fn library_present(name: &str) -> bool {
    use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
    let base = format!("{DLL_PREFIX}{name}{DLL_SUFFIX}");
    let versioned = ["12", "11", "10", "9", "1"].map(|v| format!("{base}.{v}"));
    // Safety: loading a CUDA library runs its initialisers, which have no preconditions.
    std::iter::once(base).chain(versioned).any(|lib| unsafe { libloading::Library::new(lib) }.is_ok())
}

impl CudaDevice {
    /// Device `ordinal` in a context of dmattn's own, with a stream of its own.
    pub fn new(ordinal: usize) -> Result<Self> {
        driver_present()?;
        let count = CudaContext::device_count()?;
        if ordinal >= count as usize {
            return Err(Error::NoCuda(format!("device {ordinal} requested, {count} present")));
        }
        let ctx = CudaContext::new(ordinal)?;
        // Every buffer and launch of this context object goes through one stream, so cudarc's
        // cross-stream event tracking is redundant work. (The flag belongs to this object, not
        // to the driver's context that others may share.)
        unsafe { ctx.disable_event_tracking() };
        keep_freed_memory(&ctx)?;
        Self::on(loaded_kernels(&ctx)?, ctx.new_stream()?)
    }

    /// dmattn on a caller's stream and its context: every call's work is queued on `stream`,
    /// after the work the caller queued there before. The context's settings (event tracking,
    /// the memory pool's release threshold) are left as the caller set them. The kernels are
    /// loaded once per context.
    pub fn from_stream(stream: Arc<CudaStream>) -> Result<Self> {
        driver_present()?;
        Self::on(loaded_kernels(stream.context())?, stream)
    }

    /// The same context and kernels, with work queued on `stream` (a stream of this context).
    pub fn with_stream(&self, stream: Arc<CudaStream>) -> Result<Self> {
        if stream.context().cu_ctx() != self.0.kernels.ctx.cu_ctx() {
            return Err(Error::Device { arg: "stream", expected: format!("a stream of {}'s context", self.name()), got: "a stream of another context".into() });
        }
        Self::on(self.0.kernels.clone(), stream)
    }

    fn on(kernels: Arc<Kernels>, stream: Arc<CudaStream>) -> Result<Self> {
        let order_ticket = DeviceBuffer::filled(&stream, 4, 0)?;
        Ok(Self(Arc::new(CudaInner { kernels, stream, blas: OnceLock::new(), order_ticket })))
    }

    pub fn name(&self) -> &str {
        &self.0.kernels.name
    }

    /// The stream this device's work is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.0.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        self.0.stream.context()
    }

    /// Whether `other` is the same context (its memory is addressable from here).
    pub(crate) fn same_context(&self, other: &CudaDevice) -> bool {
        self.context().cu_ctx() == other.context().cu_ctx()
    }

    /// Hands the memory that freed buffers left cached in the device's allocation pool back to
    /// the driver; waits for queued work first. dmattn keeps freed memory cached so that repeated
    /// calls do not map their buffers afresh each time.
    pub fn release_cached_memory(&self) -> Result<()> {
        self.synchronize()?;
        if let Some(pool) = alloc_pool(self.context())? {
            // Safety: the pool is the device's current one, returned by the driver.
            unsafe { mem_pool::trim_to(pool, 0)? };
        }
        Ok(())
    }

    /// Address of the forward ordering pass's ticket counter.
    pub(crate) fn order_ticket(&self) -> u64 {
        self.0.order_ticket.ptr()
    }

    /// Waits for all work queued on this device's stream; surfaces asynchronous kernel errors.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.0.stream.synchronize()?)
    }

    /// cuBLAS, its work ordered on [`CudaDevice::stream`]; a typed error, not a panic, where the
    /// library is not installed.
    pub(crate) fn blas(&self) -> Result<&CudaBlas> {
        if let Some(blas) = self.0.blas.get() {
            return Ok(blas);
        }
        // cudarc loads libcublas lazily and panics if it is absent: ask first.
        if !library_present("cublas") {
            let what = "the materialising path without libcublas.so (cuBLAS is not installed)".into();
            return Err(Error::Unsupported { what, backend: "CUDA" });
        }
        let blas = CudaBlas::new(self.0.stream.clone())?;
        Ok(self.0.blas.get_or_init(|| blas))
    }

    /// What launch plans are computed from.
    pub(crate) fn gpu(&self) -> crate::cuda::Gpu {
        crate::cuda::Gpu { sms: self.sms(), l2_bytes: self.l2_bytes(), wgmma: self.has_wgmma() }
    }

    /// Streaming multiprocessors.
    pub(crate) fn sms(&self) -> u32 {
        self.0.kernels.sms
    }

    /// L2 cache bytes.
    pub(crate) fn l2_bytes(&self) -> usize {
        self.0.kernels.l2_bytes
    }

    /// Dynamic shared memory bytes one CTA may opt in to.
    pub(crate) fn smem_per_block(&self) -> u32 {
        self.0.kernels.smem_per_block
    }

    /// Whether the Hopper (sm_90a, wgmma) kernels are loaded.
    pub(crate) fn has_wgmma(&self) -> bool {
        self.0.kernels.libraries.len() > 1
    }

    /// Every kernel of dmattn's modules as the driver compiled it for this GPU. The driver's own
    /// ptxas assembles the PTX at load, so this, not an offline `ptxas -v`, says whether a
    /// shipped kernel spills here.
    pub fn kernel_resources(&self) -> Result<Vec<KernelResources>> {
        let names: Vec<&str> = self.0.kernels.libraries.iter().flat_map(|lib| lib.names()).collect();
        // The driver compiles a module on the calling thread: a thread a core.
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).min(names.len().max(1));
        let chunks: Vec<Vec<&str>> = (0..threads).map(|i| names.iter().skip(i).step_by(threads).copied().collect()).collect();
        let compiled = std::thread::scope(|scope| {
            let workers: Vec<_> = chunks.iter().map(|chunk| scope.spawn(|| chunk.iter().map(|name| self.function(name, 0)).collect::<Vec<_>>())).collect();
            workers.into_iter().map(|w| w.join().expect("a compiling thread panicked")).collect::<Vec<_>>()
        });
        let mut resources = Vec::with_capacity(names.len());
        for (chunk, functions) in chunks.iter().zip(compiled) {
            for (name, f) in chunk.iter().zip(functions) {
                resources.push((name, f?));
            }
        }
        resources.sort_by_key(|(name, _)| names.iter().position(|n| n == *name));
        resources.into_iter().map(|(name, f)| Self::resources_of(name, &f)).collect()
    }

    /// The kernels compiled so far in this context (those launched, and any asked for), as
    /// [`CudaDevice::kernel_resources`] gives them; none is compiled here.
    pub fn compiled_kernel_resources(&self) -> Result<Vec<KernelResources>> {
        let slots: Vec<(String, Arc<Mutex<Option<(CudaFunction, u32)>>>)> = self.0.kernels.functions.lock().unwrap().iter().map(|(n, s)| (n.clone(), s.clone())).collect();
        let mut resources = Vec::new();
        for (name, slot) in slots {
            if let Some((f, _)) = &*slot.lock().unwrap() {
                resources.push(Self::resources_of(&name, f)?);
            }
        }
        resources.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(resources)
    }

    fn resources_of(name: &str, f: &CudaFunction) -> Result<KernelResources> {
        Ok(KernelResources { name: name.to_string(), registers: f.num_regs()? as u32, local_bytes: f.local_size_bytes()? as u32 })
    }

    /// CTAs of kernel `name` with `threads` threads and `smem_bytes` of dynamic shared memory
    /// the GPU holds resident at once (a cooperative launch's limit); asked of the driver once.
    pub(crate) fn resident_ctas(&self, name: &str, threads: u32, smem_bytes: u32) -> Result<u32> {
        let key = (name.to_string(), threads, smem_bytes);
        if let Some(&n) = self.0.kernels.resident.lock().unwrap().get(&key) {
            return Ok(n);
        }
        let f = self.function(name, smem_bytes)?;
        let n = f.occupancy_max_active_blocks_per_multiprocessor(threads, smem_bytes as usize, None)? * self.sms();
        self.0.kernels.resident.lock().unwrap().insert(key, n);
        Ok(n)
    }

    /// The kernel `name`, cleared to use `smem_bytes` of dynamic shared memory (above 48 KB a
    /// kernel must opt in); compiled on first use.
    pub(crate) fn function(&self, name: &str, smem_bytes: u32) -> Result<CudaFunction> {
        let kernels = &self.0.kernels;
        let slot = kernels.functions.lock().unwrap().entry(name.to_string()).or_default().clone();
        let mut slot = slot.lock().unwrap();
        let (f, cleared) = match &*slot {
            Some((f, cleared)) if *cleared >= smem_bytes => return Ok(f.clone()),
            Some((f, cleared)) => (f.clone(), *cleared),
            None => {
                // The sm_90a library, where loaded, holds only Hopper kernels (wgmma, bulk
                // copies), which the portable one lacks: a name is in one library at most.
                let lib = kernels.libraries.iter().find(|lib| lib.contains(name));
                let unknown = || Error::Unsupported { what: format!("kernel {name} on this GPU"), backend: "CUDA" };
                let source = lib.and_then(|lib| lib.module_of(name)).ok_or_else(unknown)?;
                (kernels.ctx.load_module(Ptx::from_src(source))?.load_function(name)?, 0)
            }
        };
        let cleared = cleared.max(smem_bytes);
        f.set_attribute(sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, cleared as i32)?;
        *slot = Some((f.clone(), cleared));
        Ok(f)
    }
}

/// The pool stream-ordered allocations come from, where the device has one.
fn alloc_pool(ctx: &CudaContext) -> Result<Option<sys::CUmemoryPool>> {
    if !ctx.has_async_alloc() {
        return Ok(None);
    }
    // Safety: the device handle comes from a live context.
    Ok(Some(unsafe { result::device::get_mem_pool(ctx.cu_device())? }))
}

/// Every call allocates its outputs (and the prepared mask, dQ accumulator...) from the device's
/// stream-ordered pool. At the pool's default release threshold (0) each synchronisation returns
/// freed memory to the driver and the next call maps it afresh, which at short sequences cost
/// more than the kernels. Keep it cached, as PyTorch's caching allocator does;
/// [`CudaDevice::release_cached_memory`] gives it back.
fn keep_freed_memory(ctx: &CudaContext) -> Result<()> {
    if let Some(pool) = alloc_pool(ctx)? {
        let mut threshold = u64::MAX;
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        // Safety: a valid pool, and the release threshold is a u64 (cuMemPoolSetAttribute).
        unsafe { mem_pool::set_attribute(pool, attr, (&mut threshold as *mut u64).cast())? };
    }
    Ok(())
}
