//! Per-query index lists (`dmattn_abi::ListsParams`): each row's keys laid out once, ascending,
//! without padding or repeats (`lists_from_bits`, off the bit mask the lists describe), then a forward in which each warp is one query and the
//! query heads sharing its list (its 16 MMA rows). The warp scans its sorted list, queues the
//! keys the band shows its query, and takes the next [`LISTS_KEYS`] of them as a key tile: K and
//! V rows copied by index into its own slots (two, the next tile's copies in flight while this
//! one is computed), the bias read at the same keys. Warps never wait for each other.
use crate::arch::*;
use crate::elem::Elem;
use crate::gemm::{pv_product, scores_product};
use crate::mask::Visibility;
use crate::scores::{LOG2E, capped_logit};
use crate::seq::Seq;
use crate::softmax::OnlineSoftmax;
use crate::tile::{Fragments, GatheredKv, SmemTile};
use dmattn_abi::{LISTS_BITS_THREADS, LISTS_KEYS, LISTS_QUEUE, LISTS_ROWS, LISTS_WARPS, ListBitsParams, ListsParams, View4, lists_warp_bytes, modifiers};

const BN: usize = LISTS_KEYS as usize;
const NT: usize = BN / 8;
// The ring holds fewer than a tile's keys waiting, a round's 32, and the tile whose entries the
// copies read (the first tile's are read after the next scan has started).
const _: () = assert!(LISTS_QUEUE.is_power_of_two() && LISTS_QUEUE >= 2 * LISTS_KEYS + 31 && BN % 16 == 0);

/// Grid `(rows, ph, pb)`: one row of the lists' bit mask as its keys in order, a word a thread
/// and `LISTS_BITS_THREADS` words a round: each round's keys placed in shared memory after the
/// lower threads' (a block scan), then copied out in consecutive 4-byte stores (threads writing
/// their own runs straight to global memory left the stores scattered: the pass was L2-bound at
/// a quarter of its bytes' speed). Then -1 to the row's end, and the count.
#[inline(always)]
pub unsafe fn lists_from_bits(p: &ListBitsParams) {
    const T: u32 = LISTS_BITS_THREADS;
    let tid = thread_idx();
    let (row, h, b) = block_idx();
    let line = (b as u64 * grid_dim_y() as u64 + h as u64) * grid_dim_x() as u64 + row as u64;
    let src = p.bits + 4 * line * p.row_words as u64;
    let out = (p.out + 4 * line * p.width as u64) as *mut i32;
    let (keys, sums) = (smem_base(), smem_base() + 4 * 32 * T);
    let mut written = 0;
    let mut w0 = 0;
    while w0 < p.row_words {
        let w = w0 + tid;
        let mut bits = if w < p.row_words { unsafe { ld_global_nc_u32(src + 4 * w as u64) } } else { 0 };
        let (mut at, total) = block_scan::<T>(bits.count_ones(), tid, sums);
        while bits != 0 {
            unsafe { st_shared_u32(keys + 4 * at, 32 * w + bits.trailing_zeros()) };
            at += 1;
            bits &= bits - 1;
        }
        sync_threads();
        let mut e = tid;
        while e < total {
            unsafe { *out.add((written + e) as usize) = ld_shared_u32(keys + 4 * e) as i32 };
            e += T;
        }
        // The keys are copied out before the next round's keys overwrite them.
        sync_threads();
        written += total;
        w0 += T;
    }
    let mut e = written + tid;
    while e < p.width {
        unsafe { *out.add(e as usize) = -1 };
        e += T;
    }
    if tid == 0 {
        unsafe { *(p.counts as *mut u32).add(line as usize) = written };
    }
}

/// One warp's shared memory: its Q tile, two slots of K and V tiles, its queue of listed keys
/// and its online softmax's state.
#[derive(Clone, Copy)]
struct Smem {
    q: SmemTile,
    kv: GatheredKv,
    softmax: u32,
    d: usize,
}

impl Smem {
    #[inline(always)]
    fn new(d: usize, warp: u32) -> Self {
        let base = smem_base() + warp * lists_warp_bytes(d as u32);
        let q = SmemTile::new(base, LISTS_ROWS as usize, d * 2);
        let kv_base = base + q.bytes();
        let queue = kv_base + 4 * (BN * d * 2) as u32;
        Self { q, kv: GatheredKv::new(kv_base, BN, d * 2, queue, LISTS_QUEUE), softmax: queue + 4 * LISTS_QUEUE, d }
    }
}

