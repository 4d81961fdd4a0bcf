//! Forward attention: one CTA per (query tile, head, batch). K/V tiles stream through shared
//! memory (`cp.async`, the next K tile loading while the current one's softmax and PV run),
//! S = QKᵀ and O += PV run on tensor cores, and the softmax is online, in base 2 with the scale
//! folded in. Key tiles the mask leaves empty are never loaded. The gather variant runs over a
//! plane's kept keys alone (see `mask::GatheredRows`).
use crate::arch::*;
use crate::block_info::{BlockInfo, position, reread_position};
use crate::elem::Elem;
use crate::gemm::{pv_product, scores_product};
use crate::mask::{GatheredRows, MapRows, Tile, TileCursor, TileLine, load_mask_tile};
use crate::scores::{Mods, WarpScores};
use crate::softmax::{OnlineSoftmax, State};
use crate::tile::{Fragments, SmemTile};
use dmattn_abi::{FwdParams, POSITION_BYTES, View4, flags, mask_tile_bytes, modifiers};

/// The shared-memory tiles of one CTA: Q, K, V (`D` columns), the bias tile and the packed mask
/// tile of the current key block (in the gather variant, which has no mask, the rows' runs of
/// visible keys: `BM` u32 pairs, no larger), and the online softmax's state. The packed tile is row-major,
/// `BN / 64` words a row, unswizzled: a warp reads 8 rows x 4 half-words of one word column, 64
/// distinct bytes.
#[derive(Clone, Copy)]
pub struct Smem {
    q: SmemTile,
    k: SmemTile,
    v: SmemTile,
    bias: SmemTile,
    mask: u32,
    /// The gather variant's key positions: two slots of `BN` u32, key tile `n` in slot `n % 2`.
    key_pos: u32,
    /// This CTA's grid position (`block_info::position`).
    position: u32,
    softmax: u32,
}

impl Smem {
    #[inline(always)]
    fn new(d: usize, bm: usize, bn: usize) -> Self {
        let q = SmemTile::new(smem_base(), bm, d * 2);
        let k = SmemTile::new(q.base + q.bytes(), bn, d * 2);
        let v = SmemTile::new(k.base + k.bytes(), bn, d * 2);
        let bias = SmemTile::new(v.base + v.bytes(), bm, bn * 2);
        let mask = bias.base + bias.bytes();
        let key_pos = mask + mask_tile_bytes(bm as u32, bn as u32);
        let position = key_pos + 2 * 4 * bn as u32;
        Self { q, k, v, bias, mask, key_pos, position, softmax: position + POSITION_BYTES }
    }

    /// Another kernel's K-side tiles (K, bias, packed mask) seen as this layout, for
    /// [`load_k_side`] of a fixed-length variant that gathers nothing, which touches no other.
    #[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
    #[inline(always)]
    pub fn k_side(k: SmemTile, bias: SmemTile, mask: u32) -> Self {
        Self { q: k, k, v: k, bias, mask, key_pos: 0, position: 0, softmax: 0 }
    }

    /// Shared address of key tile `n`'s positions (gather variant).
    #[inline(always)]
    fn key_pos_of<const BN: usize>(&self, n: u32) -> u32 {
        self.key_pos + (n % 2) * 4 * BN as u32
    }
}

/// Gather variant: starts copying key tile `n`'s positions (the kept keys its rows hold; those at
/// or past `keys_end` are never read) into its slot, in 16-byte pieces. The lists are padded to
/// whole 64-key blocks, so a piece never crosses the end of a plane.
#[inline(always)]
unsafe fn load_key_pos<const BN: usize>(b: &BlockInfo, sm: &Smem, n: u32, keys_end: u32, tid: u32) {
    if tid < BN as u32 / 4 {
        let first = n * BN as u32 + 4 * tid;
        let bytes = 4 * keys_end.saturating_sub(first).min(4);
        // A zero-byte copy reads nothing, but its address must be valid: the tile's first key.
        let src = b.key_pos() + 4 * (if bytes > 0 { first } else { n * BN as u32 }) as u64;
        unsafe { cp_async_16(sm.key_pos_of::<BN>(n) + 16 * tid, src, bytes) };
    }
}

