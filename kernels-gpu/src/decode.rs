//! Decoding: the forward for calls with few queries (see `dmattn_abi::DecodeParams`). One CTA
//! per (kv head, key split, sequence), its 64 rows the kv group's query heads times the
//! sequence's queries, so that each K and V row is read once per kv head. The CTA compacts a
//! key-side mask's kept keys as it goes: a scan round reads the mask of 1024 keys (8 a thread:
//! a byte of a packed word, or 8 bool bytes) and queues the kept positions in shared memory;
//! each key tile is the next 64 of them, its K and V rows (and the bias) read at those positions
//! while the tile before is computed. Without a mask every key of the split is queued.
use crate::arch::*;
use crate::elem::Elem;
use crate::gemm::{pv_product, scores_product};
use crate::mask::Visibility;
use crate::scores::{Mods, WarpScores};
use crate::seq::Seq;
use crate::softmax::OnlineSoftmax;
use crate::tile::{Fragments, GatheredKv, SmemTile};
use dmattn_abi::{DECODE_KEYS, DECODE_MASK_BYTES_DIMS, DECODE_QUEUE, DECODE_ROWS, DECODE_SCAN_KEYS, DECODE_THREADS, DecodeParams, FwdParams, View4, mask_word_byte, modifiers, unpacked_position};

const BM: usize = DECODE_ROWS as usize;
const BN: usize = DECODE_KEYS as usize;
const NT: usize = BN / 8;
const THREADS: u32 = DECODE_THREADS;
const _: () = assert!(DECODE_QUEUE.is_power_of_two() && BM == 16 * (THREADS as usize / 32) && DECODE_SCAN_KEYS == 8 * THREADS);

/// Shared memory (`dmattn_abi::decode_smem_bytes`): Q, two slots of K, V and the bias row, the
/// queue of kept key positions, the scan's sums, the online softmax's state, and with paged K/V
/// the pages of the tile being loaded.
#[derive(Clone, Copy)]
struct Smem {
    q: SmemTile,
    kv: GatheredKv,
    bias: u32,
    sums: u32,
    softmax: u32,
    pages: u32,
}

impl Smem {
    #[inline(always)]
    fn new(d: usize) -> Self {
        let q = SmemTile::new(smem_base(), BM, d * 2);
        let kv_base = q.base + q.bytes();
        let bias = kv_base + 4 * (BN * d * 2) as u32;
        let queue = bias + 2 * 2 * BN as u32;
        let kv = GatheredKv::new(kv_base, BN, d * 2, queue, DECODE_QUEUE);
        let sums = queue + 4 * DECODE_QUEUE;
        let softmax = sums + 4 * 33;
        Self { q, kv, bias, sums, softmax, pages: softmax + 16 * THREADS }
    }

    /// Slot `slot`'s bias row: one row every query row reads (the bias has no query dimension).
    #[inline(always)]
    fn bias(&self, slot: u32) -> SmemTile {
        SmemTile::new(self.bias + slot * 2 * BN as u32, 1, 2 * BN)
    }
}

/// This CTA's (kv head, split, sequence): its block index, or the grid position the work order
/// names (`FwdParams::order`: a packed batch's CTAs heaviest first).
#[inline(always)]
fn position(p: &FwdParams) -> (u32, u32, u32) {
    let (bx, by, bz) = block_idx();
    if p.order == 0 {
        return (bx, by, bz);
    }
    let linear = bx + grid_dim_x() * (by + grid_dim_y() * bz);
    unpacked_position(unsafe { ld_global_nc_u64(p.order + 8 * linear as u64) })
}

/// One CTA's problem: its sequence, kv head and split, its rows, and the keys it scans.
#[derive(Clone, Copy)]
struct DecodeBlock<'a> {
    p: &'a FwdParams,
    seq: Seq,
    kv_head: u32,
    split: u32,
    /// Query heads per kv head: row `r` is query `r / group` of head `kv_head * group + r % group`.
    group: u32,
    /// Rows in the sequence (`group` times its queries).
    rows: u32,
    vis: Visibility,
    /// Keys `begin..end` are this CTA's to scan: its split's share of those any row sees.
    begin: u32,
    end: u32,
    /// The last row's first visible key and the first row's end: a tile of keys at or past the
    /// one and before the other is visible to every row.
    lo_max: u32,
    hi_min: u32,
}