/// One warp's problem: its query, the query heads it takes (its rows), its sorted list and the
/// keys the band shows the query.
#[derive(Clone, Copy)]
struct ListRow<'a> {
    p: &'a ListsParams,
    seq: Seq,
    i: u32,
    kv_head: u32,
    head0: u32,
    rows: u32,
    /// Byte address of the query's sorted list, and its length.
    list: u64,
    count: u32,
    /// Keys `lo..hi` and `0..sinks` (below `hi`) are visible to the query.
    lo: u32,
    hi: u32,
    sinks: u32,
}

impl<'a> ListRow<'a> {
    #[inline(always)]
    fn new(lp: &'a ListsParams, i: u32) -> Self {
        let p = &lp.fwd;
        let (_, y, z) = block_idx();
        let seq = Seq::of::<false>(p, z);
        let kv_head = div(y, lp.units);
        let unit = y - kv_head * lp.units;
        let head0 = kv_head * p.kv_group + unit * lp.rows;
        let rows = lp.rows.min(p.kv_group - unit * lp.rows);
        let (l, c) = (&lp.lists, &lp.counts);
        let plane = div(head0, lp.list_head_div) as u64;
        let line = |s: &[u64; 4]| seq.batch * s[0] + plane * s[1] + i as u64 * s[2];
        let count = unsafe { ld_global_nc_u32(c.ptr + 4 * line(&c.stride)) };
        let vis = Visibility::new(p.seqlen_q, p.seqlen_k, p.band);
        let (lo, hi) = vis.row_keys(i);
        ListRow { p: lp, seq, i, kv_head, head0, rows, list: l.ptr + 4 * line(&l.stride), count, lo, hi, sinks: vis.row_sinks() }
    }

    #[inline(always)]
    fn visible(&self, key: u32) -> bool {
        key < self.hi && (key >= self.lo || key < self.sinks)
    }

    /// Byte address of key `j`'s row in k or v (`t`).
    #[inline(always)]
    fn kv_row(&self, t: &View4, j: u32) -> u64 {
        t.ptr + 2 * (self.seq.k_offset(&t.stride, j) + self.kv_head as u64 * t.stride[2])
    }

    /// Byte address of row `r`'s (head `head0 + r`) query in q or output row in o.
    #[inline(always)]
    fn q_row(&self, t: &View4, r: u32) -> u64 {
        t.ptr + 2 * (self.seq.q_offset(&t.stride, self.i) + (self.head0 + r) as u64 * t.stride[2])
    }

    /// Byte address of row `r`'s bias at key 0 (keys `stride[3]` elements apart).
    #[inline(always)]
    fn bias_row(&self, r: u32) -> u64 {
        let b = &self.p.fwd.bias;
        let plane = div(self.head0 + r, self.p.fwd.bias_head_div) as u64;
        b.ptr + 2 * (self.seq.batch * b.stride[0] + plane * b.stride[1] + self.i as u64 * b.stride[2])
    }
}

/// Rounds of list entries each lane has loaded ahead of the scan: a round's keys are in
/// registers when it starts, not a trip to memory away.
const AHEAD: usize = 2;

/// The scan's place in the list: queue entries `head..tail` are visible keys not yet in a tile;
/// list entries from `cursor` are not scanned yet, `ahead[k]` being this lane's of the round
/// `k` rounds on. Every lane holds the same counts.
struct Scan {
    head: u32,
    tail: u32,
    cursor: u32,
    ahead: [u32; AHEAD],
}

impl Scan {
    #[inline(always)]
    fn new(r: &ListRow, lane: u32) -> Self {
        let mut ahead = [0; AHEAD];
        for (k, e) in ahead.iter_mut().enumerate() {
            *e = Self::load(r, 32 * k as u32, lane);
        }
        Scan { head: 0, tail: 0, cursor: 0, ahead }
    }

    #[inline(always)]
    fn load(r: &ListRow, cursor: u32, lane: u32) -> u32 {
        let e = cursor + lane;
        if e < r.count { unsafe { ld_global_nc_u32(r.list + 4 * e as u64) } } else { u32::MAX }
    }

