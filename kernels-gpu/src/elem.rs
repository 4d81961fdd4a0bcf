//! The 16-bit element types q/k/v/o (and bias) come in, and the tensor-core MMA for each.
use core::arch::asm;

/// A 16-bit floating-point element type with an `m16n8k16` tensor-core MMA (f32 accumulate).
pub trait Elem: Copy {
    /// `d += a * b` for one m16n8k16 tile in the standard fragment layouts (warp-collective).
    fn mma(d: &mut [f32; 4], a: &[u32; 4], b0: u32, b1: u32);
    /// Two f32 rounded to nearest into one register, `lo` in the low half.
    fn pack(lo: f32, hi: f32) -> u32;
    /// The inverse of [`Elem::pack`].
    fn unpack(v: u32) -> (f32, f32);
}

#[derive(Clone, Copy)]
pub struct Bf16;
#[derive(Clone, Copy)]
pub struct F16;

/// One MMA instantiation per type: the PTX type names are part of the instruction string. Not
/// `pure`: a warp-collective instruction must not be moved into divergent code (see `arch`).
macro_rules! mma_asm {
    ($ty:literal, $d:ident, $a:ident, $b0:ident, $b1:ident) => {
        unsafe {
            asm!(concat!("mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32 ",
                    "{{{0}, {1}, {2}, {3}}}, {{{4}, {5}, {6}, {7}}}, {{{8}, {9}}}, {{{0}, {1}, {2}, {3}}};"),
                inout(reg32) $d[0], inout(reg32) $d[1], inout(reg32) $d[2], inout(reg32) $d[3],
                in(reg32) $a[0], in(reg32) $a[1], in(reg32) $a[2], in(reg32) $a[3],
                in(reg32) $b0, in(reg32) $b1, options(nomem, nostack))
        }
    };
}

impl Elem for Bf16 {
    #[inline(always)]
    fn mma(d: &mut [f32; 4], a: &[u32; 4], b0: u32, b1: u32) {
        mma_asm!("bf16", d, a, b0, b1);
    }
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        let r: u32;
        unsafe {
            asm!("cvt.rn.bf16x2.f32 {0}, {1}, {2};", out(reg32) r, in(reg32) hi, in(reg32) lo,
                options(pure, nomem, nostack))
        };
        r
    }
    #[inline(always)]
    fn unpack(v: u32) -> (f32, f32) {
        (f32::from_bits(v << 16), f32::from_bits(v & 0xffff_0000))
    }
}

impl Elem for F16 {
    #[inline(always)]
    fn mma(d: &mut [f32; 4], a: &[u32; 4], b0: u32, b1: u32) {
        mma_asm!("f16", d, a, b0, b1);
    }
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        let r: u32;
        unsafe {
            asm!("cvt.rn.f16x2.f32 {0}, {1}, {2};", out(reg32) r, in(reg32) hi, in(reg32) lo,
                options(pure, nomem, nostack))
        };
        r
    }
    #[inline(always)]
    fn unpack(v: u32) -> (f32, f32) {
        let (lo, hi): (f32, f32);
        unsafe {
            asm!("{{ .reg .b16 l, h; mov.b32 {{l, h}}, {2}; cvt.f32.f16 {0}, l; cvt.f32.f16 {1}, h; }}",
                out(reg32) lo, out(reg32) hi, in(reg32) v, options(pure, nomem, nostack))
        };
        (lo, hi)
    }
}
