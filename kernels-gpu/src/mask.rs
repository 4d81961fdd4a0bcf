//! The one piece of mask logic: which key tiles a query tile visits, which of those need
//! element-wise masking, and whether one score is visible. Forward, backward and the tile-skip
//! decision all read it.
use crate::arch::{ballot, cp_async_8, ld_global_nc_u8, ld_shared_u32, st_shared_v2};
use dmattn_abi::{BLOCK_MAP_K, BLOCK_MAP_Q, Band, FwdParams, View4, block_class};

/// The parametric rule and sequence bounds of one (batch, head), [`Band`]'s: key `j` is visible
/// to query `i` iff `j < sk`, `j <= D(i) + right`, and `j >= D(i) - left` or `j < sinks`, where
/// `D(i)` is the query's diagonal key. `D` never decreases along the queries, so each query
/// tile's visible keys are the sink tiles and one interval of tiles, and each key tile's queries
/// one interval of query tiles.
#[derive(Clone, Copy)]
pub struct Visibility {
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub band: Band,
}

/// The key tiles a query tile may see: the sink tiles `0..sinks`, then `begin..end`.
#[derive(Clone, Copy)]
pub struct KeyTiles {
    pub sinks: u32,
    pub begin: u32,
    pub end: u32,
}

impl KeyTiles {
    #[inline(always)]
    pub fn contains(&self, t: u32) -> bool {
        t < self.end && (t < self.sinks || t >= self.begin)
    }

    /// The first tile at or after `n` that may be visible (jumping the gap after the sinks).
    #[inline(always)]
    pub fn next_candidate(&self, n: u32) -> u32 {
        if n >= self.sinks && n < self.begin { self.begin } else { n }
    }
}

/// Keeps an `i64` tile-bound term in a range where the per-score tests' small shifts cannot
/// overflow `i32` (the terms compare against offsets within one tile).
#[inline(always)]
fn clamp_i32(x: i64) -> i32 {
    x.clamp(-(1 << 30), 1 << 30) as i32
}

impl Visibility {
    /// The problem's bounds and band.
    #[inline(always)]
    pub fn of(p: &FwdParams) -> Self {
        Self::new(p.seqlen_q, p.seqlen_k, p.band)
    }

    /// [`Visibility::of`] in a kernel compiled with `BAND`; without it the kernel serves only
    /// bands that are none or causal (the host's choice), and the band's other terms are
    /// constants, so that their code folds away (the backward's tiles are at the register limit).
    #[inline(always)]
    pub fn of_band<const BAND: bool>(p: &FwdParams) -> Self {
        if BAND { Self::of(p) } else { Self::new(p.seqlen_q, p.seqlen_k, Band { right: p.band.right, ..Band::ALL }) }
    }

    #[inline(always)]
    pub fn new(seqlen_q: u32, seqlen_k: u32, band: Band) -> Self {
        Visibility { seqlen_q, seqlen_k, band }
    }

    /// `D(i)`, query `i`'s diagonal key.
    #[inline(always)]
    fn diagonal(&self, i: u32) -> i64 {
        match self.band.compress {
            0 => i as i64 + self.seqlen_k as i64 - self.seqlen_q as i64,
            c => (i / c) as i64,
        }
    }

    /// Rows `i` with `D(i) < x`, which are the first ones: the first row with `D(i) >= x`.
    #[inline(always)]
    fn rows_below(&self, x: i64) -> u32 {
        let first = match self.band.compress {
            0 => x - (self.seqlen_k as i64 - self.seqlen_q as i64),
            c => x.saturating_mul(c as i64),
        };
        first.clamp(0, self.seqlen_q as i64) as u32
    }

    /// Keys `0..sinks` exempt from the left edge (none without one).
    #[inline(always)]
    fn sink_keys(&self) -> u32 {
        if self.band.left == Band::NONE { 0 } else { self.band.sinks.min(self.seqlen_k) }
    }

    /// Row `i`'s band without the sinks: keys `lo..hi`.
    #[inline(always)]
    pub fn row_keys(&self, i: u32) -> (u32, u32) {
        let (b, sk) = (&self.band, self.seqlen_k as i64);
        let hi = if b.right == Band::NONE { sk } else { (self.diagonal(i) + b.right as i64 + 1).clamp(0, sk) };
        let lo = if b.left == Band::NONE { 0 } else { (self.diagonal(i) - b.left as i64).clamp(0, sk) };
        (lo as u32, hi as u32)
    }