impl<'a> DecodeBlock<'a> {
    #[inline(always)]
    fn new(dp: &'a DecodeParams) -> Self {
        let p = &dp.fwd;
        let (kv_head, split, z) = position(p);
        let seq = Seq::of::<true>(p, z);
        let group = p.kv_group;
        let vis = Visibility::new(seq.len_q, seq.len_k, p.band);
        // The band without sinks shows each query one run of keys, whose ends never decrease
        // along the queries.
        let last = seq.len_q.max(1) - 1;
        let ((lo_min, hi_min), (lo_max, hi_max)) = (vis.row_keys(0), vis.row_keys(last));
        let split_begin = split * dp.split_keys;
        let begin = lo_min.max(split_begin);
        let end = hi_max.min(split_begin.saturating_add(dp.split_keys));
        Self { p, seq, kv_head, split, group, rows: group * seq.len_q, vis, begin, end: end.max(begin), lo_max, hi_min }
    }

    /// (query head, query) of row `r`.
    #[inline(always)]
    fn row(&self, r: u32) -> (u32, u32) {
        let i = div(r, self.group);
        (self.kv_head * self.group + r - i * self.group, i)
    }

    /// Byte address of row `r`'s query in q, or (`o`) of its output row, split `split`'s.
    #[inline(always)]
    fn q_row(&self, t: &View4, r: u32, split_offset: u64) -> u64 {
        let (h, i) = self.row(r);
        t.ptr + 2 * (split_offset + self.seq.q_offset(&t.stride, i) + h as u64 * t.stride[2])
    }

    #[inline(always)]
    fn lse_index(&self, r: u32) -> u64 {
        let (h, i) = self.row(r);
        self.split as u64 * self.p.lse_split_stride + self.seq.lse_index(self.p, h, i)
    }

    /// Byte address of key `j`'s row in k or v (`t`): packed, or paged with `j` in `page`.
    #[inline(always)]
    fn kv_row<const PAGED: bool>(&self, t: &View4, j: u32, page: u32) -> u64 {
        let head = t.ptr + 2 * self.kv_head as u64 * t.stride[2];
        if PAGED { head + 2 * Seq::in_page(self.p, &t.stride, page, j) } else { head + 2 * self.seq.k_offset(&t.stride, j) }
    }

    /// Byte address of key 0 of this kv head's plane of a key-side operand `t` of `bytes`-byte
    /// elements whose heads `head_div` divides (absent: 0).
    #[inline(always)]
    fn plane_row(&self, t: &View4, head_div: u32, bytes: u64) -> u64 {
        if !t.is_present() {
            return 0;
        }
        let plane = div(self.kv_head * self.group, head_div) as u64;
        t.ptr + bytes * (self.seq.origin(&t.stride) + plane * t.stride[1])
    }

    /// Byte address of this kv head's bias at key 0 (keys `stride[3]` elements apart).
    #[inline(always)]
    fn bias_row(&self) -> u64 {
        self.plane_row(&self.p.bias, self.p.bias_head_div, 2)
    }

    /// Visibility bits (`mask::keys_below`'s accumulator order) of a thread's rows `r0` and
    /// `r0 + 8` for the keys of its quad lane `t` among the `8 NTW` keys from `key0` of a tile
    /// of `count` queued keys from queue entry `first`; rows past the sequence see nothing.
    #[inline(always)]
    fn rows_bits<const NTW: usize>(&self, sm: &Smem, first: u32, count: u32, key0: u32, r0: u32, t: u32) -> [[u32; 2]; 1] {
        let bounds = |r: u32| if r < self.rows { self.vis.row_keys(div(r, self.group)) } else { (0, 0) };
        let ((lo0, hi0), (lo1, hi1)) = (bounds(r0), bounds(r0 + 8));
        let mut bits = [0u32; 2];
        for nt in 0..NTW as u32 {
            for e in 0..2 {
                let c = key0 + 8 * nt + 2 * t + e;
                if c < count {
                    let key = sm.kv.key_at(first + c);
                    let bit = 1 << (2 * nt + e);
                    if lo0 <= key && key < hi0 {
                        bits[0] |= bit;
                    }
                    if lo1 <= key && key < hi1 {
                        bits[1] |= bit;
                    }
                }
            }
        }
        [bits]
    }
}