/// Starts copying K or V rows of key tile `n` (`keys` of them valid) into `tile`: consecutive
/// rows from `base` (`row` bytes apart; `fast`: see [`load_k_side`]), or in the gather variant
/// the rows of the tile's keys (its positions' slot, landed).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn load_kv<const D: usize, const BN: usize, const GATHER: bool>(sm: &Smem, tile: SmemTile, base: u64, row: u64, n: u32, keys: u32, tid: u32, threads: u32, fast: bool) {
    let col0 = n * BN as u32;
    if GATHER {
        let slot = sm.key_pos_of::<BN>(n);
        // A row stride fits 32 bits (heads x head dim x 2 bytes): a 32 x 32-bit wide multiply.
        let row = row as u32 as u64;
        unsafe { tile.load_rows_async(|r| base + ld_shared_u32(slot + 4 * r) as u64 * row, keys, tid, threads) };
    } else {
        let (src, bytes) = (base + col0 as u64 * row, (D * 2) as u32);
        unsafe {
            if fast {
                tile.load_async_fast(src, row, keys, bytes, tid, threads);
            } else {
                tile.load_async(src, row, keys, bytes, tid, threads);
            }
        }
    }
}

/// The paged variant's [`load_kv`]: K or V (`t`) rows of key tile `n`, each where its page holds
/// it.
#[inline(always)]
pub unsafe fn load_kv_paged<const BN: usize>(b: &BlockInfo, tile: SmemTile, t: &View4, n: u32, keys: u32, tid: u32, threads: u32) {
    let (col0, base) = (n * BN as u32, b.paged_base(t));
    unsafe { tile.load_rows_async(|r| base + b.paged_row(&t.stride, col0 + r), keys, tid, threads) };
}

/// Gather variant, key-side bias (`flags::BIAS_ROW`): row 0 of the bias tile from the bias row
/// at `row` (elements `key_stride` apart) at key tile `n`'s original key positions (their slot
/// has landed), zeros from `keys` on. Plain loads: one 2-byte element at any key is below
/// `cp.async`'s 4-byte unit; the stores land before the loop's next barrier like the copies.
#[inline(always)]
unsafe fn load_bias_at_keys<const BN: usize>(sm: &Smem, row: u64, key_stride: u64, n: u32, keys: u32, tid: u32, threads: u32) {
    let mut j = tid;
    while j < BN as u32 {
        let v = if j < keys {
            let key = unsafe { ld_shared_u32(sm.key_pos_of::<BN>(n) + 4 * j) };
            unsafe { ld_global_nc_u16(row + 2 * key as u64 * key_stride) }
        } else {
            0
        };
        unsafe { st_shared_u16(sm.bias.chunk(0, j / 8) + 2 * (j % 8), v) };
        j += threads;
    }
}