    /// Row `i`'s sink keys: `0..sinks` (visible where also `< hi`).
    #[inline(always)]
    pub fn row_sinks(&self) -> u32 {
        self.sink_keys()
    }

    /// The key tiles of `block_n` keys that rows `[row0, row0 + rows)` may see.
    #[inline(always)]
    pub fn key_tiles(&self, row0: u32, rows: u32, block_n: u32) -> KeyTiles {
        let last = (row0 + rows).min(self.seqlen_q).max(row0 + 1) - 1;
        let (_, hi) = self.row_keys(last);
        let (lo, _) = self.row_keys(row0);
        KeyTiles { sinks: self.sink_keys().div_ceil(block_n), begin: lo / block_n, end: hi.div_ceil(block_n) }
    }

    /// The query tiles of `block_m` rows that see any of keys `[col0, ..)`: from the one holding
    /// the first row whose band reaches `col0` (`D(i) + right >= col0`) ...
    #[inline(always)]
    pub fn query_tile_begin(&self, col0: u32, block_m: u32) -> u32 {
        let b = &self.band;
        let begin = if b.right == Band::NONE { 0 } else { self.rows_below(col0 as i64 - b.right as i64) };
        begin / block_m
    }

    /// ... to the one holding the last row whose band starts at or before `last_col`
    /// (`D(i) - left <= last_col`), exclusive; every row sees sink keys.
    #[inline(always)]
    pub fn query_tile_end(&self, col0: u32, last_col: u32, block_m: u32) -> u32 {
        let b = &self.band;
        let end = if b.left == Band::NONE || col0 < self.sink_keys() {
            self.seqlen_q
        } else {
            self.rows_below(last_col as i64 + b.left as i64 + 1)
        };
        end.div_ceil(block_m)
    }

    /// Under a band bounded on both sides and not compressed (a window), at most how many query
    /// tiles of `block_m` rows see a key tile of `block_n` keys: its `block_n + left + right` rows
    /// start anywhere in a tile. `None` for other bands (their key tiles' runs differ in length).
    #[inline(always)]
    pub fn query_tile_period(&self, block_n: u32, block_m: u32) -> Option<u32> {
        let b = &self.band;
        if b.left == Band::NONE || b.right == Band::NONE || b.compress != 0 {
            return None;
        }
        let rows = block_n as u64 + b.left as u64 + b.right as u64;
        Some((rows.div_ceil(block_m as u64) + 1).min(1 << 30) as u32)
    }

    /// Whether the tile `[row0, row0 + rows) x [col0, col0 + cols)` (rows inside the sequence)
    /// has scores the band or the key bound hide, so that scores must be checked one by one.
    #[inline(always)]
    pub fn tile_needs_check(&self, row0: u32, rows: u32, col0: u32, cols: u32) -> bool {
        let b = &self.band;
        let last_col = col0 + cols - 1;
        let left_of = col0.max(self.sink_keys());
        last_col >= self.seqlen_k
            || (b.right != Band::NONE && last_col as i64 > self.diagonal(row0) + b.right as i64)
            || (b.left != Band::NONE && left_of <= last_col && (left_of as i64) < self.diagonal(row0 + rows - 1) - b.left as i64)
    }

    /// The rule restricted to the tile whose top-left score is `(row0, col0)`, in tile-local
    /// coordinates, so the per-score test is a few small-integer compares.
    #[inline(always)]
    pub fn at_tile(&self, row0: u32, col0: u32) -> TileBounds {
        let b = &self.band;
        // Uncompressed, `D(row0 + r) - (col0 + c) = base + r - c`; compressed, the row term is
        // computed per row.
        let base = if b.compress == 0 { self.diagonal(row0) - col0 as i64 } else { -(col0 as i64) };
        TileBounds {
            keys: self.seqlen_k as i32 - col0 as i32,
            sinks: clamp_i32(self.sink_keys() as i64 - col0 as i64),
            rows: i32::MAX,
            hi: if b.right == Band::NONE { i32::MAX } else { clamp_i32(base + b.right as i64) },
            lo: if b.left == Band::NONE { i32::MIN } else { clamp_i32(base - b.left as i64) },
            row: row0 as i32,
            compress: b.compress,
        }
    }
}

