//! Online softmax over the rows a thread holds in MMA accumulator layout: `MT` row tiles of 16,
//! each thread owning rows `g` and `g + 8` (`g = lane / 4`) and sharing them with its quad.
use crate::arch::{exp2, log2, shfl_xor};

/// Running max (base-2 logits) and partial sum of the thread's two rows in each row tile.
pub struct OnlineSoftmax<const MT: usize> {
    pub max: [[f32; 2]; MT],
    pub sum: [[f32; 2]; MT],
}

#[inline(always)]
fn quad_max(v: f32) -> f32 {
    let v = v.max(shfl_xor(v, 1));
    v.max(shfl_xor(v, 2))
}

#[inline(always)]
fn quad_sum(v: f32) -> f32 {
    let v = v + shfl_xor(v, 1);
    v + shfl_xor(v, 2)
}

impl<const MT: usize> OnlineSoftmax<MT> {
    #[inline(always)]
    pub fn new() -> Self {
        Self { max: [[f32::NEG_INFINITY; 2]; MT], sum: [[0.0; 2]; MT] }
    }

    /// Folds a tile of base-2 logits `s` (masked scores are -inf) into the running state, turns
    /// `s` into unnormalised probabilities and returns the factor each row's output must be
    /// scaled by. A row with no visible score so far keeps max -inf and gets probabilities 0.
    #[inline(always)]
    pub fn update<const NT: usize>(&mut self, s: &mut [[[f32; 4]; NT]; MT]) -> [[f32; 2]; MT] {
        let mut correction = [[0.0; 2]; MT];
        for mt in 0..MT {
            for h in 0..2 {
                let mut tile_max = f32::NEG_INFINITY;
                for nt in 0..NT {
                    tile_max = tile_max.max(s[mt][nt][2 * h]).max(s[mt][nt][2 * h + 1]);
                }
                let new_max = self.max[mt][h].max(quad_max(tile_max));
                // Subtracting -inf would give NaN; a row with nothing visible uses 0 instead.
                let base = if new_max == f32::NEG_INFINITY { 0.0 } else { new_max };
                correction[mt][h] = exp2(self.max[mt][h] - base);
                let mut sum = 0.0;
                for nt in 0..NT {
                    for e in 0..2 {
                        let p = exp2(s[mt][nt][2 * h + e] - base);
                        s[mt][nt][2 * h + e] = p;
                        sum += p;
                    }
                }
                self.sum[mt][h] = self.sum[mt][h] * correction[mt][h] + sum;
                self.max[mt][h] = new_max;
            }
        }
        correction
    }

    /// Per row: the factor that normalises the output (0 for a row with nothing visible) and the
    /// natural-log LSE (-inf for such a row).
    #[inline(always)]
    pub fn finish(&self) -> ([[f32; 2]; MT], [[f32; 2]; MT]) {
        let mut inv = [[0.0; 2]; MT];
        let mut lse = [[f32::NEG_INFINITY; 2]; MT];
        for mt in 0..MT {
            for h in 0..2 {
                let sum = quad_sum(self.sum[mt][h]);
                if sum > 0.0 {
                    inv[mt][h] = 1.0 / sum;
                    lse[mt][h] = (self.max[mt][h] + log2(sum)) * core::f32::consts::LN_2;
                }
            }
        }
        (inv, lse)
    }
}