/// Starts the copies of key tile `tile`'s K and the bias and packed-mask tiles that go with it
/// (no mask copy for a full tile), keys from `keys_end` on zero-filled. All threads call this.
/// `fast`: whole K and bias tiles by `SmemTile::load_async_fast` (the warp-specialised
/// producers; the kernels whose every thread copies spilled with it).
#[inline(always)]
pub unsafe fn load_k_side<const D: usize, const BM: usize, const BN: usize, const GATHER: bool, const PACKED: bool, const PAGED: bool>(
    b: &BlockInfo,
    sm: &Smem,
    mods: Mods,
    tile: Tile,
    keys_end: u32,
    tid: u32,
    threads: u32,
    fast: bool,
) {
    let p = b.p;
    let col0 = tile.n * BN as u32;
    let keys = keys_end - col0;
    if PAGED {
        unsafe { load_kv_paged::<BN>(b, sm.k, &p.k, tile.n, keys, tid, threads) };
    } else {
        unsafe { load_kv::<D, BN, GATHER>(sm, sm.k, b.k(), 2 * p.k.stride[1], tile.n, keys, tid, threads, fast) };
    }
    if mods.bias {
        let s = p.bias.stride;
        unsafe {
            if PACKED {
                // A packed batch's bias is read element by element (the host sets neither
                // vector flag: a sequence's rows are not aligned).
                let src = b.bias() + 2 * col0 as u64 * s[3];
                sm.bias.load_strided(2, src, s[2], s[3], b.rows_valid, keys, tid, threads);
            } else if GATHER && p.flags & flags::BIAS_ROW != 0 {
                load_bias_at_keys::<BN>(sm, b.bias(), s[3], tile.n, keys, tid, threads);
            } else if p.flags & flags::BIAS_ROW != 0 {
                sm.bias.load_first_row_async(b.bias() + 2 * col0 as u64, 2 * keys, tid);
            } else if p.flags & flags::BIAS_VEC != 0 {
                let src = b.bias() + 2 * col0 as u64;
                if fast {
                    sm.bias.load_async_fast(src, 2 * s[2], b.rows_valid, 2 * keys, tid, threads);
                } else {
                    sm.bias.load_async(src, 2 * s[2], b.rows_valid, 2 * keys, tid, threads);
                }
            } else {
                let src = b.bias() + 2 * col0 as u64 * s[3];
                sm.bias.load_strided(2, src, s[2], s[3], b.rows_valid, keys, tid, threads);
            }
        }
    }
    if mods.mask && !tile.full {
        unsafe { load_mask_side::<BM, BN>(b, sm.mask, col0, tid, threads) };
    }
}

/// The packed mask tile (a partial tile's) of the key tile at key `col0` into `mask`, by
/// `threads` threads.
#[inline(always)]
pub unsafe fn load_mask_side<const BM: usize, const BN: usize>(b: &BlockInfo, mask: u32, col0: u32, tid: u32, threads: u32) {
    let p = b.p;
    let bits = b.mask_bits() + 8 * (col0 / 64) as u64;
    let classes = b.block_map() + (b.row0 / 64) as u64 * p.block_map.stride[2] + (col0 / 64) as u64;
    let (bits_stride, q_stride) = (p.mask_bits.stride[2], p.block_map.stride[2]);
    unsafe { load_mask_tile::<BM, BN>(mask, bits, bits_stride, classes, q_stride, b.rows_valid, true, tid, threads) };
}

/// The next key tile at or after `n` this CTA visits (its split's share): the band and the
/// mask's block map decide in the modifier variant; the lean and paged ones never have a mask,
/// so they visit every tile of the band, full, and hold no cursor state; the gather variant
/// visits the tiles of its rows' runs.
#[inline(always)]
fn next_tile<const BM: usize, const BN: usize, const MODS: bool, const GATHER: bool, const PAGED: bool>(
    b: &BlockInfo,
    rows: &GatheredRows,
    cursor: &mut TileCursor,
    n: u32,
    lane: u32,
) -> Option<Tile> {
    if GATHER {
        let (begin, end) = rows.key_tiles(BN as u32);
        let (first, end) = b.key_tiles(begin, end);
        let n = n.max(first);
        return (n < end).then(|| Tile { n, full: rows.tile_full(n * BN as u32, BN as u32) });
    }
    let map = MapRows::<BM, BN>::new(&b.p.block_map, b.block_map(), b.m_block, &b.vis);
    let (first, end) = b.key_tiles(0, map.end());
    let line = map.until(end);
    let n = line.next_candidate(n.max(first));
    if MODS && !PAGED { cursor.next(n, lane, &line) } else { (n < line.end()).then_some(Tile { n, full: true }) }
}

/// Keys past which K, V and bias rows are zero-filled, never read: the sequence's, or the
/// gathered keys the rows see.
#[inline(always)]
fn key_bound<const GATHER: bool>(b: &BlockInfo, rows: &GatheredRows) -> u32 {
    if GATHER { rows.keys_end() } else { b.keys() }
}