/// [`Visibility`] for one tile: local key `c` of local row `r` is visible iff `c < keys`,
/// `r < rows`, `c <= hi + t(r)`, and `c >= lo + t(r)` or `c < sinks`, where `t(r) = r`, or
/// `(row + r) / compress` under a compressed diagonal.
#[derive(Clone, Copy)]
pub struct TileBounds {
    keys: i32,
    sinks: i32,
    rows: i32,
    hi: i32,
    lo: i32,
    row: i32,
    compress: u32,
}

/// Where a thread's per-row visibility bits come from when its scores are initialised: its
/// [`TileBounds`], computed row by row as the accumulators are set, or those rows' bits computed
/// before (`TileBounds::rows_bits`). Which one leaves more registers free differs by kernel.
pub trait RowBits {
    /// The bits of row `dr` (`16 mt + 8 h`) of the thread's rows.
    fn bits(&self, mt: usize, h: usize) -> u32;
}

impl RowBits for TileBounds {
    #[inline(always)]
    fn bits(&self, mt: usize, h: usize) -> u32 {
        self.row_bits(16 * mt as u32 + 8 * h as u32)
    }
}

impl<const MT: usize> RowBits for [[u32; 2]; MT] {
    #[inline(always)]
    fn bits(&self, mt: usize, h: usize) -> u32 {
        self[mt][h]
    }
}

/// Bits of the thread's keys `c < limit` in accumulator order: bit `2 nt + e` stands for local
/// key `8 nt + e` (`nt < 16`).
#[inline(always)]
fn keys_below(limit: i32) -> u32 {
    let limit = limit.clamp(0, 128) as u32;
    // Keys 8nt (e = 0) are below for nt < ceil(limit / 8), keys 8nt + 1 for nt < ceil((limit - 1) / 8).
    let even = |count: u32| ((1u64 << (2 * count.min(16))) - 1) as u32 & 0x5555_5555;
    even((limit + 7) / 8) | even((limit + 6) / 8) << 1
}

impl TileBounds {
    /// The same rule with the origin moved by `(r, c)`: a thread shifts it to its own first
    /// score once, so that every per-score test compares against compile-time offsets.
    #[inline(always)]
    pub fn shifted(&self, r: u32, c: u32) -> TileBounds {
        let (r, c) = (r as i32, c as i32);
        let linear = if self.compress == 0 { r - c } else { -c };
        TileBounds {
            keys: self.keys - c,
            sinks: self.sinks - c,
            rows: self.rows.saturating_sub(r),
            // Without a right edge `hi` stays within a tile's shifts of `i32::MAX`: still no edge.
            hi: self.hi.saturating_add(linear),
            lo: if self.lo == i32::MIN { i32::MIN } else { self.lo + linear },
            row: self.row + if self.compress == 0 { 0 } else { r },
            compress: self.compress,
        }
    }

    /// Hides rows `rows..` as well (the backward must not read rows past the sequence).
    #[inline(always)]
    pub fn with_rows(&self, rows: u32) -> TileBounds {
        TileBounds { rows: rows.min(i32::MAX as u32) as i32, ..*self }
    }

    /// [`TileBounds::row_bits`] of each of a thread's rows in `MT` 16-row tiles (rows `16 mt` and
    /// `16 mt + 8`), all ones where `check` is off. Computed before the accumulators are live, so
    /// that only these `2 MT` words, not the bounds, are held beside them.
    #[inline(always)]
    pub fn rows_bits<const MT: usize>(&self, check: bool) -> [[u32; 2]; MT] {
        let mut bits = [[!0u32; 2]; MT];
        if check {
            for (mt, b) in bits.iter_mut().enumerate() {
                *b = [self.row_bits(16 * mt as u32), self.row_bits(16 * mt as u32 + 8)];
            }
        }
        bits
    }

    /// Row `r`'s band offset `t` (its row, or under compression its compressed row) and the end
    /// of its visible keys (0 past the tile's rows), which [`Self::row_bits`] and
    /// [`Self::visible`] share.
    #[inline(always)]
    fn row_edge(&self, r: u32) -> (i32, i32) {
        let t = if self.compress == 0 { r as i32 } else { ((self.row as u32 + r) / self.compress) as i32 };
        let hi = if (r as i32) < self.rows { self.keys.min(self.hi.saturating_add(t + 1)) } else { 0 };
        (t, hi)
    }