/// A warp's share of each key tile. The CTA's rows are the kv group's heads times the
/// sequence's queries, often 4-32 of its 64: rather than leave the warps past them idle, the
/// warps of a CTA with at most 16 (32) rows split each tile's 64 keys four (two) ways, each
/// warp with its own softmax state and output, and the shares of a row group are merged at the
/// end ([`merge_shares`]). H200 (ncu), the masked decode batch: the one or two warps holding
/// rows took the tile's products while the others waited at the next barrier. Head dims past
/// 128 keep one share: their 96-128 O accumulators a thread leave no registers for the shares'
/// code (ptxas spilled).
#[derive(Clone, Copy)]
struct WarpShare {
    /// Key shares of a tile (1, 2 or 4: warp-uniform and CTA-uniform).
    shares: u32,
    /// This warp's share (0: the warp that keeps the merged rows).
    share: u32,
    /// The first of the warp's 16 rows, and of its keys in a tile.
    row0: u32,
    key0: u32,
}

impl WarpShare {
    #[inline(always)]
    fn of(rows: u32, warp: u32, d: usize) -> Self {
        let shares = if d > 128 || rows > 32 { 1 } else if rows > 16 { 2 } else { 4 };
        let share = warp % shares;
        WarpShare { shares, share, row0: 16 * (warp / shares), key0: share * (BN as u32 / shares) }
    }
}

/// Where the scan reads the mask: packed words, a bool byte a key, or nothing (every key kept).
#[derive(Clone, Copy)]
enum MaskSource {
    None,
    /// Byte address of the word holding key 0.
    Words(u64),
    /// Byte address of key 0's byte, and the bytes between keys.
    Bytes(u64, u64),
}

/// The scan's place: queue entries `head..tail` are kept keys not yet in a tile; keys from
/// `cursor` (a multiple of 64) are not scanned yet, and `ahead` is this thread's mask for the
/// round at `cursor`, loaded a round ahead ([`Scan::load`]). Every thread holds the same counts.
struct Scan {
    head: u32,
    tail: u32,
    cursor: u32,
    ahead: [u32; 8],
    mask: MaskSource,
}

impl Scan {
    /// `bytes`: the kernel reads `mask_bytes` (head dims to `DECODE_MASK_BYTES_DIMS`, a
    /// constant: past it the 6 more registers of a round's bytes spilled the d192 kernels).
    #[inline(always)]
    fn new(dp: &DecodeParams, b: &DecodeBlock, bytes: bool, tid: u32) -> Self {
        let cursor = b.begin & !63;
        let p = b.p;
        let mask = if bytes && dp.mask_bytes.is_present() {
            MaskSource::Bytes(b.plane_row(&dp.mask_bytes, p.mask_head_div, 1), dp.mask_bytes.stride[3])
        } else if p.mask_bits.is_present() {
            MaskSource::Words(b.plane_row(&p.mask_bits, p.mask_head_div, 8))
        } else {
            MaskSource::None
        };
        Scan { head: 0, tail: 0, cursor, ahead: Self::load(mask, cursor, b.end, tid), mask }
    }

    /// This thread's mask of the round at `cursor` (keys `cursor + 8 tid..`): the packed word
    /// holding them (its halves in entries 0 and 1), or their 8 bytes (a key at or past `end`
    /// reads the last one's, which the round ignores); nothing past `end`. Loaded a round ahead,
    /// the 8 bytes are 8 registers: the words' 2 and 6 zeros where the mask is packed.
    #[inline(always)]
    fn load(mask: MaskSource, cursor: u32, end: u32, tid: u32) -> [u32; 8] {
        let key = cursor + 8 * tid;
        let mut ahead = [0u32; 8];
        if key >= end {
            return ahead;
        }
        match mask {
            MaskSource::None => {}
            MaskSource::Words(words) => {
                let w = unsafe { ld_global_nc_u64(words + 8 * (key / 64) as u64) };
                (ahead[0], ahead[1]) = (w as u32, (w >> 32) as u32);
            }
            MaskSource::Bytes(row, stride) => {
                for (e, a) in ahead.iter_mut().enumerate() {
                    *a = unsafe { ld_global_nc_u8(row + (key + e as u32).min(end - 1) as u64 * stride) };
                }
            }
        }
        ahead
    }

    /// Bit `e` set where key `cursor + 8 tid + e` is shown, from this round's `ahead`.
    #[inline(always)]
    fn shown(&self, tid: u32) -> u32 {
        match self.mask {
            MaskSource::None => 0xff,
            MaskSource::Words(_) => mask_word_byte(self.ahead[0] as u64 | (self.ahead[1] as u64) << 32, tid % 8),
            MaskSource::Bytes(..) => self.ahead.iter().enumerate().fold(0, |m, (e, &a)| m | ((a != 0) as u32) << e),
        }
    }