/// Const parameters: head dim `D`, tile `BM x BN`, `THREADS` per CTA, and the per-warp fragment
/// counts derived from them (`MT = BM / (16 * warps)` row tiles, `NT = BN / 8` key n-tiles,
/// `KT = D / 16` k-steps, `DT = D / 8` output n-tiles), spelled out because arrays cannot be
/// sized by const-generic arithmetic. `MODS` selects the variant with every modifier and split-KV
/// (`modifiers::ALL`; see [`Mods`]) over the lean one (`NONE`); `GATHER` (with `MODS`) the gather
/// variant, whose keys are gathered rows and whose mask is their ranks (no mask tiles);
/// `PACKED` the packed-batch ones (`dmattn_abi::Seqs`; the others serve fixed lengths only),
/// lean or with every modifier, and `PAGED` (with `PACKED` and `MODS`) the paged one, whose K/V are pages
/// (`dmattn_abi::Seqs::block_table`).
/// `WGMMA` (sm_90a, `FwdTile::wgmma`): the products are warpgroup `wgmma`s (`MT` = 1).
#[inline(always)]
pub unsafe fn forward<
    E: Elem,
    const D: usize,
    const BM: usize,
    const BN: usize,
    const THREADS: usize,
    const MT: usize,
    const NT: usize,
    const KT: usize,
    const DT: usize,
    const MODS: bool,
    const GATHER: bool,
    const PACKED: bool,
    const PAGED: bool,
    const WGMMA: bool,