    /// Whether the score at tile-local (`r`, `c`) is visible: [`Self::row_bits`]'s rule for one
    /// score, for layouts whose thread holds a key's scores down several rows (the backward's
    /// transposed step, `bwd::transposed`).
    #[inline(always)]
    pub fn visible(&self, r: u32, c: u32) -> bool {
        let (t, hi) = self.row_edge(r);
        let c = c as i32;
        c < hi && (self.lo == i32::MIN || c >= self.lo.saturating_add(t) || c < self.sinks)
    }

    /// Row `r`'s visibility in the thread's accumulator order (see [`keys_below`]): visible keys
    /// are an interval plus the sinks, so this is a few dozen integer ops per row instead of
    /// compares per score.
    #[inline(always)]
    pub fn row_bits(&self, r: u32) -> u32 {
        let (t, hi) = self.row_edge(r);
        let below_hi = keys_below(hi);
        if self.lo == i32::MIN {
            return below_hi;
        }
        below_hi & !(keys_below(self.lo.saturating_add(t)) & !keys_below(self.sinks))
    }
}

/// Gather attention's visibility (`FwdParams::key_ranks`): the keys are a plane's kept keys,
/// ascending in their original positions, so the band shows each query row one run
/// `[lo, hi)` of them, whose ends are the ranks of the band's ends. A CTA stores its rows' runs
/// once (shared memory, a u32 pair per row); the tile range, the full-tile test and the per-score
/// bits all read them. The runs' ends never decrease along the rows.
#[derive(Clone, Copy)]
pub struct GatheredRows {
    at: u32,
    /// Rows of the tile inside the sequence (at least 1).
    rows: u32,
}

impl GatheredRows {
    /// The runs stored at shared address `at` for a tile with `rows_valid` rows in the sequence.
    #[inline(always)]
    pub fn new(at: u32, rows_valid: u32, block_m: u32) -> Self {
        Self { at, rows: rows_valid.clamp(1, block_m) }
    }

    /// Stores the runs of rows `row0..row0 + block_m` (empty past the sequence) from the plane's
    /// ranks at `ranks` (i32 per original key: kept keys at or before it). All `threads` threads
    /// call this; a barrier must follow before any reads them.
    #[inline(always)]
    pub unsafe fn store(&self, vis: &Visibility, ranks: u64, row0: u32, block_m: u32, tid: u32, threads: u32) {
        // Kept keys before original key `k`.
        let below = |k: u32| if k == 0 { 0 } else { unsafe { *((ranks + 4 * (k - 1) as u64) as *const u32) } };
        let mut r = tid;
        while r < block_m {
            let run = if r < self.rows && row0 + r < vis.seqlen_q {
                let (lo, hi) = vis.row_keys(row0 + r);
                [below(lo), below(hi)]
            } else {
                [0, 0]
            };
            unsafe { st_shared_v2(self.at + 8 * r, run) };
            r += threads;
        }
    }

    #[inline(always)]
    fn lo(&self, r: u32) -> u32 {
        unsafe { ld_shared_u32(self.at + 8 * r) }
    }

    #[inline(always)]
    fn hi(&self, r: u32) -> u32 {
        unsafe { ld_shared_u32(self.at + 8 * r + 4) }
    }

    /// Gathered keys `..end` any row sees (keys past it are never read).
    #[inline(always)]
    pub fn keys_end(&self) -> u32 {
        self.hi(self.rows - 1)
    }

    /// The key tiles of `block_n` keys holding any row's run: `begin..end`.
    #[inline(always)]
    pub fn key_tiles(&self, block_n: u32) -> (u32, u32) {
        let (lo, hi) = (self.lo(0), self.keys_end());
        if hi <= lo { (0, 0) } else { (lo / block_n, hi.div_ceil(block_n)) }
    }

    /// Whether every row sees every key of the tile `[col0, col0 + block_n)`.
    #[inline(always)]
    pub fn tile_full(&self, col0: u32, block_n: u32) -> bool {
        self.lo(self.rows - 1) <= col0 && self.hi(0) >= col0 + block_n
    }

