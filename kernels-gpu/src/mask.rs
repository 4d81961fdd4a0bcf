//! The one piece of mask logic: which key tiles a query tile visits, which of those need
//! element-wise masking, and whether one score is visible. Forward, backward and the tile-skip
//! decision all read it.
use crate::arch::{ballot, ld_global_nc_u8};
use dmattn_abi::{BLOCK_MAP_K, BLOCK_MAP_Q, FwdParams, View4, block_class, flags};

/// The causal rule and sequence bounds of one (batch, head): key `j` is visible to query `i` iff
/// `j < sk` and, when causal, `j <= i + sk - sq` (aligned to the bottom-right corner).
#[derive(Clone, Copy)]
pub struct Visibility {
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub causal: bool,
}

impl Visibility {
    /// The problem's bounds and causal rule.
    #[inline(always)]
    pub fn of(p: &FwdParams) -> Self {
        Visibility { seqlen_q: p.seqlen_q, seqlen_k: p.seqlen_k, causal: p.flags & flags::CAUSAL != 0 }
    }

    #[inline(always)]
    fn offset(&self) -> i64 {
        self.seqlen_k as i64 - self.seqlen_q as i64
    }

    /// Key tiles of `block_n` keys that rows `[row0, row0 + rows)` can see at all: `0..end`.
    #[inline(always)]
    pub fn key_tile_end(&self, row0: u32, rows: u32, block_n: u32) -> u32 {
        let all = self.seqlen_k.div_ceil(block_n);
        if !self.causal {
            return all;
        }
        let last_row = (row0 + rows).min(self.seqlen_q) as i64 - 1;
        let keys = (last_row + self.offset() + 1).clamp(0, self.seqlen_k as i64) as u32;
        keys.div_ceil(block_n)
    }

    /// Query tiles of `block_m` rows that key `col0` onwards can be seen from: `begin..`.
    #[inline(always)]
    pub fn query_tile_begin(&self, col0: u32, block_m: u32) -> u32 {
        if !self.causal {
            return 0;
        }
        let first_row = (col0 as i64 - self.offset()).clamp(0, self.seqlen_q as i64) as u32;
        first_row / block_m
    }

    /// Whether the tile `[row0, row0 + rows) x [col0, col0 + cols)` has scores the causal rule or
    /// the key bound hide, so that scores must be checked one by one.
    #[inline(always)]
    pub fn tile_needs_check(&self, row0: u32, col0: u32, cols: u32) -> bool {
        let last_col = col0 + cols - 1;
        last_col >= self.seqlen_k || (self.causal && last_col as i64 > row0 as i64 + self.offset())
    }

    /// The rule restricted to the tile whose top-left score is `(row0, col0)`, in tile-local
    /// coordinates, so the per-score test is two small-integer compares.
    #[inline(always)]
    pub fn at_tile(&self, row0: u32, col0: u32) -> TileBounds {
        let diagonal = if self.causal { row0 as i64 + self.offset() - col0 as i64 } else { i32::MAX as i64 };
        TileBounds {
            keys: self.seqlen_k as i32 - col0 as i32,
            diagonal: diagonal.clamp(i32::MIN as i64, i32::MAX as i64) as i32,
            rows: i32::MAX,
        }
    }
}

/// [`Visibility`] for one tile: local key `c` of local row `r` is visible iff `c < keys`,
/// `c - r <= diagonal` and `r < rows`.
#[derive(Clone, Copy)]
pub struct TileBounds {
    keys: i32,
    diagonal: i32,
    rows: i32,
}

impl TileBounds {
    /// The same rule with the origin moved by `(r, c)`: a thread shifts it to its own first
    /// score once, so that every per-score test compares against compile-time offsets.
    #[inline(always)]
    pub fn shifted(&self, r: u32, c: u32) -> TileBounds {
        TileBounds {
            keys: self.keys - c as i32,
            diagonal: self.diagonal.saturating_add(r as i32 - c as i32),
            rows: self.rows.saturating_sub(r as i32),
        }
    }

    /// Hides rows `rows..` as well (the backward must not read rows past the sequence).
    #[inline(always)]
    pub fn with_rows(&self, rows: u32) -> TileBounds {
        TileBounds { rows: rows.min(i32::MAX as u32) as i32, ..*self }
    }

    /// Row `r`'s visibility in the thread's accumulator order: bit `2 nt + e` stands for local
    /// key `8 nt + e` (a thread's keys of a row, `nt < 16`), the order of packed mask half-words.
    /// A row's visible keys are a prefix `c < limit`, so this is a dozen integer ops per row
    /// instead of compares per score.
    #[inline(always)]
    pub fn row_bits(&self, r: u32) -> u32 {
        let limit = if (r as i32) < self.rows { self.keys.min(self.diagonal.saturating_add(r as i32 + 1)) } else { 0 };
        let limit = limit.clamp(0, 128) as u32;
        // Keys 8nt (e = 0) are visible for nt < ceil(limit / 8), keys 8nt + 1 for nt < ceil((limit - 1) / 8).
        let even = |count: u32| ((1u64 << (2 * count.min(16))) - 1) as u32 & 0x5555_5555;
        even((limit + 7) / 8) | even((limit + 6) / 8) << 1
    }
}

/// Classes of the tiles along one line of the block map (a query tile's key tiles, or a key
/// tile's query tiles), for [`TileCursor`].
pub trait TileLine {
    /// Tiles `0..end` are candidates.
    fn end(&self) -> u32;
    /// (visible at all, entirely visible) for tile `t`.
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
    /// Key tiles `0..end` are candidates (the causal limit).
    end: u32,
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
            end: vis.key_tile_end(m_block * BM as u32, BM as u32, BN as u32),
        }
    }

    /// The same line with its candidates cut at `end` (a split-KV share).
    #[inline(always)]
    pub fn until(self, end: u32) -> Self {
        Self { end, ..self }
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
    fn end(&self) -> u32 {
        self.end
    }

    #[inline(always)]
    fn classify(&self, n: u32) -> (bool, bool) {
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
        Self {
            plane: if map.is_present() { plane } else { 0 },
            planes,
            plane_stride: map.stride[1],
            q_stride: map.stride[2],
            q_blocks: vis.seqlen_q.div_ceil(BLOCK_MAP_Q),
            k0,
            cols: Self::MAP_COLS.min(vis.seqlen_k.div_ceil(BLOCK_MAP_K) - k0),
            end: vis.seqlen_q.div_ceil(BM as u32),
        }
    }
}

impl<const BM: usize, const BN: usize> TileLine for MapCols<BM, BN> {
    #[inline(always)]
    fn end(&self) -> u32 {
        self.end
    }

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
    /// (warp-collective; every warp of the CTA gets the same answer).
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
}