>(
    p: &FwdParams,
) {
    const {
        assert!(!WGMMA || (MT == 1 && matches!(NT, 4 | 8 | 16) && matches!(DT, 4 | 8 | 16)));
        assert!(MT * 16 * (THREADS / 32) == BM && NT * 8 == BN && KT * 16 == D && DT * 8 == D);
        assert!(NT % 2 == 0 && DT % 2 == 0 && BM % 64 == 0 && BN % 64 == 0);
        assert!(MODS || !GATHER);
        assert!(!PACKED || !GATHER);
        assert!(!PAGED || PACKED && MODS);
        // The rows' runs fit where the mask tile would be.
        assert!(BM * 8 <= mask_tile_bytes(BM as u32, BN as u32) as usize);
    }
    let threads = THREADS as u32;
    let sm = Smem::new(D, BM, BN);
    let mods = Mods::of(p, if MODS { modifiers::ALL } else { modifiers::NONE });
    // The gather variant's mask is its rows' runs, kept where the mask tile would be.
    // The paged variant takes no mask (its lookups left no registers for the mask tiles).
    let mods = Mods { mask: mods.mask && !GATHER && !PAGED, ..mods };

    let mut o = [[[0f32; 4]; DT]; MT];
    OnlineSoftmax::<MT>::at(sm.softmax, thread_idx(), threads).reset();
    let mut cursor = TileCursor::new();
    let tid = thread_idx();

    let b = BlockInfo::new::<MODS, PACKED>(p, BM as u32, position::<MODS>(p, sm.position));
    if !b.has_rows() {
        return;
    }
    let rows = GatheredRows::new(sm.mask, b.rows_valid, BM as u32);
    if GATHER {
        unsafe { rows.store(&b.vis, b.key_ranks(), b.row0, BM as u32, tid, threads) };
    }
    if MODS {
        // The loop rereads the stored position (and the runs) before its first barrier
        // (racecheck).
        sync_threads();
    }
    if let Some(mut tile) = next_tile::<BM, BN, MODS, GATHER, PAGED>(&b, &rows, &mut cursor, 0, tid % 32) {
        let keys_end = key_bound::<GATHER>(&b, &rows);
        if GATHER {
            // The first tile's positions, before its rows can be copied.
            unsafe { load_key_pos::<BN>(&b, &sm, tile.n, keys_end, tid) };
            cp_async_commit();
            cp_async_wait_all();
            sync_threads();
        }
        let q_row = 2 * p.q.stride[1];
        unsafe { sm.q.load_async(b.q(), q_row, b.rows_valid, (D * 2) as u32, tid, threads) };
        unsafe { load_k_side::<D, BM, BN, GATHER, PACKED, PAGED>(&b, &sm, mods, tile, keys_end, tid, threads, false) };
        if GATHER && (tile.n + 1) * (BN as u32) < keys_end {
            unsafe { load_key_pos::<BN>(&b, &sm, tile.n + 1, keys_end, tid) };
        }
        cp_async_commit();
        loop {
            // Everything per-thread or per-CTA is rebuilt from opaque indices each iteration
            // (see `block_info`), so none of it is held in registers across the loop.
            let tid = opaque(tid);
            let b = BlockInfo::new::<MODS, PACKED>(p, BM as u32, reread_position::<MODS>(sm.position));
            let rows = GatheredRows::new(sm.mask, b.rows_valid, BM as u32);
            let lane = tid % 32;
            let (g, t) = (lane / 4, lane % 4);
            let warp_row0 = (tid / 32) * (MT as u32) * 16;
            let (q_frag, k_frag, v_frag) =
                (Fragments::new(sm.q, lane), Fragments::new(sm.k, lane), Fragments::new(sm.v, lane));

            // K (and bias/mask) of this tile have landed; everyone is done with the last V.
            copies_landed::<WGMMA>();
            sync_threads();
            let col0 = tile.n * BN as u32;
            let keys_end = key_bound::<GATHER>(&b, &rows);
            if PAGED {
                unsafe { load_kv_paged::<BN>(&b, sm.v, &p.v, tile.n, keys_end - col0, tid, threads) };
            } else {
                unsafe { load_kv::<D, BN, GATHER>(&sm, sm.v, b.v(), 2 * p.v.stride[1], tile.n, keys_end - col0, tid, threads, false) };
            }
            cp_async_commit();

            // The accumulators start at the score offsets (see `scores`): -inf where the mask,
            // the band or the key bound hide a score, bias / scale elsewhere.
            // A gathered tile's fullness already covers the band and the key bound.
            let check = !tile.full || (!GATHER && b.vis.tile_needs_check(b.row0, b.rows_valid.min(BM as u32), col0, BN as u32));
            let band = if GATHER {
                rows.rows_bits::<MT>(warp_row0 + g, col0 + 2 * t, check)
            } else {
                b.vis.at_tile(b.row0, col0).shifted(warp_row0 + g, 2 * t).rows_bits::<MT>(check)
            };
            let warp = WarpScores::new::<NT>(sm.bias, p.flags & flags::BIAS_ROW == 0, sm.mask, (BN / 8) as u32, warp_row0, 0, lane);
            let mut s = [[[0f32; 4]; NT]; MT];
            warp.init::<E, MT, NT>(&mut s, &mods, &band, check, mods.mask && !tile.full);

            unsafe { scores_product::<E, MT, NT, KT, WGMMA>(&mut s, sm.q, sm.k, q_frag, k_frag, warp_row0) };

            // Base-2 logits are `scale * s`: the scale folds into the softmax's exponent, except
            // under a softcap, which needs the logits first.
            let scale = if mods.softcap > 0.0 {
                warp.to_logits::<E, MT, NT>(&mut s, &mods);
                1.0
            } else {
                mods.scale_log2
            };

            // V has landed; everyone is done with this K/bias/mask: fetch the next tile's.
            copies_landed::<WGMMA>();
            sync_threads();
            let next = next_tile::<BM, BN, MODS, GATHER, PAGED>(&b, &rows, &mut cursor, tile.n + 1, lane);
            // The gather variant holds it across the softmax and PV as one word (the d64 tile is
            // a register short otherwise; the other variants keep theirs as it is, for the same
            // reason).
            let next_word = if GATHER { next.map_or(u32::MAX, |t| t.n | (t.full as u32) << 31) } else { 0 };
            if let Some(next) = next {
                // Reread, not held across the products above.
                let keys_end = key_bound::<GATHER>(&b, &rows);
                unsafe { load_k_side::<D, BM, BN, GATHER, PACKED, PAGED>(&b, &sm, mods, next, keys_end, tid, threads, false) };
                // The tile after's positions, into this tile's slot (its V is already on its way).
                if GATHER && (next.n + 1) * (BN as u32) < keys_end {
                    unsafe { load_key_pos::<BN>(&b, &sm, next.n + 1, keys_end, tid) };
                }
                cp_async_commit();
            }

            if let Some(correction) = OnlineSoftmax::<MT>::at(sm.softmax, tid, threads).update(&mut s, scale) {
                for mt in 0..MT {
                    for dt in 0..DT {
                        for i in 0..4 {
                            o[mt][dt][i] *= correction[mt][i / 2];
                        }
                    }
                }
            }

            unsafe { pv_product::<E, MT, NT, DT, WGMMA>(&mut o, &s, sm.v, v_frag) };
            let next = if GATHER { (next_word != u32::MAX).then(|| Tile { n: next_word & !(1 << 31), full: next_word >> 31 != 0 }) } else { next };
            match next {
                Some(next) => tile = next,
                None => break,
            }
        }
    } else {
        // No tile to visit: the loop's barriers never ran, and the epilogue reads the position
        // and softmax state other threads wrote (the same values, but racecheck rightly asks
        // for the order).
        sync_threads();
    }

    unsafe { store_output::<E, BM, MT, DT, MODS, PACKED>(p, &sm, &o, tid, threads) };
}

