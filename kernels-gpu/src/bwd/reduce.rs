//! Gradients out of the CTA: per step, dQ and dbias added to their f32 accumulators; at the end,
//! dK and dV stored (or added, where CTAs split a key tile's query tiles).
use super::key_block::KeyBlock;
use super::smem::Smem;
use super::step::warp_at;
use crate::arch::*;
use crate::elem::Elem;
use crate::tile::SmemTile;
use dmattn_abi::{BWD_DQ_STAGE_TILES, BwdParams};

/// Epilogue: dK and dV out of their accumulators. A CTA with a share of its key tile's query
/// tiles (a kernel that `splits`, `BwdParams::q_split_shift`) adds them to the f32
/// accumulators; otherwise they go through the K and V tiles (every warp is past its last read
/// of them) to coalesced stores. A CTA whose key tile no query sees never waited for its K/V
/// copies: they land before the tiles are overwritten, or they would overwrite dK/dV. The
/// parameters come as a pointer: as a reference argument LLVM would take them as unwritten
/// through the step and reorder its address arithmetic (the kernels sit at the register limit).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn store_dkdv<E: Elem, const MKV: usize, const DKV: usize, const KR: usize, const WGMMA: bool>(
    p: *const BwdParams,
    kb: &KeyBlock,
    sm: &Smem,
    dk: &[[[f32; 4]; DKV]; MKV],
    dv: &[[[f32; 4]; DKV]; MKV],
    splits: bool,
    tid: u32,
    threads: u32,
) {
    let p = unsafe { &*p };
    let lane = tid % 32;
    let (g, t) = (lane / 4, lane % 4);
    let (wk, wd) = warp_at(tid / 32, KR);
    cp_async_wait_all();
    sync_threads();
    if splits && p.q_split_shift != 0 {
        // A share of the query tiles: added to the f32 accumulators (their keys past the
        // CTA's `seqlen_k` got nothing from it, see `seq::localize_split`).
        let (dk_at, dv_at) = (kb.kv_row(&p.dk, 4), kb.kv_row(&p.dv, 4));
        let row_bytes = 4 * p.dk.stride[1];
        for mt in 0..MKV {
            for hh in 0..2 {
                let key = 16 * (MKV as u32 * wk + mt as u32) + 8 * hh as u32 + g;
                let ok = key < kb.keys_valid;
                for dt in 0..DKV {
                    let at = key as u64 * row_bytes + 4 * (8 * (DKV as u32 * wd + dt as u32) + 2 * t) as u64;
                    let (k, v) = (&dk[mt][dt], &dv[mt][dt]);
                    unsafe {
                        add_pair::<WGMMA>(ok, dk_at + at, [k[2 * hh], k[2 * hh + 1]]);
                        add_pair::<WGMMA>(ok, dv_at + at, [v[2 * hh], v[2 * hh + 1]]);
                    }
                }
            }
        }
        return;
    }
    let at = sm.k.chunk(g, 0) + 4 * t;
    for mt in 0..MKV {
        for hh in 0..2 {
            let dr = 16 * (MKV as u32 * wk + mt as u32) + 8 * hh as u32;
            for dt in 0..DKV {
                let chunk = DKV as u32 * wd + dt as u32;
                let (k, v) = (&dk[mt][dt], &dv[mt][dt]);
                unsafe {
                    st_shared_u32(sm.k.shift(at, dr, chunk), E::pack(k[2 * hh], k[2 * hh + 1]));
                    st_shared_u32(sm.v.shift(at - sm.k.base + sm.v.base, dr, chunk), E::pack(v[2 * hh], v[2 * hh + 1]));
                }
            }
        }
    }
    sync_threads();
    unsafe {
        sm.k.store(kb.kv_row(&p.dk, 2), 2 * p.dk.stride[1], kb.keys_valid, tid, threads);
        sm.v.store(kb.kv_row(&p.dv, 2), 2 * p.dv.stride[1], kb.keys_valid, tid, threads);
    }
}