    /// One round: this thread's 8 keys from `cursor + 8 tid`, kept where the mask shows them and
    /// they lie in `begin..end`, queued after the kept keys of lower threads. Collective.
    #[inline(always)]
    fn round(&mut self, b: &DecodeBlock, sm: &Smem, tid: u32) {
        let key0 = self.cursor + 8 * tid;
        let shown = self.shown(tid);
        let below = |k: u32| if k <= key0 { 0 } else { (1u32 << (k - key0).min(8)) - 1 };
        let kept = shown & below(b.end) & !below(b.begin);
        self.cursor += DECODE_SCAN_KEYS;
        // The next round's mask, in flight while this one is queued.
        self.ahead = Self::load(self.mask, self.cursor, b.end, tid);
        let (before, total) = block_scan::<THREADS>(kept.count_ones(), tid, sm.sums);
        let (mut at, mut rest) = (self.tail + before, kept);
        while rest != 0 {
            unsafe { st_shared_u32(sm.kv.entry(at), key0 + rest.trailing_zeros()) };
            at += 1;
            rest &= rest - 1;
        }
        self.tail += total;
    }

    /// Scans until a tile's keys are queued or the keys run out, then takes the next tile:
    /// its first queue entry and key count (0: none left). Collective; ends with a barrier
    /// after which the tile's entries are readable.
    #[inline(always)]
    fn next_tile(&mut self, b: &DecodeBlock, sm: &Smem, tid: u32) -> (u32, u32) {
        while self.tail - self.head < BN as u32 && self.cursor < b.end {
            self.round(b, sm, tid);
        }
        sync_threads();
        let (first, count) = (self.head, (self.tail - self.head).min(BN as u32));
        self.head += count;
        (first, count)
    }
}

/// Starts copying the K and V rows of the tile of `count` keys from queue entry `first` into
/// slot `slot`; rows from `count` on are zero-filled. Collective. Paged K/V: the tile's pages
/// are looked up first, a key a thread, into shared memory (a thread's rows looked up in turn
/// would each wait for the table before their copies: 16 trips to L2 a tile, K's and V's),
/// then a barrier.
#[inline(always)]
unsafe fn load_kv<const PAGED: bool, const KT: usize>(b: &DecodeBlock, sm: &Smem, slot: u32, first: u32, count: u32, tid: u32) {
    let p = b.p;
    if PAGED {
        if tid < count {
            unsafe { st_shared_u32(sm.pages + 4 * tid, b.seq.page_of(p, sm.kv.key_at(first + tid))) };
        }
        // The previous tile's copies were all issued before the barrier that ended the scan.
        sync_threads();
    }
    // A tile of 64 rows of `16 KT` elements is `128 KT` 16-byte chunks: `KT` passes of the
    // CTA's 128 threads.
    const { assert!(BN == 64 && THREADS == 128) };
    let at = |c: u32| (sm.kv.key_at(first + c), if PAGED { unsafe { ld_shared_u32(sm.pages + 4 * c) } } else { 0 });
    let rows = |(key, page): (u32, u32)| (b.kv_row::<PAGED>(&p.k, key, page), b.kv_row::<PAGED>(&p.v, key, page));
    unsafe { sm.kv.load_async::<KT, _>(slot, count, tid, THREADS, at, rows) };
}

/// This thread's bias value of the tile (threads below 64, one key each; 0 past `count`), read
/// into a register: stored by [`store_bias`] a tile later, before the tile's own barrier.
#[inline(always)]
unsafe fn load_bias(b: &DecodeBlock, sm: &Smem, mods: &Mods, first: u32, count: u32, tid: u32) -> u32 {
    if !mods.bias || tid >= count {
        return 0;
    }
    let key = sm.kv.key_at(first + tid) as u64;
    unsafe { ld_global_nc_u16(b.bias_row() + 2 * key * b.p.bias.stride[3]) }
}

#[inline(always)]
unsafe fn store_bias(sm: &Smem, mods: &Mods, slot: u32, v: u32, tid: u32) {
    if mods.bias && tid < BN as u32 {
        unsafe { st_shared_u16(sm.bias(slot).chunk(0, tid / 8) + 2 * (tid % 8), v) };
    }
}

/// The key tile in slot `slot`: `count` queued keys from queue entry `first`; `check`: some row
/// may not see all of them.
struct Tile {
    slot: u32,
    first: u32,
    count: u32,
    check: bool,
}