    /// Visibility bits (in [`keys_below`]'s accumulator order) of a thread's rows `row + 16 mt`
    /// and `row + 16 mt + 8` and its keys from `col`, all ones where `check` is off.
    #[inline(always)]
    pub fn rows_bits<const MT: usize>(&self, row: u32, col: u32, check: bool) -> [[u32; 2]; MT] {
        let mut bits = [[!0u32; 2]; MT];
        if check {
            for (mt, b) in bits.iter_mut().enumerate() {
                for (h, word) in b.iter_mut().enumerate() {
                    let r = row + 16 * mt as u32 + 8 * h as u32;
                    let (lo, hi) = (self.lo(r) as i32 - col as i32, self.hi(r) as i32 - col as i32);
                    *word = keys_below(hi) & !keys_below(lo);
                }
            }
        }
        bits
    }
}

/// Classes of the tiles along one line of the block map (a query tile's key tiles, or a key
/// tile's query tiles), for [`TileCursor`]: the band's candidates, narrowed by the block map.
pub trait TileLine {
    /// The first candidate at or after `n` (jumping what the band hides); candidates end at
    /// [`TileLine::end`].
    fn next_candidate(&self, n: u32) -> u32;
    fn end(&self) -> u32;
    /// (visible at all, entirely visible) for tile `t`, `(false, false)` for a non-candidate.
    fn classify(&self, t: u32) -> (bool, bool);
}

/// The block-map rows one query tile reads: `BM / 64` rows of k-block classes.
pub struct MapRows<const BM: usize, const BN: usize> {
    /// The first row's address, or 0 without a mask.
    base: u64,
    /// Bytes between map rows (0 when the mask is broadcast over queries).
    q_stride: u64,
    /// Map rows inside the query sequence, counted from `base`.
    rows: u32,
    /// Map columns inside the key sequence.
    k_blocks: u32,
    /// The band's candidates.
    tiles: KeyTiles,
}

impl<const BM: usize, const BN: usize> MapRows<BM, BN> {
    const MAP_ROWS: u32 = (BM as u32) / BLOCK_MAP_Q;
    const MAP_COLS: u32 = (BN as u32) / BLOCK_MAP_K;

    /// The rows of query tile `m_block` in a `[q_blocks, k_blocks]` plane at `plane` with row
    /// stride `q_stride` (absent: `map.ptr == 0`).
    #[inline(always)]
    pub fn new(map: &View4, plane: u64, m_block: u32, vis: &Visibility) -> Self {
        let q_block0 = m_block * Self::MAP_ROWS;
        Self {
            base: if map.is_present() { plane + q_block0 as u64 * map.stride[2] } else { 0 },
            q_stride: map.stride[2],
            rows: vis.seqlen_q.div_ceil(BLOCK_MAP_Q).saturating_sub(q_block0).min(Self::MAP_ROWS),
            k_blocks: vis.seqlen_k.div_ceil(BLOCK_MAP_K),
            tiles: vis.key_tiles(m_block * BM as u32, BM as u32, BN as u32),
        }
    }

    /// The same line with its candidates cut at `end` (a split-KV share).
    #[inline(always)]
    pub fn until(self, end: u32) -> Self {
        Self { tiles: KeyTiles { end, ..self.tiles }, ..self }
    }

}

/// OR / AND of the classes in a rectangle of map blocks: rows `q0..q0 + rows` (row stride
/// `q_stride`), columns `k0..k0 + cols`, of the plane at `base`.
#[inline(always)]
fn classify_blocks(base: u64, q_stride: u64, q0: u32, rows: u32, k0: u32, cols: u32) -> (bool, bool) {
    let (mut any, mut all) = (false, true);
    for qi in 0..rows {
        for ki in 0..cols {
            let at = base + (q0 + qi) as u64 * q_stride + (k0 + ki) as u64;
            let class = unsafe { ld_global_nc_u8(at) } as u8;
            any |= class != block_class::EMPTY;
            all &= class == block_class::FULL;
        }
    }
    (any, all)
}

impl<const BM: usize, const BN: usize> TileLine for MapRows<BM, BN> {
    #[inline(always)]
    fn next_candidate(&self, n: u32) -> u32 {
        self.tiles.next_candidate(n)
    }

    #[inline(always)]
    fn end(&self) -> u32 {
        self.tiles.end
    }