/// Adds two consecutive f32 (8-byte aligned) where `ok`: one vector reduction where the device
/// has sm_90's (`V2`).
#[inline(always)]
pub(super) unsafe fn add_pair<const V2: bool>(ok: bool, addr: u64, v: [f32; 2]) {
    unsafe {
        if V2 {
            red_add_v2_f32_if(ok, addr, v);
        } else {
            red_add_f32_if(ok, addr, v[0]);
            red_add_f32_if(ok, addr + 4, v[1]);
        }
    }
}

/// Adds a warp's dQ block (16 rows x `8 DQ` columns in the MMA accumulator layout) to the f32
/// accumulator whose row 0, column 0 is at `rows`, rows `row_bytes` apart, `rows_valid` of them
/// inside the sequence. The tiles pass through the warp's staging slice, `BWD_DQ_STAGE_TILES` at
/// a time as 16 x 8 row-major blocks, so that each addition instruction covers 4 rows x 8
/// consecutive columns: whole 32-byte sectors, where the accumulator layout's 8 rows x 4
/// scattered columns used half of each sector (the backward was bound by L2 throughput).
#[inline(always)]
pub(super) unsafe fn add_dq<const DQ: usize>(dqt: &[[f32; 4]; DQ], stage: u32, rows: u64, row_bytes: u64, rows_valid: u32, lane: u32) {
    const TILES: usize = BWD_DQ_STAGE_TILES as usize;
    const { assert!(DQ % TILES == 0) };
    let (g, t) = (lane / 4, lane % 4);
    for chunk in 0..DQ / TILES {
        for j in 0..TILES {
            let v = &dqt[chunk * TILES + j];
            for hh in 0..2 {
                let at = stage + 512 * j as u32 + 4 * (8 * (8 * hh as u32 + g) + 2 * t);
                unsafe { st_shared_v2(at, [v[2 * hh].to_bits(), v[2 * hh + 1].to_bits()]) };
            }
        }
        sync_warp();
        for j in 0..TILES {
            for i in 0..4u32 {
                let r = 4 * i + lane / 8;
                let v = f32::from_bits(unsafe { ld_shared_u32(stage + 512 * j as u32 + 128 * i + 4 * lane) });
                let col = 8 * (chunk * TILES + j) as u64 + (lane % 8) as u64;
                unsafe { red_add_f32_if(r < rows_valid, rows + r as u64 * row_bytes + 4 * col, v) };
            }
        }
        sync_warp();
    }
}

/// Adds a warp's dQ block (16 rows x `8 DQ` columns in the MMA accumulator layout) to the
/// blocked f32 accumulator (`dmattn_abi::DqConvertParams`) whose block for the rows' group and
/// the first column tile is at `tiles`: each n8 tile is one 16-byte reduction a lane, 512
/// contiguous bytes a warp. Rows past the sequence's end in its last group land on padding;
/// `inside`: the block's first row is inside the sequence (a block past its end would land on
/// the next sequence's or entry's rows).
#[inline(always)]
pub(super) unsafe fn add_dq_blocked<const DQ: usize>(dqt: &[[f32; 4]; DQ], tiles: u64, inside: bool, lane: u32) {
    if inside {
        for (j, v) in dqt.iter().enumerate() {
            unsafe { red_add_v4_f32(tiles + 512 * j as u64 + 16 * lane as u64, *v) };
        }
    }
}

/// Adds the CTA's dS sums for a key-side bias (`step::GroupSum::columns`) to the f32 dbias
/// accumulator, once per CTA: this thread's `sums` hold its share of dS summed over every step
/// (rows `g` and `g + 8` of each of `MS` m16 tiles, keys `8 (nt_first + nt) + 2 (lane % 4)` and
/// the next), which its rows, then the warp's eight row groups (shuffles) sum; lanes 0-3 add.
#[inline(always)]
pub(super) unsafe fn add_dbias_columns<const MS: usize, const NC: usize>(kb: &KeyBlock, sums: &[[[f32; 4]; NC]; MS], nt_first: u32, lane: u32) {
    let (p, f) = (kb.p, &kb.p.fwd);
    let base = kb.broadcast_at(&p.dbias_accum, f.bias_head_div, kb.head(0), 0, 0, 4);
    let key_bytes = 4 * p.dbias_accum.stride[3];
    for nt in 0..NC {
        for e in 0..2 {
            let mut v = 0.0;
            for rows in sums {
                v += rows[nt][e] + rows[nt][2 + e];
            }
            v += shfl_xor(v, 4);
            v += shfl_xor(v, 8);
            v += shfl_xor(v, 16);
            let c = 8 * (nt_first + nt as u32) + 2 * (lane % 4) + e as u32;
            unsafe { red_add_f32_if(lane < 4 && c < kb.keys_valid, base + c as u64 * key_bytes, v) };
        }
    }
}