/// Epilogue: O normalised and stored, and each row's LSE. Every warp passed the loop's last
/// barrier after its last read of Q, so the Q tile can hold O for a coalesced store. Opaque
/// indices again, or LLVM merges these addresses with the prologue's identical ones and holds
/// them across the whole loop.
#[inline(always)]
unsafe fn store_output<E: Elem, const BM: usize, const MT: usize, const DT: usize, const MODS: bool, const PACKED: bool>(
    p: &FwdParams,
    sm: &Smem,
    o: &[[[f32; 4]; DT]; MT],
    tid: u32,
    threads: u32,
) {
    let tid = opaque(tid);
    let b = BlockInfo::new::<MODS, PACKED>(p, BM as u32, reread_position::<MODS>(sm.position));
    let softmax = OnlineSoftmax::<MT>::at(sm.softmax, tid, threads);
    unsafe { write_output::<E, MT, DT, _>(p, &b, sm.q, softmax, o, tid, threads, sync_threads) };
}

/// O normalised by `softmax`'s sums, staged through `q` (free: the `threads` threads' rows of it
/// read for the last time) and stored, and each row's LSE; `barrier` orders the staging among
/// the `threads`. A row with nothing visible gets O = 0 and LSE = -inf.
#[inline(always)]
pub unsafe fn write_output<E: Elem, const MT: usize, const DT: usize, S: State>(
    p: &FwdParams,
    b: &BlockInfo,
    q: SmemTile,
    softmax: OnlineSoftmax<MT, S>,
    o: &[[[f32; 4]; DT]; MT],
    tid: u32,
    threads: u32,
    barrier: impl Fn(),
) {
    let lane = tid % 32;
    let (g, t) = (lane / 4, lane % 4);
    let warp_row0 = (tid / 32) * (MT as u32) * 16;
    let (inv, lse) = softmax.finish();
    let o_at = q.chunk(g, 0) + 4 * t;
    for mt in 0..MT {
        for h in 0..2 {
            let dr = warp_row0 + 16 * mt as u32 + 8 * h as u32;
            for dt in 0..DT {
                let v = &o[mt][dt];
                let packed = E::pack(v[2 * h] * inv[mt][h], v[2 * h + 1] * inv[mt][h]);
                unsafe { st_shared_u32(q.shift(o_at, dr, dt as u32), packed) };
            }
            if t == 0 && dr + g < b.rows_valid {
                unsafe { *(p.lse as *mut f32).add(b.lse_index(dr + g) as usize) = lse[mt][h] };
            }
        }
    }
    barrier();
    unsafe { q.store(b.o(), 2 * p.o.stride[1], b.rows_valid, tid, threads) };
}