    #[inline(always)]
    fn classify(&self, n: u32) -> (bool, bool) {
        if !self.tiles.contains(n) {
            return (false, false);
        }
        if self.base == 0 {
            return (true, true);
        }
        let k0 = n * Self::MAP_COLS;
        classify_blocks(self.base, self.q_stride, 0, self.rows, k0, Self::MAP_COLS.min(self.k_blocks - k0))
    }
}

/// The block-map columns one key tile reads: `BN / 64` columns, walked down the query tiles.
pub struct MapCols<const BM: usize, const BN: usize> {
    /// The first plane's address (0 without a mask).
    plane: u64,
    /// Planes to combine (the query heads of a kv group, when the mask has one per query
    /// head) and the distance between them.
    planes: u32,
    plane_stride: u64,
    q_stride: u64,
    /// Map rows inside the query sequence.
    q_blocks: u32,
    k0: u32,
    cols: u32,
    /// Query tiles `..end` are candidates (walks start at `Visibility::query_tile_begin`).
    end: u32,
}

impl<const BM: usize, const BN: usize> MapCols<BM, BN> {
    const MAP_ROWS: u32 = (BM as u32) / BLOCK_MAP_Q;
    const MAP_COLS: u32 = (BN as u32) / BLOCK_MAP_K;

    /// Key tile `n_block`'s columns of `planes` planes from `plane` (a tile is visited if any
    /// plane has a visible score in it, and full only if every plane is full there).
    #[inline(always)]
    pub fn new(map: &View4, plane: u64, planes: u32, n_block: u32, vis: &Visibility) -> Self {
        let k0 = n_block * Self::MAP_COLS;
        let col0 = n_block * BN as u32;
        Self {
            plane: if map.is_present() { plane } else { 0 },
            planes,
            plane_stride: map.stride[1],
            q_stride: map.stride[2],
            q_blocks: vis.seqlen_q.div_ceil(BLOCK_MAP_Q),
            k0,
            cols: Self::MAP_COLS.min(vis.seqlen_k.div_ceil(BLOCK_MAP_K) - k0),
            end: vis.query_tile_end(col0, col0 + BN as u32 - 1, BM as u32),
        }
    }
}

impl<const BM: usize, const BN: usize> TileLine for MapCols<BM, BN> {
    #[inline(always)]
    fn next_candidate(&self, n: u32) -> u32 {
        n
    }

    #[inline(always)]
    fn end(&self) -> u32 {
        self.end
    }

    /// Walks start at [`MapCols::begin`] and the cursor stops at the end, so neither needs a test.
    #[inline(always)]
    fn classify(&self, m: u32) -> (bool, bool) {
        if self.plane == 0 {
            return (true, true);
        }
        let q0 = m * Self::MAP_ROWS;
        let (mut any, mut all) = (false, true);
        for i in 0..self.planes {
            let plane = self.plane + i as u64 * self.plane_stride;
            let (a, f) = classify_blocks(plane, self.q_stride, q0, Self::MAP_ROWS.min(self.q_blocks - q0), self.k0, self.cols);
            any |= a;
            all &= f;
        }
        (any, all)
    }
}

/// The block-map plane of the first query head of `kv_head`'s group.
#[inline(always)]
pub fn block_map_plane(f: &FwdParams, batch: u32, kv_head: u32) -> u64 {
    let m = &f.block_map;
    let head = if f.mask_head_div == 1 { kv_head * f.kv_group } else { kv_head } as u64;
    m.ptr + batch as u64 * m.stride[0] + head * m.stride[1]
}

/// Planes the group's heads read: one per query head when the mask has one per query head
/// (consecutive, stride 1 head), else the group shares one.
#[inline(always)]
pub fn map_planes(f: &FwdParams) -> u32 {
    if f.mask_head_div == 1 && f.block_map.stride[1] != 0 && f.kv_group > 1 { f.kv_group } else { 1 }
}