    /// One round: the lanes' 32 entries, queued in order where the band shows them. The list
    /// is sorted, so once an entry reaches the band's end nothing after it is visible.
    #[inline(always)]
    fn round(&mut self, r: &ListRow, sm: &Smem, lane: u32) {
        let key = self.ahead[0];
        let valid = self.cursor + lane < r.count;
        let shown = ballot(valid && r.visible(key));
        let done = ballot(!valid || key >= r.hi) != 0;
        self.cursor = if done { r.count } else { self.cursor + 32 };
        for k in 0..AHEAD - 1 {
            self.ahead[k] = self.ahead[k + 1];
        }
        self.ahead[AHEAD - 1] = Self::load(r, self.cursor + 32 * (AHEAD as u32 - 1), lane);
        if (shown >> lane) & 1 != 0 {
            unsafe { st_shared_u32(sm.kv.entry(self.tail + (shown & ((1 << lane) - 1)).count_ones()), key) };
        }
        self.tail += shown.count_ones();
    }

    /// Scans until a tile's keys are queued or the list runs out, then takes the next tile: its
    /// first queue entry and key count (0: none left). Ends with the queue's entries readable by
    /// the whole warp.
    #[inline(always)]
    fn next_tile(&mut self, r: &ListRow, sm: &Smem, lane: u32) -> (u32, u32) {
        while self.tail - self.head < BN as u32 && self.cursor < r.count {
            self.round(r, sm, lane);
        }
        sync_warp();
        let (first, count) = (self.head, (self.tail - self.head).min(BN as u32));
        self.head += count;
        (first, count)
    }
}

/// Starts copying the K and V rows of the tile of `count` keys from queue entry `first` into
/// slot `slot` (rows from `count` on zero-filled), and returns this lane's bias values of the
/// tile, read into registers now so that they land while the tile before is computed: pairs of
/// its keys `8 nt + 2 t + e` for rows `g` and `g + 8`.
#[inline(always)]
unsafe fn load_tile(r: &ListRow, sm: &Smem, slot: u32, first: u32, count: u32, bias: bool, lane: u32) -> [[u32; NT]; 2] {
    let p = &r.p.fwd;
    // Each 16-byte chunk of a K row and the same chunk of its V row, one key read for both (the
    // V tile sits two tiles after the K tile). Rows past `count` are zero-filled from key `first`
    // (a zero-byte copy reads nothing, but its address must be valid).
    let (k, per_row) = (sm.kv.k(slot), (sm.d * 2 / 16) as u32);
    let (k_at, v_at) = (r.kv_row(&p.k, 0), r.kv_row(&p.v, 0));
    let (k_step, v_step) = (2 * p.k.stride[1], 2 * p.v.stride[1]);
    for pass in 0..(BN as u32 * per_row).div_ceil(32) {
        let i = lane + 32 * pass;
        let (row, c) = (i / per_row, i % per_row);
        if i < BN as u32 * per_row {
            let ok = row < count;
            let key = sm.kv.key_at(first + if ok { row } else { 0 }) as u64;
            let (dst, bytes) = (k.chunk(row, c), if ok { 16 } else { 0 });
            unsafe {
                cp_async_16(dst, k_at + key * k_step + 16 * c as u64, bytes);
                cp_async_16(dst + 2 * sm.kv.tile_bytes(), v_at + key * v_step + 16 * c as u64, bytes);
            }
        }
    }
    cp_async_commit();
    let mut out = [[0u32; NT]; 2];
    if bias {
        let (g, t) = (lane / 4, lane % 4);
        for h in 0..2 {
            let row = g + 8 * h as u32;
            if row < r.rows {
                let base = r.bias_row(row);
                for nt in 0..NT {
                    for e in 0..2 {
                        let c = 8 * nt as u32 + 2 * t + e;
                        if c < count {
                            let key = sm.kv.key_at(first + c) as u64;
                            out[h][nt] |= unsafe { ld_global_nc_u16(base + 2 * key * p.bias.stride[3]) } << (16 * e);
                        }
                    }
                }
            }
        }
    }
    out
}

