//! Tensor maps for the bulk tensor copy engine: the Hopper lean forward's producer copies Q, K
//! and V tiles with it (`FwdTmaParams`). A map's shape is worked out as a plain value
//! ([`TileMap`], unit-tested on the CPU), then encoded by the driver
//! (`cuTensorMapEncodeTiled`).
use crate::error::Result;
use cudarc::driver::{DriverError, sys};
use dmattn_abi::{DeviceElem, TensorMap, View4};

/// A 4-D `[b, rows, heads, d]` operand (`View4`, element strides, unit on d) as the copy engine
/// sees it, innermost dimension first: `(d, heads, rows, b)`, byte strides of the outer three,
/// and a box of one 128-byte column block (64 elements) by `box_rows` rows of one head and one
/// batch, under the 128-byte swizzle (`SmemTile`'s column blocks). Rows past `rows` read as zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TileMap {
    pub dims: [u64; 4],
    pub strides: [u64; 3],
    pub box_dims: [u32; 4],
}

impl TileMap {
    /// The map of `view` (`b` batches, `rows` rows, `heads` heads of `head_dim` 2-byte
    /// elements) for tiles of `box_rows` rows; `None` where the engine cannot take it (a stride
    /// or the address not a multiple of 16 bytes, a dimension of several entries broadcast
    /// with stride 0, or a box taller than 256 rows).
    pub fn of(view: &View4, [b, rows, heads, head_dim]: [usize; 4], box_rows: u32) -> Option<Self> {
        // A size-1 dimension's view stride is 0, which the driver refuses; it is never stepped
        // over, so any valid stride does: the packed one. A broadcast one (stride 0 over
        // several entries) has no map.
        let packed = [2 * head_dim, 2 * head_dim * heads, 2 * head_dim * heads * rows].map(|s| s as u64);
        let (strides, extents) = ([2 * view.stride[2], 2 * view.stride[1], 2 * view.stride[0]], [heads, rows, b]);
        if (0..3).any(|i| strides[i] == 0 && extents[i] > 1) {
            return None;
        }
        let strides: [u64; 3] = core::array::from_fn(|i| if strides[i] == 0 { packed[i] } else { strides[i] });
        let aligned = view.ptr.is_multiple_of(16) && strides.iter().all(|s| s.is_multiple_of(16) && *s < 1 << 40);
        (aligned && head_dim.is_multiple_of(64) && view.stride[3] == 1 && (1..=256).contains(&box_rows)).then_some(TileMap {
            dims: [head_dim as u64, heads as u64, rows as u64, b as u64],
            strides,
            box_dims: [64, 1, box_rows, 1],
        })
    }

    /// The driver's encoding of this map over the operand at `view.ptr`.
    pub fn encode(&self, view: &View4, elem: DeviceElem) -> Result<TensorMap> {
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        let kind = match elem {
            DeviceElem::Bf16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            DeviceElem::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        };
        let element_strides = [1u32; 4];
        // Safety: the pointers are to local arrays of the lengths the rank (4) asks for; the
        // driver only encodes (the operand is read by later copies, which `FwdTmaParams`'s kernel
        // bounds to the map's dimensions).
        let status = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                kind,
                4,
                view.ptr as *mut core::ffi::c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.box_dims.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        status.result().map_err(|e: DriverError| e)?;
        Ok(TensorMap(map.opaque))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(ptr: u64, stride: [u64; 4]) -> View4 {
        View4 { ptr, stride }
    }

    /// A `[b, s, h, d]` operand maps to `(d, h, s, b)` with byte strides, boxes of 64 columns
    /// by the tile's rows; misaligned operands and odd head dims have no map.
    #[test]
    fn tile_maps() {
        let (b, s, h, d) = (2, 1000, 8, 128);
        let contiguous = [(s * h * d) as u64, (h * d) as u64, d as u64, 1];
        let map = TileMap::of(&view(1 << 20, contiguous), [b, s, h, d], 128).unwrap();
        assert_eq!(map.dims, [128, 8, 1000, 2]);
        assert_eq!(map.strides, [256, 2048, 1000 * 2048]);
        assert_eq!(map.box_dims, [64, 1, 128, 1]);
        assert!(TileMap::of(&view((1 << 20) + 8, contiguous), [b, s, h, d], 128).is_none());
        assert!(TileMap::of(&view(1 << 20, [1000 * 8 * 100, 8 * 100, 100, 1]), [b, s, h, 100], 128).is_none());
        assert!(TileMap::of(&view(1 << 20, contiguous), [b, s, h, d], 512).is_none());
        // Size-1 dimensions (zero view strides) get the packed stride; broadcast ones (zero
        // strides over several entries) have no map.
        let one = TileMap::of(&view(1 << 20, [0, (h * d) as u64, 0, 1]), [1, s, 1, d], 128).unwrap();
        assert_eq!(one.strides, [256, (h * d * 2) as u64, (d * 2 * s) as u64]);
        assert!(TileMap::of(&view(1 << 20, [0, (h * d) as u64, d as u64, 1]), [b, s, h, d], 128).is_none());
        assert!(TileMap::of(&view(1 << 20, [(s * d) as u64, d as u64, 0, 1]), [b, s, h, d], 128).is_none());
    }
}
