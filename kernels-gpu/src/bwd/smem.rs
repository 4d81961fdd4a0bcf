//! The backward CTA's shared memory: the key tile's K and V, the P and dS tiles, and the
//! pipeline stages that each hold one step's (query tile, query head) operands, with the copies
//! that fill a stage.
use super::key_block::KeyBlock;
use crate::arch::*;
use crate::elem::Elem;
use crate::mask::load_mask_tile;
use crate::scores::{LOG2E, Mods};
use crate::tile::SmemTile;
use dmattn_abi::{BWD_DQ_STAGE_BYTES, bwd_stage_bytes, flags, mask_tile_bytes};

/// One pipeline stage: everything that belongs to one (query tile, query head).
#[derive(Clone, Copy)]
pub(super) struct Stage {
    pub(super) q: SmemTile,
    pub(super) dout: SmemTile,
    pub(super) bias: SmemTile,
    pub(super) mask: u32,
    pub(super) lse: u32,
    pub(super) delta: u32,
}

#[derive(Clone, Copy)]
pub(super) struct Smem {
    pub(super) k: SmemTile,
    pub(super) v: SmemTile,
    pub(super) p: SmemTile,
    pub(super) ds: SmemTile,
    pub(super) shape: (usize, usize, usize),
    pub(super) stages: u32,
    /// The stages hold a bias tile (`BwdTile::bias`).
    pub(super) bias: bool,
}

impl Smem {
    #[inline(always)]
    pub(super) fn new(d: usize, bm: usize, bn: usize, stages: usize, bias: bool) -> Self {
        let k = SmemTile::new(smem_base(), bn, d * 2);
        let v = SmemTile::new(k.base + k.bytes(), bn, d * 2);
        let p = SmemTile::new(v.base + v.bytes(), bm, bn * 2);
        let ds = SmemTile::new(p.base + p.bytes(), bm, bn * 2);
        Smem { k, v, p, ds, shape: (d, bm, bn), stages: stages as u32, bias }
    }

    #[inline(always)]
    pub(super) fn stage_bytes(&self) -> u32 {
        let (d, bm, bn) = self.shape;
        bwd_stage_bytes(bm as u32, bn as u32, d as u32, self.bias)
    }

    /// Warp `w`'s dQ staging slice, after the stages.
    #[inline(always)]
    pub(super) fn dq_stage(&self, w: u32) -> u32 {
        self.ds.base + self.ds.bytes() + self.stages * self.stage_bytes() + w * BWD_DQ_STAGE_BYTES
    }

    /// A key-side bias folded into the scores (see `step::bias_columns`): the CTA's row of it,
    /// f32 divided by the scale, in stage 0's bias tile, which the stages then leave alone.
    #[inline(always)]
    pub(super) fn bias_row(&self) -> u32 {
        self.stage(0).bias.base
    }

    /// Pipeline stage `i` (computed, not indexed: a runtime index into an array of tiles would
    /// put the array in local memory). Without a bias tile, `bias` is empty (no variant that
    /// runs on such a tile reads it).
    #[inline(always)]
    pub(super) fn stage(&self, i: u32) -> Stage {
        let (d, bm, bn) = self.shape;
        let q = SmemTile::new(self.ds.base + self.ds.bytes() + i * self.stage_bytes(), bm, d * 2);
        let dout = SmemTile::new(q.base + q.bytes(), bm, d * 2);
        let bias = SmemTile::new(dout.base + dout.bytes(), if self.bias { bm } else { 0 }, bn * 2);
        let mask = bias.base + bias.bytes();
        let lse = mask + mask_tile_bytes(bm as u32, bn as u32);
        Stage { q, dout, bias, mask, lse, delta: lse + 4 * bm as u32 }
    }
}

