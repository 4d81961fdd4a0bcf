//! The row softmax of the materialising (unfused) attention path, between the two cuBLAS
//! products: S = QKᵀ (unscaled, in the element type) comes in, P overwrites it in place. One CTA
//! per row of S, looping over the row however long it is, in two passes: the first folds each
//! thread's keys into a running (max, sum) in base 2, merged across the CTA; the second
//! recomputes the logits and writes the probabilities. Hidden keys (mask, causal, bias -inf) get
//! P = 0; a row with nothing visible gets P = 0 everywhere and LSE = -inf, never NaN.
use crate::arch::*;
use crate::elem::Elem;
use crate::scores::{LOG2E, tanh};
use crate::mask::Visibility;
use dmattn_abi::{BLOCK_MAP_K, BLOCK_MAP_Q, SOFTMAX_ROWS_THREADS, SoftmaxRowsParams, block_class, mask_bit};

/// Keys a thread takes per step: one 16-byte vector of S.
const CHUNK: u32 = 8;
const WARPS: u32 = SOFTMAX_ROWS_THREADS / 32;

/// One row of scores and the operands that modify it.
struct Row {
    /// Byte address of the row's first score.
    s: u64,
    /// Byte address of the row's block classes and packed mask words (absent: 0).
    classes: u64,
    bits: u64,
    /// Byte address of the row's first bias element and the bytes between keys (absent: 0).
    bias: u64,
    bias_step: u64,
    /// Keys the band leaves visible: `0..sinks` and `first..keys`.
    sinks: u32,
    first: u32,
    keys: u32,
    seqlen_k: u32,
    /// Rows start 16-byte aligned (`seqlen_k % 8 == 0`): S moves in 16-byte vectors.
    vector: bool,
    scale_log2: f32,
    softcap: f32,
}

impl Row {
    #[inline(always)]
    fn new(p: &SoftmaxRowsParams) -> Self {
        let (i, h, b) = block_idx();
        let (i, h, b) = (i as u64, h as u64, b as u64);
        let sk = p.seqlen_k;
        let row = (b * p.heads as u64 + h) * p.seqlen_q as u64 + i;
        let vis = Visibility::new(p.seqlen_q, sk, p.band);
        let (first, keys) = vis.row_keys(i as u32);
        let (c, m, bs) = (p.block_map.stride, p.mask_bits.stride, p.bias.stride);
        let mh = h / p.mask_head_div as u64;
        let classes = if p.block_map.is_present() { p.block_map.ptr + b * c[0] + mh * c[1] + i / BLOCK_MAP_Q as u64 * c[2] } else { 0 };
        let bits = if p.mask_bits.is_present() { p.mask_bits.ptr + 8 * (b * m[0] + mh * m[1] + i * m[2]) } else { 0 };
        let bias =
            if p.bias.is_present() { p.bias.ptr + 2 * (b * bs[0] + h / p.bias_head_div as u64 * bs[1] + i * bs[2]) } else { 0 };
        Row {
            s: p.s + 2 * row * sk as u64,
            classes,
            bits,
            bias,
            bias_step: 2 * bs[3],
            sinks: vis.row_sinks(),
            first,
            keys,
            seqlen_k: sk,
            vector: sk % CHUNK == 0,
            scale_log2: p.scale * LOG2E,
            softcap: p.softcap,
        }
    }

    /// The raw scores of chunk `c` (keys `8c..8c + 8`), packed in pairs; 0 past the row's end.
    #[inline(always)]
    unsafe fn load(&self, c: u32) -> [u32; 4] {
        let at = self.s + 2 * (CHUNK * c) as u64;
        if self.vector {
            return unsafe { ld_global_v4(at) };
        }
        let mut v = [0u32; 4];
        for e in 0..CHUNK {
            if CHUNK * c + e < self.seqlen_k {
                v[e as usize / 2] |= unsafe { ld_global_u16(at + 2 * e as u64) } << (16 * (e % 2));
            }
        }
        v
    }

    /// Writes chunk `c`'s packed pairs, stopping at the row's end.
    #[inline(always)]
    unsafe fn store(&self, c: u32, v: [u32; 4]) {
        let at = self.s + 2 * (CHUNK * c) as u64;
        if self.vector {
            return unsafe { st_global_v4(at, v) };
        }
        for e in 0..CHUNK {
            if CHUNK * c + e < self.seqlen_k {
                unsafe { st_global_u16(at + 2 * e as u64, v[e as usize / 2] >> (16 * (e % 2))) };
            }
        }
    }

