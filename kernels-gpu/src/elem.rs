//! The 16-bit element types q/k/v/o (and bias) come in, and the tensor-core MMA for each.
use core::arch::asm;

/// A 16-bit floating-point element type with an `m16n8k16` tensor-core MMA (f32 accumulate).
pub trait Elem: Copy {
    /// `d += a * b` for one m16n8k16 tile in the standard fragment layouts (warp-collective).
    fn mma(d: &mut [f32; 4], a: &[u32; 4], b0: u32, b1: u32);
    /// `acc += A B` over one k16 step of a warpgroup's 64 x `8 NT` product (sm_90a;
    /// warpgroup-collective and asynchronous): A and B are read from shared memory through the
    /// matrix descriptors `a` and `b` (`TA`, `TB` = 1 where stored M- or N-major, see
    /// `SmemTile::wgmma_k_major` and `wgmma_mn_major`); `acc` holds the warp's 16 rows in the
    /// m16n8 accumulator layout. [`crate::arch::wgmma_fence`] precedes a product's first step;
    /// `acc` may be read after the group is committed and [`wgmma_wait`] has waited for it.
    /// Where `accumulate` is false the step writes `A B` over `acc` (wgmma's scale-d 0), whose
    /// values it ignores: no start values to set.
    fn wgmma<const NT: usize, const TA: u32, const TB: u32>(acc: &mut [[f32; 4]; NT], a: u64, b: u64, accumulate: bool);
    /// As [`Elem::wgmma`] with A from registers: `a` is the warp's 16 rows x 16 k in the
    /// m16n8k16 A-fragment layout. The registers are read asynchronously; the compiler's
    /// virtual registers are never rewritten, and ptxas keeps them live until the group is
    /// waited for.
    fn wgmma_ra<const NT: usize, const TB: u32>(acc: &mut [[f32; 4]; NT], a: &[u32; 4], b: u64);
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

/// Expands `$m!(args.., n, [accumulator register indices])` for the n of an `NT`-tile
/// accumulator (`$nt` a const generic; the other arms are dead code after monomorphisation, and
/// the sm_80 build instantiates callers it never runs, so there is no const assertion).
macro_rules! for_acc_shape {
    ($nt:ident, $m:ident!($($args:tt)*)) => {
        match $nt {
            4 => $m!($($args)*, 32, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]),
            8 => $m!($($args)*, 64, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
                26, 27, 28, 29, 30, 31]),
            16 => $m!($($args)*, 128, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
                26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55,
                56, 57, 58, 59, 60, 61, 62, 63]),
            _ => panic!("wgmma: no instruction for this n"),
        }
    };
}

/// One `wgmma` instruction of shape m64n`$n`k16 on the accumulator registers `$regs`. Not `pure`
/// and not `nomem`: it reads shared memory, asynchronously.
macro_rules! wgmma_asm {
    ($ty:literal, $acc:ident, $a:ident, $b:ident, $ta:ident, $tb:ident, $accumulate:ident, $n:literal, [$r0:literal $(, $r:literal)*]) => {{
        let acc: &mut [f32; $n / 2] = $acc.as_flattened_mut().try_into().unwrap();
        unsafe {
            asm!(concat!("{{ .reg .pred p; setp.ne.b32 p, {one}, 0; wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty,
                    " {{{", $r0, "}" $(, ", {", $r, "}")*, "}}, {a}, {b}, p, 1, 1, {ta}, {tb}; }}"),
                inout(reg32) acc[$r0], $(inout(reg32) acc[$r],)*
                one = in(reg32) $accumulate as u32, a = in(reg64) $a, b = in(reg64) $b, ta = const $ta, tb = const $tb, options(nostack))
        }
    }};
}

/// One register-A `wgmma` (m64n`$n`k16; see [`Elem::wgmma_ra`]).
macro_rules! wgmma_ra_asm {
    ($ty:literal, $acc:ident, $a:ident, $b:ident, $tb:ident, $n:literal, [$r0:literal $(, $r:literal)*]) => {{
        let acc: &mut [f32; $n / 2] = $acc.as_flattened_mut().try_into().unwrap();
        unsafe {
            asm!(concat!("{{ .reg .pred p; setp.ne.b32 p, {one}, 0; wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty,
                    " {{{", $r0, "}" $(, ", {", $r, "}")*, "}}, {{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, {tb}; }}"),
                inout(reg32) acc[$r0], $(inout(reg32) acc[$r],)*
                one = in(reg32) 1u32, a0 = in(reg32) $a[0], a1 = in(reg32) $a[1], a2 = in(reg32) $a[2], a3 = in(reg32) $a[3],
                b = in(reg64) $b, tb = const $tb, options(nostack))
        }
    }};
}

/// `wgmma.wait_group` naming the accumulator registers it waits for (in a comment), so that the
/// compiler reads them only after it.
macro_rules! wait_asm {
    ($pending:ident, $acc:ident, $n:literal, [$r0:literal $(, $r:literal)*]) => {{
        let acc: &mut [f32; $n / 2] = $acc.as_flattened_mut().try_into().unwrap();
        unsafe {
            asm!(concat!("wgmma.wait_group.sync.aligned {pending}; // {", $r0, "}" $(, " {", $r, "}")*),
                inout(reg32) acc[$r0], $(inout(reg32) acc[$r],)* pending = const $pending, options(nostack))
        }
    }};
}

/// Waits until at most `PENDING` of the warpgroup's committed wgmma groups are in flight
/// (warpgroup-collective); `acc`, an accumulator of a finished group, may be read after it.
#[inline(always)]
pub fn wgmma_wait<const PENDING: u32, const NT: usize>(acc: &mut [[f32; 4]; NT]) {
    for_acc_shape!(NT, wait_asm!(PENDING, acc))
}

impl Elem for Bf16 {
    #[inline(always)]
    fn mma(d: &mut [f32; 4], a: &[u32; 4], b0: u32, b1: u32) {
        mma_asm!("bf16", d, a, b0, b1);
    }
    #[inline(always)]
    fn wgmma<const NT: usize, const TA: u32, const TB: u32>(acc: &mut [[f32; 4]; NT], a: u64, b: u64, accumulate: bool) {
        for_acc_shape!(NT, wgmma_asm!("bf16", acc, a, b, TA, TB, accumulate))
    }
    #[inline(always)]
    fn wgmma_ra<const NT: usize, const TB: u32>(acc: &mut [[f32; 4]; NT], a: &[u32; 4], b: u64) {
        for_acc_shape!(NT, wgmma_ra_asm!("bf16", acc, a, b, TB))
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
    fn wgmma<const NT: usize, const TA: u32, const TB: u32>(acc: &mut [[f32; 4]; NT], a: u64, b: u64, accumulate: bool) {
        for_acc_shape!(NT, wgmma_asm!("f16", acc, a, b, TA, TB, accumulate))
    }
    #[inline(always)]
    fn wgmma_ra<const NT: usize, const TB: u32>(acc: &mut [[f32; 4]; NT], a: &[u32; 4], b: u64) {
        for_acc_shape!(NT, wgmma_ra_asm!("f16", acc, a, b, TB))
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
