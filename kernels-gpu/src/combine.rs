//! The split-KV combine: merges the normalised partial outputs and LSEs that the forward's
//! key splits wrote into the final O and LSE.
use crate::arch::*;
use crate::elem::Elem;
use dmattn_abi::{CombineParams, PRE_THREADS};

const LOG2E: f32 = core::f32::consts::LOG2_E;

/// One warp per query row, each lane 8 elements of the row (head dims up to 256); grid-stride
/// over the `batch * seqlen_q * heads` rows.
#[inline(always)]
pub unsafe fn combine<E: Elem>(p: &CombineParams) {
    let (tid, (bx, _, _)) = (thread_idx(), block_idx());
    let lane = tid % 32;
    let warps = PRE_THREADS / 32;
    let rows = p.batch * p.seqlen_q * p.heads;
    let lse_part = p.lse_part as *const f32;
    let split_lse = (p.batch * p.heads * p.seqlen_q) as usize;
    let split_o = 2 * rows as u64 * p.head_dim as u64;
    let mut row = bx * warps + tid / 32;
    while row < rows {
        // Rows in the partial O's order, [b, sq, h].
        let (h, bi) = (row % p.heads, row / p.heads);
        let (i, b) = (bi % p.seqlen_q, bi / p.seqlen_q);
        let lse_at = ((b * p.heads + h) * p.seqlen_q + i) as usize;
        let mut max = f32::NEG_INFINITY;
        for s in 0..p.splits as usize {
            max = max.max(unsafe { *lse_part.add(s * split_lse + lse_at) });
        }
        // A row no split saw anything of keeps O = 0 and LSE = -inf.
        let base = if max == f32::NEG_INFINITY { 0.0 } else { max };
        let mut sum = 0.0;
        for s in 0..p.splits as usize {
            sum += exp2((unsafe { *lse_part.add(s * split_lse + lse_at) } - base) * LOG2E);
        }
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        if 8 * lane < p.head_dim {
            let mut acc = [0f32; 8];
            let part = p.o_part + 2 * row as u64 * p.head_dim as u64 + 16 * lane as u64;
            for s in 0..p.splits as u64 {
                let w = exp2((unsafe { *lse_part.add(s as usize * split_lse + lse_at) } - base) * LOG2E) * inv;
                let v = unsafe { ld_global_nc_v4(part + s * split_o) };
                for j in 0..4 {
                    let (lo, hi) = E::unpack(v[j]);
                    acc[2 * j] += w * lo;
                    acc[2 * j + 1] += w * hi;
                }
            }
            let o = &p.o;
            let at = o.ptr + 2 * (b as u64 * o.stride[0] + i as u64 * o.stride[1] + h as u64 * o.stride[2]) + 16 * lane as u64;
            let packed = [E::pack(acc[0], acc[1]), E::pack(acc[2], acc[3]), E::pack(acc[4], acc[5]), E::pack(acc[6], acc[7])];
            unsafe { st_global_v4(at, packed) };
        }
        if lane == 0 {
            let lse = if sum > 0.0 { max + log2(sum) * core::f32::consts::LN_2 } else { f32::NEG_INFINITY };
            unsafe { *(p.lse as *mut f32).add(lse_at) = lse };
        }
        row += grid_dim_x() * warps;
    }
}