    /// Base-2 logits of chunk `c`: `(softcap(scale · s) + bias) · log2(e)`, -inf where hidden.
    /// The chunk's mask bytes and bias elements are all loaded before any is used (keys past
    /// the visible ones read the last visible key's, then are discarded), so the loads overlap.
    #[inline(always)]
    unsafe fn logits<E: Elem>(&self, c: u32) -> [f32; CHUNK as usize] {
        let raw = unsafe { self.load(c) };
        let key = |e: u32| (CHUNK * c + e).min(self.keys - 1) as u64;
        // A chunk lies in one 64-key block: its class, and its word where the class is partial.
        let mut keep = 0xffu32;
        if self.classes != 0 {
            let block = CHUNK * c / BLOCK_MAP_K;
            keep = match unsafe { ld_global_nc_u8(self.classes + block as u64) } as u8 {
                block_class::FULL => 0xff,
                block_class::EMPTY => 0,
                _ => {
                    let word = unsafe { ld_global_nc_u64(self.bits + 8 * block as u64) };
                    (0..CHUNK).fold(0, |k, e| k | ((word >> mask_bit((CHUNK * c + e) % 64)) as u32 & 1) << e)
                }
            };
        }
        let mut bias = [0f32; CHUNK as usize];
        if self.bias != 0 {
            for e in 0..CHUNK {
                bias[e as usize] = E::unpack(unsafe { ld_global_nc_u16(self.bias + key(e) * self.bias_step) }).0;
            }
        }
        let mut x = [f32::NEG_INFINITY; CHUNK as usize];
        for e in 0..CHUNK {
            let (lo, hi) = E::unpack(raw[e as usize / 2]);
            let s = if e % 2 == 0 { lo } else { hi };
            let logit = if self.softcap > 0.0 {
                let pre = self.scale_log2 / LOG2E / self.softcap;
                (self.softcap * tanh(s * pre) + bias[e as usize]) * LOG2E
            } else {
                s * self.scale_log2 + bias[e as usize] * LOG2E
            };
            let k = CHUNK * c + e;
            if k < self.keys && (k >= self.first || k < self.sinks) && (keep >> e) & 1 != 0 {
                x[e as usize] = logit;
            }
        }
        x
    }
}

/// Running (max, sum) of base-2 logits: `sum = Σ 2^(x - max)`. A state that has seen nothing
/// visible is (-inf, 0), and merging keeps it free of NaN (-inf - -inf is never formed).
#[derive(Clone, Copy)]
struct MaxSum {
    max: f32,
    sum: f32,
}

impl MaxSum {
    #[inline(always)]
    fn merge(self, max: f32, sum: f32) -> Self {
        let new = self.max.max(max);
        let base = if new == f32::NEG_INFINITY { 0.0 } else { new };
        MaxSum { max: new, sum: self.sum * exp2(self.max - base) + sum * exp2(max - base) }
    }
}

/// Grid `(seqlen_q, heads, batch)`, [`SOFTMAX_ROWS_THREADS`] threads, one row of S per CTA.
#[inline(always)]
pub unsafe fn softmax_rows<E: Elem>(p: &SoftmaxRowsParams) {
    let tid = thread_idx();
    let row = Row::new(p);

    // Pass 1: each thread's chunks, then the warp's, then the CTA's (every thread merges the
    // per-warp states in the same order, so all hold the same result).
    let mut state = MaxSum { max: f32::NEG_INFINITY, sum: 0.0 };
    let mut c = tid;
    while c < row.keys.div_ceil(CHUNK) {
        let x = unsafe { row.logits::<E>(c) };
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let base = if max == f32::NEG_INFINITY { 0.0 } else { max };
        state = state.merge(max, x.iter().map(|&v| exp2(v - base)).sum());
        c += SOFTMAX_ROWS_THREADS;
    }
    let mut lanes = 16;
    while lanes > 0 {
        state = state.merge(shfl_xor(state.max, lanes), shfl_xor(state.sum, lanes));
        lanes /= 2;
    }
    let smem = smem_base();
    if tid % 32 == 0 {
        unsafe {
            st_shared_u32(smem + 8 * (tid / 32), state.max.to_bits());
            st_shared_u32(smem + 8 * (tid / 32) + 4, state.sum.to_bits());
        }
    }
    sync_threads();
    let mut total = MaxSum { max: f32::NEG_INFINITY, sum: 0.0 };
    for w in 0..WARPS {
        let (max, sum) = unsafe { (ld_shared_u32(smem + 8 * w), ld_shared_u32(smem + 8 * w + 4)) };
        total = total.merge(f32::from_bits(max), f32::from_bits(sum));
    }
    let (max, empty) = (total.max, total.sum <= 0.0);
    let inv = if empty { 0.0 } else { 1.0 / total.sum };
    if tid == 0 {
        let lse = if empty { f32::NEG_INFINITY } else { (max + log2(total.sum)) * core::f32::consts::LN_2 };
        let (i, h, b) = block_idx();
        let at = (b as u64 * p.heads as u64 + h as u64) * p.seqlen_q as u64 + i as u64;
        unsafe { *(p.lse as *mut f32).add(at as usize) = lse };
    }

    // Pass 2: P = 2^(x - max) / sum over the whole row, 0 past the visible keys.
    let mut c = tid;
    while c < row.seqlen_k.div_ceil(CHUNK) {
        let mut v = [0u32; 4];
        if !empty && CHUNK * c < row.keys {
            let x = unsafe { row.logits::<E>(c) };
            for k in 0..4 {
                v[k] = E::pack(exp2(x[2 * k] - max) * inv, exp2(x[2 * k + 1] - max) * inv);
            }
        }
        unsafe { row.store(c, v) };
        c += SOFTMAX_ROWS_THREADS;
    }
}