/// One warp's products over its share of the tile ([`WarpShare`]: `8 NTW` keys from `key0`):
/// scores, the online softmax, `o += P V`.
#[inline(always)]
unsafe fn tile_products<E: Elem, const NTW: usize, const KT: usize, const DT: usize>(
    b: &DecodeBlock,
    sm: &Smem,
    mods: &Mods,
    softmax: &mut OnlineSoftmax<1>,
    o: &mut [[[f32; 4]; DT]; 1],
    ws: &WarpShare,
    tile: &Tile,
    lane: u32,
) {
    let (g, t) = (lane / 4, lane % 4);
    let band = if tile.check { b.rows_bits::<NTW>(sm, tile.first, tile.count, ws.key0, ws.row0 + g, t) } else { [[!0u32; 2]] };
    let warp = WarpScores::new::<NTW>(sm.bias(tile.slot), false, 0, 0, ws.row0, ws.key0 / 8, lane);
    let mut s = [[[0f32; 4]; NTW]; 1];
    warp.init::<E, 1, NTW>(&mut s, mods, &band, tile.check, false);
    let (k, v) = (sm.kv.k(tile.slot), sm.kv.v(tile.slot));
    // The warp's keys are tile rows `key0..`: the K and V fragments start there.
    let (q_frag, k_frag, v_frag) = (Fragments::new(sm.q, lane), Fragments::new(k, lane).offset(ws.key0, 0), Fragments::new(v, lane).offset(ws.key0, 0));
    unsafe { scores_product::<E, 1, NTW, KT, false>(&mut s, sm.q, k, q_frag, k_frag, ws.row0) };
    let scale = if mods.softcap > 0.0 {
        warp.to_logits::<E, 1, NTW>(&mut s, mods);
        1.0
    } else {
        mods.scale_log2
    };
    softmax.update_rescaling(&mut s, scale, o);
    unsafe { pv_product::<E, 1, NTW, DT, false>(o, &s, v, v_frag) };
}

/// Merges the key shares of each row group ([`WarpShare`]) into share 0's warp: the others'
/// outputs go through shared memory (over the K and V slots, free once every warp is past its
/// last tile), their softmax states are where they are. Collective.
#[inline(always)]
unsafe fn merge_shares<const DT: usize>(b: &DecodeBlock, sm: &Smem, softmax: &mut OnlineSoftmax<1>, o: &mut [[[f32; 4]; DT]; 1], ws: &WarpShare, tid: u32) {
    let lane = tid % 32;
    // Value `i` of warp `w`'s thread `lane`: 32 lanes' values consecutive, conflict-free.
    let at = |w: u32, i: usize| sm.kv.k(0).base + 4 * ((w * 4 * DT as u32 + i as u32) * 32 + lane);
    let live = ws.row0 < b.rows;
    sync_threads();
    if live && ws.share != 0 {
        for dt in 0..DT {
            for i in 0..4 {
                unsafe { st_shared_u32(at(tid / 32, 4 * dt + i), o[0][dt][i].to_bits()) };
            }
        }
    }
    sync_threads();
    if live && ws.share == 0 {
        for share in 1..ws.shares {
            let w = tid / 32 + share;
            let other = OnlineSoftmax::<1>::at(sm.softmax, tid + 32 * share, THREADS);
            softmax.merge(&other, o, |_, dt, i| f32::from_bits(unsafe { ld_shared_u32(at(w, 4 * dt + i)) }));
        }
    }
}