/// Starts loading the packed mask tile of a visited kernel tile (`BM` rows x `BN / 64` words at
/// `dst`, row-major, unswizzled; `mask_bit` order), one word per row and 64x64 block. A visited
/// tile may hold empty blocks (a block mask's, over a score mask's bits that still show their
/// scores), so each word follows its block's class: copied from `bits` (the word of the tile's
/// first row and block, rows `bits_stride` words apart; a block mask without a score mask has
/// all-ones words there) unless the block is empty, zero then. `classes` is the class of the
/// tile's first block, block rows `q_stride` bytes apart; without `by_class` (a constant) every
/// word is copied (the host keeps masks with block parts from such kernels). Rows past
/// `rows_valid` are hidden and their bits and classes never read; a tile overhanging the keys
/// reads one word and one class past a row (the host pads the buffers for the last row), which
/// the key bound hides. All `threads` threads of the CTA call this.
#[inline(always)]
pub unsafe fn load_mask_tile<const BM: usize, const BN: usize>(
    dst: u32,
    bits: u64,
    bits_stride: u64,
    classes: u64,
    q_stride: u64,
    rows_valid: u32,
    by_class: bool,
    tid: u32,
    threads: u32,
) {
    let words_per_row = (BN / 64) as u32;
    for i in 0..(BM * BN / 64).div_ceil(threads as usize) as u32 {
        let w = tid + i * threads;
        let (r, word) = (w / words_per_row, w % words_per_row);
        if r < BM as u32 {
            let ok = r < rows_valid;
            let row = if ok { r } else { 0 };
            let at = bits + 8 * (row as u64 * bits_stride + word as u64);
            let shown = !by_class || unsafe { ld_global_nc_u8(classes + (row / BLOCK_MAP_Q) as u64 * q_stride + word as u64) } != block_class::EMPTY as u32;
            unsafe { cp_async_8(dst + 8 * w, at, if ok && shown { 8 } else { 0 }) };
        }
    }
}

/// Walks the non-empty key tiles of one query tile, 32 tiles per step: each lane classifies one
/// tile from the block map and a warp ballot gathers the answers, so a run of skipped tiles costs
/// one round of loads, not one per tile. Without a mask every tile is full. Holds only the
/// current window (three registers); the map rows are passed in.
pub struct TileCursor {
    window: u32,
    active: u32,
    full: u32,
}

/// A key tile to visit.
#[derive(Clone, Copy)]
pub struct Tile {
    pub n: u32,
    /// Every in-bounds score of the tile passes the user mask (no mask load or check needed).
    pub full: bool,
}

impl TileCursor {
    #[inline(always)]
    pub fn new() -> Self {
        Self { window: u32::MAX, active: 0, full: 0 }
    }

    /// The first tile at or after `n` that has any visible score, or `None` past the end
    /// (warp-collective; every warp of the CTA gets the same answer). Tiles the band hides read
    /// as empty; a walk starts at a candidate (`TileLine::next_candidate`).
    #[inline(always)]
    pub fn next(&mut self, mut n: u32, lane: u32, map: &impl TileLine) -> Option<Tile> {
        let end = map.end();
        while n < end {
            if self.window == u32::MAX || n < self.window || n >= self.window + 32 {
                self.window = n;
                let t = n + lane;
                let (any, all) = if t < end { map.classify(t) } else { (false, false) };
                self.active = ballot(any);
                self.full = ballot(all);
            }
            let bits = self.active >> (n - self.window);
            if bits != 0 {
                n += bits.trailing_zeros();
                return Some(Tile { n, full: (self.full >> (n - self.window)) & 1 != 0 });
            }
            n = self.window + 32;
        }
        None
    }

    /// The last tile before `top` (exclusive, clipped to the end) and at or after `begin` that
    /// has any visible score, or `None`: [`Self::next`] walking down (the window's bit `i` is
    /// tile `window - 1 - i`). A cursor walks one way only.
    #[inline(always)]
    pub fn prev(&mut self, top: u32, begin: u32, lane: u32, map: &impl TileLine) -> Option<Tile> {
        let mut top = top.min(map.end());
        while top > begin {
            if self.window == u32::MAX || top > self.window || top + 32 <= self.window {
                self.window = top;
                let t = top.wrapping_sub(1 + lane);
                let (any, all) = if 1 + lane <= top && t >= begin { map.classify(t) } else { (false, false) };
                self.active = ballot(any);
                self.full = ballot(all);
            }
            let bits = self.active >> (self.window - top);
            if bits != 0 {
                let n = top - 1 - bits.trailing_zeros();
                return Some(Tile { n, full: (self.full >> (self.window - 1 - n)) & 1 != 0 });
            }
            top = self.window.saturating_sub(32);
        }
        None
    }
}
