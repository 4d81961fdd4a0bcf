//! Online softmax over the rows a thread holds in MMA accumulator layout: `MT` row tiles of 16,
//! each thread owning rows `g` and `g + 8` (`g = lane / 4`) and sharing them with its quad.
//!
//! The running max and sum live in shared memory ([`InShared`]) where registers are short: they
//! are touched once per key tile, and the 4 x `MT` registers they would hold across the main loop
//! are what tipped the 32-rows-per-warp forward tiles into spills. A kernel whose shared memory
//! is full keeps them in registers instead ([`InRegisters`]).
use crate::arch::{ballot, exp2, fma, ld_shared_u32, log2, rcp, shfl_xor, st_shared_u32};

/// Where a thread's running state lives: value `j` is the max of row `2 mt + h` at
/// `j = 2 (2 mt + h)`, its sum at `j + 1`.
pub trait State: Copy {
    fn get(&self, j: usize) -> f32;
    fn set(&mut self, j: usize, v: f32);
}

/// In shared memory: value `j` at `base + j * stride`, so a warp's accesses hit 32 distinct
/// banks.
#[derive(Clone, Copy)]
pub struct InShared {
    base: u32,
    stride: u32,
}

impl State for InShared {
    #[inline(always)]
    fn get(&self, j: usize) -> f32 {
        f32::from_bits(unsafe { ld_shared_u32(self.base + j as u32 * self.stride) })
    }

    #[inline(always)]
    fn set(&mut self, j: usize, v: f32) {
        unsafe { st_shared_u32(self.base + j as u32 * self.stride, v.to_bits()) }
    }
}

/// In registers: `N` = 4 `MT` values, indexed by constants only (every loop over them unrolls).
/// (The Hopper module's warp-specialised forward keeps its state here.)
#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
#[derive(Clone, Copy)]
pub struct InRegisters<const N: usize>([f32; N]);

impl<const N: usize> State for InRegisters<N> {
    #[inline(always)]
    fn get(&self, j: usize) -> f32 {
        self.0[j]
    }

    #[inline(always)]
    fn set(&mut self, j: usize, v: f32) {
        self.0[j] = v;
    }
}

/// One thread's running state (see [`State`]).
#[derive(Clone, Copy)]
pub struct OnlineSoftmax<const MT: usize, S: State = InShared> {
    state: S,
}

/// How far (base 2) a row's running max may lag the tile's before the output is rescaled. Until
/// then the stale max is kept, probabilities stay at most 2^8 (exact enough in f32 sums and in
/// the 16-bit P operand), and the O accumulators need no multiply: after the first few key
/// tiles a new tile rarely raises a row's max that far.
const RESCALE_THRESHOLD: f32 = 8.0;

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
    /// Thread `tid`'s state in the region at `region` shared by `threads` threads.
    #[inline(always)]
    pub fn at(region: u32, tid: u32, threads: u32) -> Self {
        Self { state: InShared { base: region + 4 * tid, stride: 4 * threads } }
    }
}

#[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
impl<const MT: usize, const N: usize> OnlineSoftmax<MT, InRegisters<N>> {
    /// A state in registers (not yet [`OnlineSoftmax::reset`]).
    #[inline(always)]
    pub fn in_registers() -> Self {
        const { assert!(N == 4 * MT) };
        Self { state: InRegisters([0.0; N]) }
    }
}

impl<const MT: usize, S: State> OnlineSoftmax<MT, S> {
    #[inline(always)]
    fn load(&self, j: usize) -> f32 {
        self.state.get(j)
    }

    #[inline(always)]
    fn store(&mut self, j: usize, v: f32) {
        self.state.set(j, v)
    }

    /// The state before the first key tile: max -inf, sum 0.
    #[inline(always)]
    pub fn reset(&mut self) {
        for r in 0..2 * MT {
            self.store(2 * r, f32::NEG_INFINITY);
            self.store(2 * r + 1, 0.0);
        }
    }