/// Starts the copies of (query tile `m`, head `h`)'s Q, dO, bias, packed mask, lse and delta into
/// `st`; of a key-side bias only its one row, and none where the scores fold it in from the CTA's
/// f32 row (`columns`, see `step::bias_columns` and [`store_bias_row`]). `pairs`: lse and delta
/// side by side for the transposed step (`transposed`): row pair `2 i, 2 i + 1`'s two lse, then
/// its two delta, 16 bytes at `lse + 16 i`. All threads call this.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn load_stage<const D: usize, const BM: usize, const BN: usize>(
    kb: &KeyBlock,
    st: &Stage,
    mods: &Mods,
    by_class: bool,
    columns: bool,
    pairs: bool,
    m: u32,
    h: u32,
    tid: u32,
    threads: u32,
) {
    let f = &kb.p.fwd;
    let row0 = m * BM as u32;
    let rows = f.seqlen_q - row0;
    let row_bytes = (D * 2) as u32;
    // The stage's tiles: on Hopper at d64 with the whole-tile path (`SmemTile::load_async_fast`;
    // d64 8K blocks + bias backward 7.54 -> 7.36 ms, H200). At d128, whose kernels with a bias
    // sit at the register limit, it spilled 4 bytes and ran 5-8 % slower; the portable kernels
    // keep the checked copies too.
    let copy = |tile: SmemTile, src: u64, row_stride: u64, rows: u32, bytes: u32| unsafe {
        if cfg!(target_feature = "sm_90a") && D <= 64 {
            tile.load_async_fast(src, row_stride, rows, bytes, tid, threads);
        } else {
            tile.load_async(src, row_stride, rows, bytes, tid, threads);
        }
    };
    copy(st.q, kb.q_row(&f.q, h, row0, 2), 2 * f.q.stride[1], rows, row_bytes);
    copy(st.dout, kb.q_row(&kb.p.dout, h, row0, 2), 2 * kb.p.dout.stride[1], rows, row_bytes);
    // lse and delta: one f32 per thread (rows of different heads are not 16-byte aligned).
    if tid < 2 * BM as u32 {
        let (dst, src) = if tid < BM as u32 { (st.lse, f.lse) } else { (st.delta, kb.p.delta) };
        let r = tid % BM as u32;
        let at = if pairs { st.lse + 16 * (r / 2) + 4 * (r % 2) + if tid < BM as u32 { 0 } else { 8 } } else { dst + 4 * r };
        let ok = r < rows;
        unsafe { cp_async_4(at, src + 4 * kb.row_index(h, row0 + if ok { r } else { 0 }), if ok { 4 } else { 0 }) };
    }
    if mods.bias && !(columns && mods.fold_bias()) {
        let s = f.bias.stride;
        let base = kb.broadcast_at(&f.bias, f.bias_head_div, h, row0, 0, 2);
        unsafe {
            if columns {
                st.bias.load_first_row_async(base, 2 * kb.keys_valid, tid);
            } else if f.flags & flags::BIAS_VEC != 0 {
                copy(st.bias, base, 2 * s[2], rows, 2 * kb.keys_valid);
            } else {
                st.bias.load_strided(2, base, s[2], s[3], rows, kb.keys_valid, tid, threads);
            }
        }
    }
    if mods.mask {
        let (mb, map) = (&f.mask_bits, &f.block_map);
        let head = kb.operand_head(h, f.mask_head_div) as u64;
        let classes =
            map.ptr + kb.batch as u64 * map.stride[0] + head * map.stride[1] + (row0 / 64) as u64 * map.stride[2] + (kb.col0 / 64) as u64;
        let bits = mb.ptr + 8 * (kb.batch as u64 * mb.stride[0] + head * mb.stride[1] + row0 as u64 * mb.stride[2] + (kb.col0 / 64) as u64);
        unsafe { load_mask_tile::<BM, BN>(st.mask, bits, mb.stride[2], classes, map.stride[2], rows, by_class, tid, threads) };
    }
}


/// Stores the CTA's row of a key-side bias the scores fold in (see `step::bias_columns`) at
/// [`Smem::bias_row`]: f32 times `1 / scale` (`WarpScores::init`'s start values), zeros from the
/// tile's last key on. Read after the walk's first barrier. All threads call this.
#[inline(always)]
pub(super) unsafe fn store_bias_row<E: Elem, const BN: usize>(kb: &KeyBlock, sm: &Smem, mods: &Mods, tid: u32, threads: u32) {
    let f = &kb.p.fwd;
    let src = kb.broadcast_at(&f.bias, f.bias_head_div, kb.head(0), 0, 0, 2);
    let inv_scale = LOG2E * rcp(mods.scale_log2);
    let mut j = tid;
    while j < BN as u32 {
        let v = if j < kb.keys_valid { E::unpack(unsafe { ld_global_nc_u16(src + 2 * j as u64 * f.bias.stride[3]) }).0 * inv_scale } else { 0.0 };
        unsafe { st_shared_u32(sm.bias_row() + 4 * j, v.to_bits()) };
        j += threads;
    }
}
