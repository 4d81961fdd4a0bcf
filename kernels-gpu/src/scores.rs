//! Scores of one warp's accumulator tile, shared by forward and backward: the start values that
//! fold the mask and the bias into the QKᵀ accumulators, and the step to base-2 logits (scale,
//! softcap, and the bias when a softcap keeps it out of the accumulators).
use crate::arch::{exp2, fma, ld_shared_u16, ld_shared_u32, rcp, sync_warp};
use crate::elem::Elem;
use crate::mask::RowBits;
use crate::tile::SmemTile;
use dmattn_abi::{FwdParams, modifiers};

pub const LOG2E: f32 = core::f32::consts::LOG2_E;

/// `tanh(x) = 1 - 2 / (e^2x + 1)`: MUFU exp2 and rcp, accurate to ~1e-7 absolute where
/// `tanh.approx` would be ~5e-4 relative.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    1.0 - 2.0 * rcp(exp2(2.0 * LOG2E * x) + 1.0)
}

/// The base-2 logit of a raw score accumulator `acc` under softcap `softcap` (`pre`: the scale
/// over the cap, `scale_log2 / (LOG2E * softcap)`), with `bias` added after the cap, and `d capped
/// / d raw = 1 - tanh²`. -inf stays -inf.
#[inline(always)]
pub fn capped_logit(acc: f32, pre: f32, softcap: f32, bias: f32) -> (f32, f32) {
    let th = tanh(acc * pre);
    let x = if acc == f32::NEG_INFINITY { f32::NEG_INFINITY } else { (softcap * th + bias) * LOG2E };
    (x, 1.0 - th * th)
}

/// The score modifiers a launch uses, those its variant (`dmattn_abi::modifiers`) compiles out
/// reading as absent: the lean variants need fewer registers and less code.
#[derive(Clone, Copy)]
pub struct Mods {
    pub mask: bool,
    pub bias: bool,
    pub softcap: f32,
    pub scale_log2: f32,
}

impl Mods {
    /// `variant` is a constant at every call site, so its tests fold away; a `BIAS` variant
    /// runs only with a bias (the host's choice), so it needs no test for one.
    #[inline(always)]
    pub fn of(p: &FwdParams, variant: u8) -> Self {
        let all = variant == modifiers::ALL;
        Mods {
            mask: variant != modifiers::NONE && p.mask_bits.is_present(),
            bias: variant == modifiers::BIAS || (all && p.bias.is_present()),
            softcap: if all { p.softcap } else { 0.0 },
            scale_log2: p.scale_log2,
        }
    }

    /// dS's scale, the softmax scale (`scale_log2` is it times log2 e): dS = P (dP - delta)
    /// times it.
    #[inline(always)]
    pub fn ds_scale(&self) -> f32 {
        self.scale_log2 * core::f32::consts::LN_2
    }

    /// The bias goes into the accumulators' start values (not possible under a softcap, which
    /// applies before the bias).
    #[inline(always)]
    pub fn fold_bias(&self) -> bool {
        self.bias && self.softcap == 0.0
    }
}

/// Where one thread's part of a CTA score tile sits: its first bias pair in the CTA's bias tile
/// and its first packed-mask half-word, so that each score's bias and mask bits are a constant
/// offset away.
#[derive(Clone, Copy)]
pub struct WarpScores {
    pub bias: SmemTile,
    /// The thread's first bias pair (row `row0 + lane / 4`, keys `8 nt0 + 2 (lane % 4)`).
    bias_at: u32,
    /// The half-word of the thread's keys in the packed mask word holding key `8 nt0` of its
    /// first row, and the bit of key `8 nt0` in it.
    mask_at: u32,
    mask_shift: u32,
    mask_row_bytes: u32,
    /// Bytes from one bias row to the next in the tile (0: every row reads row 0).
    bias_row_step: u32,
}

