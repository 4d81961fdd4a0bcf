//! Scores of one warp's accumulator tile, shared by forward and backward: the start values that
//! fold the mask and the bias into the QKᵀ accumulators, and the step to base-2 logits (scale,
//! softcap, and the bias when a softcap keeps it out of the accumulators).
use crate::arch::{exp2, ld_shared_u16, ld_shared_u32, rcp};
use crate::elem::Elem;
use crate::mask::TileBounds;
use crate::tile::SmemTile;
use dmattn_abi::FwdParams;

pub const LOG2E: f32 = core::f32::consts::LOG2_E;

/// `tanh(x) = 1 - 2 / (e^2x + 1)`: MUFU exp2 and rcp, accurate to ~1e-7 absolute where
/// `tanh.approx` would be ~5e-4 relative.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    1.0 - 2.0 * rcp(exp2(2.0 * LOG2E * x) + 1.0)
}

/// The score modifiers a launch uses. Kernels are instantiated twice: with `MODS = false` every
/// modifier is compiled out (the lean variant for plain and causal attention, which needs fewer
/// registers), with `MODS = true` they are read from the parameters.
#[derive(Clone, Copy)]
pub struct Mods {
    pub mask: bool,
    pub bias: bool,
    pub softcap: f32,
    pub scale_log2: f32,
}

impl Mods {
    #[inline(always)]
    pub fn of<const MODS: bool>(p: &FwdParams) -> Self {
        if MODS {
            Mods { mask: p.mask_bits.is_present(), bias: p.bias.is_present(), softcap: p.softcap, scale_log2: p.scale_log2 }
        } else {
            Mods { mask: false, bias: false, softcap: 0.0, scale_log2: p.scale_log2 }
        }
    }

    /// The bias goes into the accumulators' start values (not possible under a softcap, which
    /// applies before the bias).
    #[inline(always)]
    pub fn fold_bias(&self) -> bool {
        self.bias && self.softcap == 0.0
    }
}

/// Where one warp's part of a CTA score tile sits: the CTA's bias tile and packed mask tile in
/// shared memory, the warp's first row, and its first n8 tile of keys.
#[derive(Clone, Copy)]
pub struct WarpScores {
    pub bias: SmemTile,
    /// Packed mask tile: row `r` at `mask + r * mask_row_bytes`, one 8-byte word per 64 keys.
    pub mask: u32,
    pub mask_row_bytes: u32,
    pub row0: u32,
    pub nt0: u32,
    pub lane: u32,
}

impl WarpScores {
    /// Bias pair of the thread's keys `e = 0, 1` in n8 tile `nt` (warp-relative) of row
    /// `row0 + dr + g` (`dr` a multiple of 8).
    #[inline(always)]
    fn bias<E: Elem>(&self, dr: u32, nt: u32) -> (f32, f32) {
        let at = self.bias.chunk(self.lane / 4, 0) + 4 * (self.lane % 4);
        E::unpack(unsafe { ld_shared_u32(self.bias.shift(at, self.row0 + dr, self.nt0 + nt)) })
    }

    /// Accumulator start values: -inf where the mask, the causal rule or the bounds hide a score
    /// (`check`), bias / scale where the bias is folded in, 0 elsewhere. `bounds` is shifted to
    /// the thread's first score. Keeps no mask or bias register live into the MMA.
    #[inline(always)]
    pub fn init<E: Elem, const MT: usize, const NT: usize>(
        &self,
        s: &mut [[[f32; 4]; NT]; MT],
        mods: &Mods,
        bounds: &TileBounds,
        check: bool,
        load_mask: bool,
    ) {
        let fold = mods.fold_bias();
        *s = [[[0.0; 4]; NT]; MT];
        if !(check || fold) {
            return;
        }
        let inv_scale = LOG2E * rcp(mods.scale_log2);
        let t = self.lane % 4;
        for mt in 0..MT {
            for h in 0..2 {
                let dr = 16 * mt as u32 + 8 * h as u32;
                // Bit 2 nt + e of `bits`: the thread's key 8 nt + e (warp-relative) is visible.
                let bits = if check {
                    let mut keep = !0u32;
                    if load_mask {
                        let row = self.mask + (self.row0 + dr + self.lane / 4) * self.mask_row_bytes + 2 * t;
                        // The warp's 8 nt + e keys start at word nt0 / 8, bit 2 (nt0 % 8).
                        let (word, shift) = (self.nt0 / 8, 2 * (self.nt0 % 8));
                        keep = 0;
                        for w in 0..(NT as u32).div_ceil(8) + 1 {
                            if 16 * w < 2 * NT as u32 + shift {
                                keep |= (unsafe { ld_shared_u16(row + 8 * (word + w)) } << (16 * w)) >> shift;
                            }
                        }
                    }
                    keep & bounds.row_bits(dr)
                } else {
                    !0
                };
                for nt in 0..NT as u32 {
                    let bias = if fold { self.bias::<E>(dr, nt) } else { (0.0, 0.0) };
                    for e in 0..2 {
                        let bias = if e == 0 { bias.0 } else { bias.1 };
                        let visible = (bits >> (2 * nt + e as u32)) & 1 != 0;
                        s[mt][nt as usize][2 * h + e] = if visible { bias * inv_scale } else { f32::NEG_INFINITY };
                    }
                }
            }
        }
    }

    /// Base-2 logits of the thread's pair of scores in n8 tile `nt` of row `row0 + dr + g`,
    /// from their accumulators (QKᵀ on the start values), with `d capped / d raw = 1 - tanh²`
    /// under a softcap (1 without). -inf stays -inf.
    #[inline(always)]
    pub fn logits<E: Elem>(&self, acc: [f32; 2], dr: u32, nt: u32, mods: &Mods) -> ([f32; 2], [f32; 2]) {
        if mods.softcap > 0.0 {
            let pre = mods.scale_log2 * rcp(LOG2E * mods.softcap);
            let bias = if mods.bias { self.bias::<E>(dr, nt) } else { (0.0, 0.0) };
            let (mut x, mut dcap) = ([0.0; 2], [0.0; 2]);
            for e in 0..2 {
                let th = tanh(acc[e] * pre);
                dcap[e] = 1.0 - th * th;
                let b = if e == 0 { bias.0 } else { bias.1 };
                x[e] = if acc[e] == f32::NEG_INFINITY { f32::NEG_INFINITY } else { (mods.softcap * th + b) * LOG2E };
            }
            (x, dcap)
        } else {
            ([acc[0] * mods.scale_log2, acc[1] * mods.scale_log2], [1.0, 1.0])
        }
    }

    /// Accumulators → base-2 logits, in place.
    #[inline(always)]
    pub fn to_logits<E: Elem, const MT: usize, const NT: usize>(&self, s: &mut [[[f32; 4]; NT]; MT], mods: &Mods) {
        for mt in 0..MT {
            for h in 0..2 {
                for nt in 0..NT {
                    let v = &mut s[mt][nt];
                    let (x, _) = self.logits::<E>([v[2 * h], v[2 * h + 1]], 16 * mt as u32 + 8 * h as u32, nt as u32, mods);
                    (v[2 * h], v[2 * h + 1]) = (x[0], x[1]);
                }
            }
        }
    }
}
