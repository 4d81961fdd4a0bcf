//! The one place kernels are launched: the parameter struct is passed by value, and every launch
//! is checked for errors.
use crate::device::CudaDevice;
use crate::error::Result;
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use dmattn_abi::{
    BlockMaskParams, BwdParams, BwdSharesParams, DecodeParams, GatherMaskParams, GatherParams, IndicesParams, KeyCompactParams, ListBitsParams, ListsParams, ScatterParams, SelectParams, SelectWideParams, BwdPreParams, CombineParams, ConvertParams, DqConvertParams, OrderParams, FwdParams, FwdTmaParams, MASK_PACK_KEYS_WORDS, MASK_PACK_THREADS, MaskPackParams, MaskSeqsParams, SoftmaxRowsParams,
    TensorMapsParams, names,
};

/// A kernel parameter struct from `dmattn-abi`, passed by value as the kernel's only argument.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub(crate) struct ByValue<T>(T);

/// Safety: each wrapped type is `#[repr(C)]`, plain old data, and is the exact parameter type of
/// the kernels it is passed to (both sides compile `dmattn-abi`).
unsafe impl DeviceRepr for ByValue<FwdParams> {}
unsafe impl DeviceRepr for ByValue<FwdTmaParams> {}
unsafe impl DeviceRepr for ByValue<TensorMapsParams> {}
unsafe impl DeviceRepr for ByValue<DecodeParams> {}
unsafe impl DeviceRepr for ByValue<OrderParams> {}
unsafe impl DeviceRepr for ByValue<MaskPackParams> {}
unsafe impl DeviceRepr for ByValue<MaskSeqsParams> {}
unsafe impl DeviceRepr for ByValue<BlockMaskParams> {}
unsafe impl DeviceRepr for ByValue<BwdParams> {}
unsafe impl DeviceRepr for ByValue<BwdPreParams> {}
unsafe impl DeviceRepr for ByValue<BwdSharesParams> {}
unsafe impl DeviceRepr for ByValue<ConvertParams> {}
unsafe impl DeviceRepr for ByValue<DqConvertParams> {}
unsafe impl DeviceRepr for ByValue<CombineParams> {}
unsafe impl DeviceRepr for ByValue<SoftmaxRowsParams> {}
unsafe impl DeviceRepr for ByValue<KeyCompactParams> {}
unsafe impl DeviceRepr for ByValue<GatherParams> {}
unsafe impl DeviceRepr for ByValue<GatherMaskParams> {}
unsafe impl DeviceRepr for ByValue<ScatterParams> {}
unsafe impl DeviceRepr for ByValue<IndicesParams> {}
unsafe impl DeviceRepr for ByValue<ListBitsParams> {}
unsafe impl DeviceRepr for ByValue<ListsParams> {}
unsafe impl DeviceRepr for ByValue<SelectParams> {}
unsafe impl DeviceRepr for ByValue<SelectWideParams> {}

pub(crate) struct Launch {
    name: String,
    grid: (u32, u32, u32),
    threads: u32,
    smem_bytes: u32,
    /// A cooperative launch: every CTA resident at once (the kernel synchronises the grid).
    cooperative: bool,
}

impl Launch {
    pub(crate) fn kernel(name: &str, grid: (u32, u32, u32), threads: u32, smem_bytes: u32) -> Self {
        Launch { name: name.to_string(), grid, threads, smem_bytes, cooperative: false }
    }

    /// This launch made cooperative: the driver refuses it rather than run a grid whose CTAs
    /// cannot all be resident at once (the caller sizes it by `CudaDevice::resident_ctas`).
    pub(crate) fn cooperative(self) -> Self {
        Launch { cooperative: true, ..self }
    }

    pub(crate) fn mask_pack(grid: (u32, u32, u32)) -> Self {
        Self::kernel(names::MASK_PACK, grid, MASK_PACK_THREADS, 0)
    }

    /// The pack of masks with one row a plane (`dmattn_mask_pack_keys`): a warp per 64-key
    /// word of every head, `MASK_PACK_KEYS_WORDS` words in turn, `k_blocks` words in each of
    /// `batch` rows of heads. The block-per-CTA kernel would leave 252 of its 256 threads idle
    /// on such a row; H100 (ncu), one row of 512K keys: 15.3-15.8 us there, 5.1-5.5 us a warp
    /// per word of one head.
    pub(crate) fn mask_pack_keys(k_blocks: u32, batch: u32) -> Self {
        Self::kernel(names::MASK_PACK_KEYS, (k_blocks.div_ceil(MASK_PACK_THREADS / 32 * MASK_PACK_KEYS_WORDS), 1, batch), MASK_PACK_THREADS, 0)
    }
}

#[cfg(test)]
impl Launch {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn grid(&self) -> (u32, u32, u32) {
        self.grid
    }
}

/// Launches `l` with `params` (nothing where its grid is empty). The caller guarantees `params` describes live device buffers of
/// the sizes the kernel indexes (the backends build them from validated problems).
pub(crate) fn launch<T: Copy>(dev: &CudaDevice, l: &Launch, params: T) -> Result<()>
where
    ByValue<T>: DeviceRepr,
{
    let f = dev.function(&l.name, l.smem_bytes)?;
    if l.grid.0 == 0 || l.grid.1 == 0 || l.grid.2 == 0 {
        // No CTA, nothing to do (a packed batch whose sequences are all empty on one side).
        return Ok(());
    }
    let cfg = LaunchConfig { grid_dim: l.grid, block_dim: (l.threads, 1, 1), shared_mem_bytes: l.smem_bytes };
    let arg = ByValue(params);
    let mut builder = dev.stream().launch_builder(&f);
    builder.arg(&arg);
    // Safety: the parameter type matches the kernel's (dmattn-abi), and the pointers in it are
    // live device buffers sized for the grid, as the backends' validation guarantees.
    unsafe {
        if l.cooperative {
            builder.launch_cooperative(cfg)?;
        } else {
            builder.launch(cfg)?;
        }
    }
    Ok(())
}