impl WarpScores {
    /// The warp's scores are rows `row0..` (a multiple of 8) and n8 key tiles `nt0..nt0 + NT`
    /// (`nt0` a multiple of `NT`, a power of two) of the CTA tile; the packed mask tile has row
    /// `r` at `mask + r * mask_row_bytes`, one 8-byte word per 64 keys. With `bias_rows` false
    /// the bias tile holds one row (`flags::BIAS_ROW`), which every row reads.
    #[inline(always)]
    pub fn new<const NT: usize>(bias: SmemTile, bias_rows: bool, mask: u32, mask_row_bytes: u32, row0: u32, nt0: u32, lane: u32) -> Self {
        const { assert!(NT.is_power_of_two()) };
        let (g, t) = (lane / 4, lane % 4);
        // Rows 8 apart share their swizzle: a row offset is a plain addition (`SmemTile::shift`).
        let bias_row_step = if bias_rows { bias.shift(0, 1, 0) } else { 0 };
        let first = if bias_rows { bias.shift(bias.chunk(g, 0) + 4 * t, row0, nt0) } else { bias.shift(bias.chunk(0, 0) + 4 * t, 0, nt0) };
        WarpScores {
            bias,
            bias_row_step,
            bias_at: first,
            mask_at: mask + (row0 + g) * mask_row_bytes + 8 * (nt0 / 8) + 2 * t,
            mask_shift: 2 * (nt0 % 8),
            mask_row_bytes,
        }
    }

    /// Bias pair of the thread's keys `e = 0, 1` in n8 tile `nt` (warp-relative) of row
    /// `dr + g` (`dr` a multiple of 8, warp-relative).
    #[inline(always)]
    fn bias<E: Elem>(&self, dr: u32, nt: u32) -> (f32, f32) {
        E::unpack(unsafe { ld_shared_u32(self.bias_at_pair(dr, nt)) })
    }

    /// Shared address of the bias pair [`WarpScores::bias`] reads (the backward overwrites it
    /// with dS for dbias).
    #[inline(always)]
    pub fn bias_at_pair(&self, dr: u32, nt: u32) -> u32 {
        self.bias.shift(self.bias_at + dr * self.bias_row_step, 0, nt)
    }

    /// The thread's bias pairs as stored (two `E` halves a word), `[h][nt]` for row `8 h + g`,
    /// to be added to the scores' product by [`WarpScores::add_bias`] (the Hopper module's
    /// warp-specialised forward).
    #[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
    #[inline(always)]
    pub fn bias_words<const NT: usize>(&self) -> [[u32; NT]; 2] {
        let mut words = [[0; NT]; 2];
        for (h, row) in words.iter_mut().enumerate() {
            for (nt, w) in row.iter_mut().enumerate() {
                *w = unsafe { ld_shared_u32(self.bias_at_pair(8 * h as u32, nt as u32)) };
            }
        }
        words
    }

    /// Adds the bias pairs `words` ([`WarpScores::bias_words`]) to one 16-row tile of raw score
    /// accumulators, in their units (bias / scale), as [`WarpScores::init`] folds it in.
    #[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
    #[inline(always)]
    pub fn add_bias<E: Elem, const NT: usize>(s: &mut [[f32; 4]; NT], words: &[[u32; NT]; 2], mods: &Mods) {
        let inv_scale = LOG2E * rcp(mods.scale_log2);
        for h in 0..2 {
            for nt in 0..NT {
                let (b0, b1) = E::unpack(words[h][nt]);
                s[nt][2 * h] = fma(b0, inv_scale, s[nt][2 * h]);
                s[nt][2 * h + 1] = fma(b1, inv_scale, s[nt][2 * h + 1]);
            }
        }
    }

    /// Whether [`WarpScores::init`] sets anything but zeros: where `check` or the bias is
    /// folded in. A product may start from nothing instead (scale-d 0) where not.
    #[inline(always)]
    pub fn has_start_values(mods: &Mods, check: bool) -> bool {
        check || mods.fold_bias()
    }