/// Adds the dS tile (in the stage's bias tile) to the f32 dbias accumulator at the bias's
/// broadcast coordinates. Where the bias is broadcast over the tile's rows or keys, the tile is
/// first summed over them here, so that each accumulator element gets one addition per tile
/// from one thread (a plain read-add-write is then race-free within the CTA). `V2`: the device
/// has sm_90's vector reductions.
#[inline(always)]
pub(super) unsafe fn add_dbias<E: Elem, const BM: usize, const BN: usize, const V2: bool>(
    kb: &KeyBlock,
    tile: &SmemTile,
    h: u32,
    row0: u32,
    rows_valid: u32,
    tid: u32,
    threads: u32,
) {
    let (p, f) = (kb.p, &kb.p.fwd);
    let ds = |r: u32, c: u32| E::unpack(unsafe { ld_shared_u16(tile.chunk(r, c / 8) + 2 * (c % 8)) }).0;
    let (rows, keys) = (rows_valid.min(BM as u32), kb.keys_valid.min(BN as u32));
    // Read once: the parameters live in shared memory and would be reloaded after every addition.
    let stride = p.dbias_accum.stride;
    let (row_bytes, key_bytes) = (4 * stride[2], 4 * stride[3]);
    let base = kb.broadcast_at(&p.dbias_accum, f.bias_head_div, h, row0, 0, 4);
    match (stride[2] == 0, stride[3] == 0) {
        (false, false) => {
            // Element-wise, a pair of keys per thread: consecutive threads take consecutive
            // pairs of a row, so that each warp-wide addition covers whole 32-byte sectors.
            const { assert!(BN % 64 == 0) };
            let pairs = (BN / 2) as u32;
            let c = 2 * (tid % pairs);
            let (r_first, r_step) = (tid / pairs, threads / pairs);
            let at = base + r_first as u64 * row_bytes + c as u64 * key_bytes;
            // sm_90: the pair in one vector reduction where both keys are in and 8-byte aligned.
            let pair = V2 && c + 1 < keys && key_bytes == 4 && row_bytes % 8 == 0 && base % 8 == 0;
            for i in 0..BM as u32 / r_step {
                let r = r_first + i * r_step;
                let (d0, d1) = E::unpack(unsafe { ld_shared_u32(tile.chunk(r, c / 8) + 2 * (c % 8)) });
                let at = at + (i * r_step) as u64 * row_bytes;
                unsafe {
                    if pair {
                        red_add_v2_f32_if(r < rows, at, [d0, d1]);
                    } else {
                        red_add_f32_if(r < rows && c < keys, at, d0);
                        red_add_f32_if(r < rows && c + 1 < keys, at + key_bytes, d1);
                    }
                }
            }
        }
        (true, false) => {
            // One bias row for all query rows: column sums.
            let mut c = tid;
            while c < keys {
                let mut sum = 0.0;
                for r in 0..rows {
                    sum += ds(r, c);
                }
                unsafe { red_add_f32_if(true, base + c as u64 * key_bytes, sum) };
                c += threads;
            }
        }
        (false, true) => {
            // One bias value per query row: row sums.
            let mut r = tid;
            while r < rows {
                let mut sum = 0.0;
                for c in 0..keys {
                    sum += ds(r, c);
                }
                unsafe { red_add_f32_if(true, base + r as u64 * row_bytes, sum) };
                r += threads;
            }
        }
        (true, true) => {
            // One value for the whole tile: warp 0 sums it.
            if tid < 32 {
                let mut sum = 0.0;
                let mut r = tid;
                while r < rows {
                    for c in 0..keys {
                        sum += ds(r, c);
                    }
                    r += 32;
                }
                let sum = warp_sum(sum);
                unsafe { red_add_f32_if(tid == 0, base, sum) };
            }
        }
    }
}

