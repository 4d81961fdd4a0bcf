//! Deterministic mode's turns: the dQ tiles' counters (key tile n adds on turn n) and the turn
//! lock of CTAs sharing a broadcast dbias element (see the module doc of `bwd`).
use super::key_block::KeyBlock;
use crate::arch::*;
use crate::scores::Mods;
use dmattn_abi::BwdParams;

/// Deterministic mode, with a bias whose gradient elements CTAs of several batches, kv heads or
/// key tiles add to (a bias broadcast over them): the CTA's turn lock and turn. The sharing
/// CTAs take the elements in turns in block order (key tile fastest, as in the grid), one turn
/// counter per slot of the dimensions not shared.
#[inline(always)]
pub(super) fn dbias_turn<const BN: usize, const DET: bool>(kb: &KeyBlock, mods: &Mods) -> Option<(u64, u32)> {
    let (p, f) = (kb.p, &kb.p.fwd);
    let bd = p.bias_dims;
    let n_blocks = f.seqlen_k.div_ceil(BN as u32);
    let (sb, sh, sn) = (bd[0] == 1 && f.batch > 1, bd[1] == 1 && p.kv_heads > 1, bd[3] == 1 && n_blocks > 1);
    if !DET || !mods.bias || !(sb || sh || sn) {
        return None;
    }
    // Mixed-radix digits (index, extent): shared dimensions number the turn, the others the slot.
    let turn_digit = |shared: bool, index: u32, extent: u32| if shared { (index, extent) } else { (0, 1) };
    let slot_digit = |shared: bool, index: u32, extent: u32| if shared { (0, 1) } else { (index as u64, extent as u64) };
    let ((tb, _), (th, the), (tn, tne)) =
        (turn_digit(sb, kb.batch, f.batch), turn_digit(sh, kb.kv_head, p.kv_heads), turn_digit(sn, kb.n_block, n_blocks));
    let ((xb, _), (xh, xhe), (xn, xne)) =
        (slot_digit(sb, kb.batch, f.batch), slot_digit(sh, kb.kv_head, p.kv_heads), slot_digit(sn, kb.n_block, n_blocks));
    Some((p.dbias_turns + 4 * ((xb * xhe + xh) * xne + xn), (tb * the + th) * tne + tn))
}

/// The dQ turn counter of (head `h`, query tile `m`).
#[inline(always)]
pub(super) fn dq_turn(kb: &KeyBlock, h: u32, m: u32, m_tiles: u32) -> u64 {
    let tile = (kb.batch as u64 * kb.p.fwd.heads as u64 + h as u64) * m_tiles as u64 + m as u64;
    kb.p.dq_turns + 4 * tile
}

/// Deterministic mode: passes on the dQ turns of query tiles `from..to` this CTA skips, for
/// every head of its group (thread 0; no data moves).
#[inline(always)]
pub(super) unsafe fn pass_skipped_turns(p: &BwdParams, kb: &KeyBlock, from: u32, to: u32, m_tiles: u32, tid: u32) {
    if tid == 0 {
        for m in from..to.min(m_tiles) {
            for hg in 0..p.fwd.kv_group {
                let turn = dq_turn(kb, kb.head(hg), m, m_tiles);
                while unsafe { ld_acquire_u32(turn) } != kb.n_block {}
                unsafe { st_release_u32(turn, kb.n_block + 1) };
            }
        }
    }
}