/// The decoding forward (`dmattn_decode_<elem>_d<dim>[_paged]`): head dim `D`, `KT = D / 16`
/// k-steps, `DT = D / 8` output n-tiles; `PAGED`: K and V are pages (`dmattn_abi::Seqs`).
#[inline(always)]
pub unsafe fn decode<E: Elem, const D: usize, const KT: usize, const DT: usize, const PAGED: bool>(dp: &DecodeParams) {
    const { assert!(KT * 16 == D && DT * 8 == D) };
    let p = &dp.fwd;
    let sm = Smem::new(D);
    let tid = thread_idx();
    let b = DecodeBlock::new(dp);
    if b.rows == 0 {
        return;
    }
    // The mask is the queue's business; the tiles hold only kept keys.
    let mods = Mods { mask: false, ..Mods::of(p, modifiers::ALL) };
    let mut softmax = OnlineSoftmax::<1>::at(sm.softmax, tid, THREADS);
    softmax.reset();
    let mut o = [[[0f32; 4]; DT]; 1];
    let lane = tid % 32;
    let (g, t) = (lane / 4, lane % 4);
    let ws = WarpShare::of(b.rows, tid / 32, D);

    let mut scan = Scan::new(dp, &b, D as u32 <= DECODE_MASK_BYTES_DIMS, tid);
    let (mut first, mut count) = scan.next_tile(&b, &sm, tid);
    let visited = count > 0;
    if visited {
        // The tile's bias value, stored into its slot only when that tile is next: a scattered
        // read from DRAM outlasts a tile's products (H100 ncu, the masked decode batch: 6 % of
        // the warps' stall samples were a store of the next tile's bias waiting for its load).
        unsafe {
            sm.q.load_rows_async(|r| b.q_row(&p.q, r, 0), b.rows, tid, THREADS);
            load_kv::<PAGED, KT>(&b, &sm, 0, first, count, tid);
        }
        let mut bias = unsafe { load_bias(&b, &sm, &mods, first, count, tid) };
        cp_async_commit();
        let mut slot = 0;
        loop {
            // The next tile's keys, and its K and V on their way while this one is computed.
            let (next_first, next_count) = scan.next_tile(&b, &sm, tid);
            let mut next_bias = 0;
            if next_count > 0 {
                unsafe {
                    load_kv::<PAGED, KT>(&b, &sm, slot ^ 1, next_first, next_count, tid);
                    next_bias = load_bias(&b, &sm, &mods, next_first, next_count, tid);
                }
                cp_async_commit();
                cp_async_wait_group::<1>();
            } else {
                cp_async_wait_all();
            }
            // This slot's bias row was last read by the tile two before this one, past the
            // barriers since.
            unsafe { store_bias(&sm, &mods, slot, bias, tid) };
            // This tile's K and V (and bias) have landed for everyone.
            sync_threads();

            // A warp whose rows are all past the sequence's has nothing to compute: its MMAs
            // would only hold up the warps that do.
            if ws.row0 < b.rows {
                let last = sm.kv.key_at(first + count - 1);
                let check = count < BN as u32 || sm.kv.key_at(first) < b.lo_max || last >= b.hi_min;
                let tile = Tile { slot, first, count, check };
                unsafe {
                    match ws.shares {
                        4 => tile_products::<E, { NT / 4 }, KT, DT>(&b, &sm, &mods, &mut softmax, &mut o, &ws, &tile, lane),
                        2 => tile_products::<E, { NT / 2 }, KT, DT>(&b, &sm, &mods, &mut softmax, &mut o, &ws, &tile, lane),
                        _ => tile_products::<E, NT, KT, DT>(&b, &sm, &mods, &mut softmax, &mut o, &ws, &tile, lane),
                    }
                }
            }
            if next_count == 0 {
                break;
            }
            (first, count, slot, bias) = (next_first, next_count, slot ^ 1, next_bias);
        }
    }

    // Epilogue: each row group's O rows (its share-0 warp's, once the shares are merged) through
    // its own rows of the Q tile, then stored row by row. A row with nothing visible gets O = 0
    // and LSE = -inf; a split that saw no key writes its LSE alone (the combine never reads the
    // O of such a split).
    if ws.shares > 1 {
        unsafe { merge_shares::<DT>(&b, &sm, &mut softmax, &mut o, &ws, tid) };
    }
    let (inv, lse) = softmax.finish();
    let keeps = ws.share == 0;
    for h in 0..2 {
        let r = ws.row0 + 8 * h as u32 + g;
        if keeps && t == 0 && r < b.rows {
            unsafe { *(p.lse as *mut f32).add(b.lse_index(r) as usize) = lse[0][h] };
        }
    }
    if !visited && p.splits > 1 {
        return;
    }
    // Every lane is past its last read of the Q tile (another lane's `ldmatrix` may have read
    // what this one writes: racecheck asks for the order).
    sync_threads();
    let o_at = sm.q.chunk(g, 0) + 4 * t;
    if keeps {
        for h in 0..2 {
            let dr = ws.row0 + 8 * h as u32;
            for dt in 0..DT {
                let v = &o[0][dt];
                unsafe { st_shared_u32(sm.q.shift(o_at, dr, dt as u32), E::pack(v[2 * h] * inv[0][h], v[2 * h + 1] * inv[0][h])) };
            }
        }
    }
    sync_threads();
    let split = b.split as u64 * p.o_split_stride;
    unsafe { sm.q.store_rows(|r| b.q_row(&p.o, r, split), b.rows, tid, THREADS) };
}