    /// Accumulator start values: -inf where the mask or the band and bounds (`band`, read only
    /// where `check`) hide a score, bias / scale where the
    /// bias is folded in, 0 elsewhere. Keeps no mask or bias register live into the MMA.
    #[inline(always)]
    pub fn init<E: Elem, const MT: usize, const NT: usize>(
        &self,
        s: &mut [[[f32; 4]; NT]; MT],
        mods: &Mods,
        band: &impl RowBits,
        check: bool,
        load_mask: bool,
    ) {
        let fold = mods.fold_bias();
        *s = [[[0.0; 4]; NT]; MT];
        if !Self::has_start_values(mods, check) {
            return;
        }
        let inv_scale = LOG2E * rcp(mods.scale_log2);
        for mt in 0..MT {
            for h in 0..2 {
                let dr = 16 * mt as u32 + 8 * h as u32;
                let bits = self.visible_bits::<NT>(band, mt, h, check, load_mask);
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

    /// Bit `2 nt + e` set where the thread's key `8 nt + e` (warp-relative) of row `dr + g`
    /// (`dr = 16 mt + 8 h`) is visible: the mask (read where `load_mask`) and the band and bounds
    /// (`band`), both only where `check`; all set elsewhere.
    #[inline(always)]
    pub fn visible_bits<const NT: usize>(&self, band: &impl RowBits, mt: usize, h: usize, check: bool, load_mask: bool) -> u32 {
        if !check {
            return !0;
        }
        let mut keep = !0u32;
        if load_mask {
            let row = self.mask_at + (16 * mt as u32 + 8 * h as u32) * self.mask_row_bytes;
            keep = 0;
            for w in 0..(NT as u32).div_ceil(8) + 1 {
                if 16 * w < 2 * NT as u32 + self.mask_shift {
                    keep |= (unsafe { ld_shared_u16(row + 8 * w) } << (16 * w)) >> self.mask_shift;
                }
            }
        }
        keep & band.bits(mt, h)
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
                let b = if e == 0 { bias.0 } else { bias.1 };
                (x[e], dcap[e]) = capped_logit(acc[e], pre, mods.softcap, b);
            }
            (x, dcap)
        } else {
            ([acc[0] * mods.scale_log2, acc[1] * mods.scale_log2], [1.0, 1.0])
        }
    }

    /// [`Self::logits`] less `sub` (a row's base-2 LSE): without a softcap one FMA a score, the
    /// subtraction fused into the scale's multiply. -inf stays -inf, and so does any logit less
    /// +inf (an empty row's).
    #[inline(always)]
    pub fn logits_less<E: Elem>(&self, acc: [f32; 2], dr: u32, nt: u32, mods: &Mods, sub: f32) -> ([f32; 2], [f32; 2]) {
        if mods.softcap > 0.0 {
            let (x, dcap) = self.logits::<E>(acc, dr, nt, mods);
            ([x[0] - sub, x[1] - sub], dcap)
        } else {
            ([fma(acc[0], mods.scale_log2, -sub), fma(acc[1], mods.scale_log2, -sub)], [1.0, 1.0])
        }
    }

    /// Accumulators → base-2 logits, in place.
    #[inline(always)]
    pub fn to_logits<E: Elem, const MT: usize, const NT: usize>(&self, s: &mut [[[f32; 4]; NT]; MT], mods: &Mods) {
        for mt in 0..MT {
            for h in 0..2 {
                for nt in 0..NT {
                    // Four bias pairs in flight at a time: all of a tile's at once (as ptxas
                    // schedules them) spill the Hopper forward (128 registers).
                    if nt % 4 == 0 {
                        sync_warp();
                    }
                    let v = &mut s[mt][nt];
                    let (x, _) = self.logits::<E>([v[2 * h], v[2 * h + 1]], 16 * mt as u32 + 8 * h as u32, nt as u32, mods);
                    (v[2 * h], v[2 * h + 1]) = (x[0], x[1]);
                }
            }
        }
    }
}