    /// Folds a tile of scores `s` into the running state: base-2 logits are `scale * s`
    /// (masked scores are -inf). Turns `s` into unnormalised probabilities and returns, where
    /// some row of the warp took a new max, the factor each row's output must be scaled by
    /// (warp-uniform: `None` means no output row changes). A row with no visible score so far
    /// keeps max -inf and gets probabilities 0.
    #[inline(always)]
    pub fn update<const NT: usize>(&mut self, s: &mut [[[f32; 4]; NT]; MT], scale: f32) -> Option<[[f32; 2]; MT]> {
        let mut correction = [[1.0; 2]; MT];
        let mut rescale = false;
        for mt in 0..MT {
            for h in 0..2 {
                let j = 2 * (2 * mt + h);
                let max = self.load(j);
                let mut tile_max = f32::NEG_INFINITY;
                for nt in 0..NT {
                    tile_max = tile_max.max(s[mt][nt][2 * h]).max(s[mt][nt][2 * h + 1]);
                }
                // `scale > 0`: the max of the scaled scores is the scaled max.
                let tile_max = quad_max(tile_max) * scale;
                let mut sum = self.load(j + 1);
                let new_max = if tile_max > max + RESCALE_THRESHOLD { tile_max } else { max };
                if new_max != max {
                    rescale = true;
                    correction[mt][h] = exp2(max - new_max);
                    sum *= correction[mt][h];
                    self.store(j, new_max);
                }
                // Subtracting -inf would give NaN; a row with nothing visible uses 0 instead.
                let base = if new_max == f32::NEG_INFINITY { 0.0 } else { new_max };
                for nt in 0..NT {
                    for e in 0..2 {
                        let p = exp2(fma(s[mt][nt][2 * h + e], scale, -base));
                        s[mt][nt][2 * h + e] = p;
                        sum += p;
                    }
                }
                self.store(j + 1, sum);
            }
        }
        (ballot(rescale) != 0).then_some(correction)
    }

    /// [`OnlineSoftmax::update`], then the output accumulators `o` (rows in the same layout)
    /// rescaled where a row's max moved.
    #[inline(always)]
    pub fn update_rescaling<const NT: usize, const DT: usize>(&mut self, s: &mut [[[f32; 4]; NT]; MT], scale: f32, o: &mut [[[f32; 4]; DT]; MT]) {
        if let Some(correction) = self.update(s, scale) {
            for mt in 0..MT {
                for dt in 0..DT {
                    for i in 0..4 {
                        o[mt][dt][i] *= correction[mt][i / 2];
                    }
                }
            }
        }
    }

    /// Folds `other`'s state into this one, and its output accumulators (`other_o(mt, dt, i)`,
    /// in `o`'s layout) into `o`: `other` is a thread holding the same rows over other keys (a
    /// warp that took another share of each key tile). A side with nothing visible in a row
    /// (max -inf) adds nothing to it; neither side: the row stays empty.
    #[inline(always)]
    pub fn merge<const DT: usize>(&mut self, other: &Self, o: &mut [[[f32; 4]; DT]; MT], other_o: impl Fn(usize, usize, usize) -> f32) {
        for mt in 0..MT {
            for h in 0..2 {
                let j = 2 * (2 * mt + h);
                let (max, max_other) = (self.load(j), other.load(j));
                let new_max = max.max(max_other);
                // exp2(-inf) = 0; both -inf would give NaN factors.
                let (f, f_other) = if new_max == f32::NEG_INFINITY { (1.0, 0.0) } else { (exp2(max - new_max), exp2(max_other - new_max)) };
                self.store(j, new_max);
                self.store(j + 1, self.load(j + 1) * f + other.load(j + 1) * f_other);
                for dt in 0..DT {
                    for e in 0..2 {
                        let i = 2 * h + e;
                        o[mt][dt][i] = o[mt][dt][i] * f + other_o(mt, dt, i) * f_other;
                    }
                }
            }
        }
    }

    /// Per row: the factor that normalises the output (0 for a row with nothing visible) and the
    /// natural-log LSE (-inf for such a row).
    #[inline(always)]
    pub fn finish(&self) -> ([[f32; 2]; MT], [[f32; 2]; MT]) {
        let mut inv = [[0.0; 2]; MT];
        let mut lse = [[f32::NEG_INFINITY; 2]; MT];
        for mt in 0..MT {
            for h in 0..2 {
                let j = 2 * (2 * mt + h);
                let sum = quad_sum(self.load(j + 1));
                if sum > 0.0 {
                    inv[mt][h] = rcp(sum);
                    lse[mt][h] = (self.load(j) + log2(sum)) * core::f32::consts::LN_2;
                }
            }
        }
        (inv, lse)
    }
}