/// The forward over per-query lists (`dmattn_lists_fwd_<elem>_d<dim>[_mods]`): head dim `D`, `KT
/// = D / 16` k-steps, `DT = D / 8` output n-tiles; `MODS` [`modifiers::ALL`] reads the bias and
/// softcap, [`modifiers::NONE`] neither (its registers leave room for a fifth CTA an SM).
#[inline(always)]
pub unsafe fn lists_fwd<E: Elem, const D: usize, const KT: usize, const DT: usize, const MODS: u8>(lp: &ListsParams) {
    const { assert!(KT * 16 == D && DT * 8 == D && (MODS == modifiers::NONE || MODS == modifiers::ALL)) };
    let p = &lp.fwd;
    let tid = thread_idx();
    let (warp, lane) = (tid / 32, tid % 32);
    let i = block_idx().0 * LISTS_WARPS + warp;
    if i >= p.seqlen_q {
        return;
    }
    let sm = Smem::new(D, warp);
    let r = ListRow::new(lp, i);
    let bias = MODS == modifiers::ALL && p.bias.is_present();
    let softcap = if MODS == modifiers::ALL { p.softcap } else { 0.0 };
    let mut softmax = OnlineSoftmax::<1>::at(sm.softmax, lane, 32);
    softmax.reset();
    let mut o = [[[0f32; 4]; DT]; 1];
    let (g, t) = (lane / 4, lane % 4);

    // Without a softcap the bias is folded into the products' start values.
    let fold = bias && softcap == 0.0;
    let inv_scale = LOG2E * rcp(p.scale_log2);

    let mut scan = Scan::new(&r, lane);
    let (first, mut count) = scan.next_tile(&r, &sm, lane);
    if count > 0 {
        unsafe { sm.q.load_rows_async(|row| r.q_row(&p.q, row), r.rows, lane, 32) };
        let mut tile_bias = unsafe { load_tile(&r, &sm, 0, first, count, bias, lane) };
        let mut slot = 0;
        loop {
            let (next_first, next_count) = scan.next_tile(&r, &sm, lane);
            let mut next_bias = [[0u32; NT]; 2];
            if next_count > 0 {
                next_bias = unsafe { load_tile(&r, &sm, slot ^ 1, next_first, next_count, bias, lane) };
                cp_async_wait_group::<1>();
            } else {
                cp_async_wait_all();
            }
            // This tile's K and V have landed for the whole warp.
            sync_warp();

            // Start values: -inf past the tile's keys, the bias (over the scale, so that the
            // scaled sum is the logit) where it is folded in, else 0.
            let mut s = [[[0f32; 4]; NT]; 1];
            for h in 0..2 {
                for nt in 0..NT {
                    let pair = E::unpack(tile_bias[h][nt]);
                    for e in 0..2 {
                        let c = 8 * nt as u32 + 2 * t + e as u32;
                        let b = if e == 0 { pair.0 } else { pair.1 };
                        s[0][nt][2 * h + e] = if c >= count { f32::NEG_INFINITY } else if fold { b * inv_scale } else { 0.0 };
                    }
                }
            }
            let (k, v) = (sm.kv.k(slot), sm.kv.v(slot));
            let (q_frag, k_frag, v_frag) = (Fragments::new(sm.q, lane), Fragments::new(k, lane), Fragments::new(v, lane));
            unsafe { scores_product::<E, 1, NT, KT, false>(&mut s, sm.q, k, q_frag, k_frag, 0) };
            let scale = if softcap > 0.0 {
                let pre = p.scale_log2 * rcp(LOG2E * softcap);
                for h in 0..2 {
                    for nt in 0..NT {
                        let pair = E::unpack(tile_bias[h][nt]);
                        for e in 0..2 {
                            let b = if !bias { 0.0 } else if e == 0 { pair.0 } else { pair.1 };
                            s[0][nt][2 * h + e] = capped_logit(s[0][nt][2 * h + e], pre, softcap, b).0;
                        }
                    }
                }
                1.0
            } else {
                p.scale_log2
            };
            softmax.update_rescaling(&mut s, scale, &mut o);
            unsafe { pv_product::<E, 1, NT, DT, false>(&mut o, &s, v, v_frag) };
            // Every lane is past its reads of this slot before the next tile's copies into it.
            sync_warp();
            if next_count == 0 {
                break;
            }
            (count, slot, tile_bias) = (next_count, slot ^ 1, next_bias);
        }
    }

    // Epilogue: each lane's pairs of its rows' outputs straight to global memory (a quad
    // writes 16 contiguous bytes); a row with nothing visible gets O = 0 and LSE = -inf.
    let (inv, lse) = softmax.finish();
    for h in 0..2 {
        let row = g + 8 * h as u32;
        if row < r.rows {
            if t == 0 {
                unsafe { *(p.lse as *mut f32).add(r.seq.lse_index(p, r.head0 + row, i) as usize) = lse[0][h] };
            }
            let out = r.q_row(&p.o, row) + 4 * t as u64;
            for dt in 0..DT {
                let v = &o[0][dt];
                unsafe { *((out + 16 * dt as u64) as *mut u32) = E::pack(v[2 * h] * inv[0][h], v[2 * h + 1] * inv[0][h]) };
            }
        }
    }
}
