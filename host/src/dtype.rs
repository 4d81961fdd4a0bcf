//! Element types of tensors.
use half::{bf16, f16};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F16,
    BF16,
    F32,
    /// CPU only: exact reference computations and finite-difference checks.
    F64,
    /// Masks: one byte per element, 0 = hidden, anything else = visible.
    Bool,
    /// Bytes: bit-packed masks (`SparseMask::packed_bits`).
    U8,
    /// Indices: BCSR row pointers and block indices (`SparseMask::bcsr`).
    I32,
}

impl DType {
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
            DType::F64 => 8,
            DType::Bool | DType::U8 => 1,
            DType::I32 => 4,
        }
    }

    pub fn is_float(self) -> bool {
        !matches!(self, DType::Bool | DType::U8 | DType::I32)
    }

    /// Decodes one element from its little-endian bytes.
    pub(crate) fn decode(self, bytes: &[u8]) -> f64 {
        match self {
            DType::F16 => f16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
            DType::BF16 => bf16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
            DType::F32 => f32::from_le_bytes(bytes[..4].try_into().unwrap()) as f64,
            DType::F64 => f64::from_le_bytes(bytes[..8].try_into().unwrap()),
            DType::Bool => (bytes[0] != 0) as u8 as f64,
            DType::U8 => bytes[0] as f64,
            DType::I32 => i32::from_le_bytes(bytes[..4].try_into().unwrap()) as f64,
        }
    }

    /// Encodes `v` (rounded to nearest) into `out`.
    pub(crate) fn encode(self, v: f64, out: &mut [u8]) {
        match self {
            DType::F16 => out.copy_from_slice(&f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
            DType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 => out.copy_from_slice(&v.to_le_bytes()),
            DType::Bool => out[0] = (v != 0.0) as u8,
            // Saturating, as `as` casts are.
            DType::U8 => out[0] = v.round() as u8,
            DType::I32 => out.copy_from_slice(&(v.round() as i32).to_le_bytes()),
        }
    }
}

/// A host type a tensor can be built from or read into.
pub trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn write_le(self, out: &mut [u8]);
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $dtype:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            fn write_le(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().unwrap())
            }
        }
    };
}
element!(f16, DType::F16);
element!(bf16, DType::BF16);
element!(f32, DType::F32);
element!(f64, DType::F64);
element!(u8, DType::U8);
element!(i32, DType::I32);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn write_le(self, out: &mut [u8]) {
        out[0] = self as u8;
    }
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}
