//! Shared-memory tiles: a bank-conflict-free layout, global↔shared copies through it, and the
//! MMA-fragment loads out of it.
use crate::arch::*;

/// `rows` rows of `row_bytes` bytes in shared memory. Rows are split into column blocks of 128
/// bytes (64 when the row is not a multiple of 128), each block stored as its own row-major
/// `rows x block` array, and within a block the 16-byte chunks of row `r` are XOR-swizzled by `r`.
/// Eight consecutive rows at one logical chunk then land in eight different bank groups, so
/// `ldmatrix` (8 rows x 16 B) and fragment-wise accesses are conflict-free.
///
/// The shape is plain data rather than const generics so that derived sizes (`D * 2`) need no
/// const-generic arithmetic; kernels build tiles from constants and everything inlines, so the
/// address math folds to shifts and masks. Tile bases must be 128-byte aligned.
#[derive(Clone, Copy)]
pub struct SmemTile {
    pub base: u32,
    rows: u32,
    row_bytes: u32,
}

impl SmemTile {
    #[inline(always)]
    pub fn new(base: u32, rows: usize, row_bytes: usize) -> Self {
        Self { base, rows: rows as u32, row_bytes: row_bytes as u32 }
    }

    #[inline(always)]
    pub fn bytes(&self) -> u32 {
        self.rows * self.row_bytes
    }

    #[inline(always)]
    fn block(&self) -> u32 {
        if self.row_bytes % 128 == 0 { 128 } else { 64 }
    }

    #[inline(always)]
    fn chunks_per_block(&self) -> u32 {
        self.block() / 16
    }

    /// Shared address of 16-byte chunk `c` of row `r`.
    #[inline(always)]
    pub fn chunk(&self, r: u32, c: u32) -> u32 {
        let (block, per_block) = (self.block(), self.chunks_per_block());
        let swizzle = if block == 128 { r & 7 } else { (r >> 1) & 3 };
        self.base + (c / per_block) * (self.rows * block) + r * block + (((c % per_block) ^ swizzle) << 4)
    }

    /// wgmma descriptor (sm_90a) of this tile as a K-major operand: the product's M (or N) rows
    /// are the tile's rows from `r0` (a multiple of 8), its k16 step the tile's columns
    /// `16 ks..16 ks + 16`. The column blocks are wgmma's 128-byte-swizzle atoms (8 rows x 128
    /// bytes, 1024 apart): the step's 32 bytes lie inside one, and moving within an atom is an
    /// offset of the start address, which the hardware swizzles like the stored data (tile bases
    /// are 1024-byte aligned).
    #[inline(always)]
    pub fn wgmma_k_major(&self, r0: u32, ks: u32) -> u64 {
        // Row `r0` is unswizzled (r0 % 8 == 0), so step `ks` is a fixed offset from step 0.
        let per_block = self.chunks_per_block();
        let step = (2 * ks / per_block) * (self.rows * self.block()) + ((2 * ks % per_block) << 4);
        wgmma_desc(self.chunk(r0, 0), step, 16, 1024)
    }

    /// wgmma descriptor of this tile as an M- or N-major operand: the product's k16 step is the
    /// tile's rows `16 ks..16 ks + 16`, its M (or N) columns the tile's columns from chunk `c0`.
    /// The next 64 columns are the next column block (the leading-dimension offset), the next 8
    /// rows the next atom (the stride offset).
    #[inline(always)]
    pub fn wgmma_mn_major(&self, ks: u32, c0: u32) -> u64 {
        wgmma_desc(self.chunk(0, c0), 16 * ks * self.block(), self.rows * 128, 1024)
    }

    /// `addr` (a `chunk` address, plus a byte offset below 16) moved down `rows` rows and right
    /// `chunks` chunks, without redoing the swizzle: `rows` must be a multiple of 8 (the swizzle
    /// period), and the in-block bits of `chunks` must be disjoint from those of the chunk `addr`
    /// points at, so that XOR-ing them in is the same as adding. Fragment loops use this to turn
    /// one per-thread address into all the others with an add and a xor by constants.
    #[inline(always)]
    pub fn shift(&self, addr: u32, rows: u32, chunks: u32) -> u32 {
        let (block, per_block) = (self.block(), self.chunks_per_block());
        (addr + rows * block + (chunks / per_block) * (self.rows * block)) ^ ((chunks % per_block) << 4)
    }

    /// Calls `f(row, chunk, shared address)` for each 16-byte chunk this thread moves when
    /// `threads` threads move the whole tile, consecutive threads taking consecutive chunks of a
    /// row (coalesced on the global side).
    #[inline(always)]
    fn for_each_chunk(&self, tid: u32, threads: u32, mut f: impl FnMut(u32, u32, u32)) {
        let per_row = self.row_bytes / 16;
        let chunks = self.rows * per_row;
        let rows_per_pass = threads / per_row;
        if threads % per_row == 0 && rows_per_pass % 8 == 0 {
            // Each thread keeps its chunk column; passes move by whole swizzle periods.
            let (r, c) = (tid / per_row, tid % per_row);
            let addr = self.chunk(r, c);
            for pass in 0..chunks.div_ceil(threads) {
                let dr = pass * rows_per_pass;
                if chunks % threads == 0 || r + dr < self.rows {
                    f(r + dr, c, self.shift(addr, dr, 0));
                }
            }
        } else {
            for pass in 0..chunks.div_ceil(threads) {
                let i = tid + pass * threads;
                if chunks % threads == 0 || i < chunks {
                    let (r, c) = (i / per_row, i % per_row);
                    f(r, c, self.chunk(r, c));
                }
            }
        }
    }

    /// Starts an asynchronous copy of the tile whose row `r` begins at byte address
    /// `src + r * row_stride`. Rows at or past `rows_valid`, and bytes of a row at or past
    /// `bytes_valid`, are zero-filled and never read. All `threads` threads of the CTA call this.
    /// `src` and `row_stride` must be multiples of 16, `bytes_valid` even.
    #[inline(always)]
    pub unsafe fn load_async(
        &self,
        src: u64,
        row_stride: u64,
        rows_valid: u32,
        bytes_valid: u32,
        tid: u32,
        threads: u32,
    ) {
        // Offsets inside one tile fit in 32 bits (rows x stride is at most a few MB), which
        // halves the registers the address arithmetic holds.
        let row_stride = row_stride as u32;
        self.for_each_chunk(tid, threads, |r, c, dst| {
            let start = c * 16;
            let bytes = if r < rows_valid && start < bytes_valid { (bytes_valid - start).min(16) } else { 0 };
            // A zero-byte copy reads nothing, but its address must still be valid: use row 0.
            let row = if bytes > 0 { r } else { 0 };
            // A partial chunk is copied below.
            if bytes == 16 || bytes == 0 {
                unsafe { cp_async_16(dst, src + (row * row_stride + start) as u64, bytes) };
            }
        });
        if bytes_valid % 16 != 0 && bytes_valid < self.row_bytes {
            // Each row's partial last chunk (a bias row of keys not a multiple of 8), element by
            // element: memcheck counts a `cp.async` as reading all 16 bytes whatever its source
            // size, past the end of an allocation the row ends. A compact loop, as it is rare.
            let start = bytes_valid & !15;
            let mut r = opaque(tid);
            while r < self.rows.min(rows_valid) {
                let (at, dst) = (src + (r * row_stride + start) as u64, self.chunk(r, start / 16));
                for e in 0..8 {
                    let v = if 2 * e < bytes_valid - start { unsafe { ld_global_nc_u16(at + 2 * e as u64) } } else { 0 };
                    unsafe { st_shared_u16(dst + 2 * e, v) };
                }
                r += threads;
            }
        }
    }

    /// [`Self::load_async`] with a path of its own for a whole tile (the common case): no bounds
    /// to test or sizes to zero-fill, so that a copy costs its source's step and itself (the
    /// tests cost several instructions a copy, in producers that issue thousands a tile: the d64
    /// modifier forward's producer spent ~15 a bias copy). The step is hidden from the
    /// optimiser, which would otherwise hoist every copy's offset out of the caller's loop (a
    /// register each), as would the thread's place without `opaque`. The two paths need more
    /// registers than one: for callers with registers to spare (the warp-specialised producers;
    /// kernels whose threads all copy spilled with it).
    #[inline(always)]
    pub unsafe fn load_async_fast(
        &self,
        src: u64,
        row_stride: u64,
        rows_valid: u32,
        bytes_valid: u32,
        tid: u32,
        threads: u32,
    ) {
        let tid = opaque(tid);
        let (per_row, whole) = (self.row_bytes / 16, rows_valid >= self.rows && bytes_valid >= self.row_bytes);
        let rows_per_pass = threads / per_row;
        if whole && threads % per_row == 0 && rows_per_pass % 8 == 0 && self.rows % rows_per_pass == 0 {
            let (row_stride, (r, c)) = (row_stride as u32, (tid / per_row, tid % per_row));
            let (mut at, dst) = (src + (r * row_stride + 16 * c) as u64, self.chunk(r, c));
            for pass in 0..self.rows / rows_per_pass {
                unsafe { cp_async_16(self.shift(dst, pass * rows_per_pass, 0), at, 16) };
                at += opaque(rows_per_pass * row_stride) as u64;
            }
        } else {
            unsafe { self.load_async(src, row_stride, rows_valid, bytes_valid, tid, threads) };
        }
    }

    /// Starts an asynchronous copy of row 0 alone from `src` (16-byte aligned); bytes at or past
    /// `bytes_valid` (even) are zero-filled. The other rows are left as they are. All threads
    /// call this.
    #[inline(always)]
    pub unsafe fn load_first_row_async(&self, src: u64, bytes_valid: u32, tid: u32) {
        let start = 16 * tid;
        if start < self.row_bytes {
            let bytes = bytes_valid.saturating_sub(start).min(16);
            let dst = self.chunk(0, tid);
            if bytes == 16 || bytes == 0 {
                // A zero-byte copy reads nothing, but its address must still be valid: the row's.
                unsafe { cp_async_16(dst, src + if bytes > 0 { start as u64 } else { 0 }, bytes) };
            } else {
                // Element by element: memcheck counts a `cp.async` as reading all 16 bytes.
                for e in 0..8 {
                    let v = if 2 * e < bytes { unsafe { ld_global_nc_u16(src + (start + 2 * e) as u64) } } else { 0 };
                    unsafe { st_shared_u16(dst + 2 * e, v) };
                }
            }
        }
    }

    /// Starts an asynchronous copy of whole rows gathered from anywhere: row `r` from byte
    /// address `row_src(r)` (16-byte aligned). Rows at or past `rows_valid` (at least 1) are
    /// zero-filled and never read. All `threads` threads of the CTA call this.
    #[inline(always)]
    pub unsafe fn load_rows_async(&self, row_src: impl Fn(u32) -> u64, rows_valid: u32, tid: u32, threads: u32) {
        self.for_each_chunk(tid, threads, |r, c, dst| {
            // A zero-byte copy reads nothing, but its address must still be valid: use row 0's.
            let ok = r < rows_valid;
            unsafe { cp_async_16(dst, row_src(if ok { r } else { 0 }) + 16 * c as u64, if ok { 16 } else { 0 }) };
        });
    }

    /// Stores rows `0..rows_valid` of the tile to global memory, row `r` at `dst + r * row_stride`
    /// (16-byte aligned), 16 bytes per thread per step.
    #[inline(always)]
    pub unsafe fn store(&self, dst: u64, row_stride: u64, rows_valid: u32, tid: u32, threads: u32) {
        unsafe { self.store_rows(|r| dst + r as u64 * row_stride, rows_valid, tid, threads) };
    }

    /// Stores rows `0..rows_valid` of the tile to anywhere: row `r` at byte address `row_dst(r)`
    /// (16-byte aligned). All `threads` threads of the CTA call this.
    #[inline(always)]
    pub unsafe fn store_rows(&self, row_dst: impl Fn(u32) -> u64, rows_valid: u32, tid: u32, threads: u32) {
        self.for_each_chunk(tid, threads, |r, c, src| {
            if r < rows_valid {
                unsafe { st_global_v4(row_dst(r) + 16 * c as u64, ld_shared_v4(src)) };
            }
        });
    }

    /// Synchronous copy of a tile of `elem_bytes`-byte elements (1 or 2) with arbitrary element
    /// strides: the fallback for operands `load_async` cannot take (broadcast or unaligned keys).
    /// Element `(r, j)` is read from `src + (r * row_stride + j * col_stride) * elem_bytes`;
    /// out-of-range elements are stored as zero.
    #[inline(always)]
    pub unsafe fn load_strided(
        &self,
        elem_bytes: u32,
        src: u64,
        row_stride: u64,
        col_stride: u64,
        rows_valid: u32,
        cols_valid: u32,
        tid: u32,
        threads: u32,
    ) {
        let cols = self.row_bytes / elem_bytes;
        let elems = self.rows * cols;
        // A rare path: keep it a compact loop rather than dozens of unrolled copies.
        let mut i = opaque(tid);
        while i < elems {
            let (r, j) = (i / cols, i % cols);
            let ok = r < rows_valid && j < cols_valid;
            let at = src + (r as u64 * row_stride + j as u64 * col_stride) * elem_bytes as u64;
            let dst = self.chunk(r, (j * elem_bytes) >> 4) + ((j * elem_bytes) & 15);
            unsafe {
                if elem_bytes == 1 {
                    st_shared_u8(dst, if ok { ld_global_nc_u8(at) } else { 0 });
                } else {
                    st_shared_u16(dst, if ok { ld_global_nc_u16(at) } else { 0 });
                }
            }
            i += threads;
        }
    }
}

/// A wgmma shared-memory matrix descriptor in the 128-byte swizzle mode: start address `addr`
/// moved `offset` bytes (a multiple of 16, inside the tile), leading- and stride-dimension byte
/// offsets, each stored in units of 16 bytes. Every shared address fits the 14-bit start field
/// (bits 4-17), so the offset is added to the field itself: a product's k-steps then share one
/// conversion of their tile's address and add a constant each (converting each step's address
/// cost five instructions a `wgmma` in the backward). The lower word alone: a 64-bit addition
/// spilled the d128 backward's bias kernel.
#[inline(always)]
fn wgmma_desc(addr: u32, offset: u32, leading: u32, stride: u32) -> u64 {
    let lo = (((addr & 0x3_ffff) >> 4) | ((leading >> 4) << 16)) + (offset >> 4);
    ((((stride >> 4) | (1 << 30)) as u64) << 32) | lo as u64
}

/// A thread's `ldmatrix` row addresses in one tile, from which every fragment of the tile is
/// one [`SmemTile::shift`] away.
#[derive(Clone, Copy)]
pub struct Fragments {
    tile: SmemTile,
    /// A operand, 16 rows x 16 columns: lanes 0-15 rows 0-15 of chunk 0, lanes 16-31 of chunk 1.
    a: u32,
    /// B operand of a row-major `[n][k]` tile, two n8 tiles: lane `l` gives matrix `l / 8`
    /// (n rows `0-7 | 0-7 | 8-15 | 8-15`, chunks `0 | 1 | 0 | 1`).
    b: u32,
    /// B operand of a `[k][n]` tile read transposed: k rows `0-7 | 8-15 | 0-7 | 8-15`, chunks
    /// `0 | 0 | 1 | 1`.
    bt: u32,
}

impl Fragments {
    #[inline(always)]
    pub fn new(tile: SmemTile, lane: u32) -> Self {
        Self {
            tile,
            a: tile.chunk(lane & 15, lane >> 4),
            b: tile.chunk((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1),
            bt: tile.chunk((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4),
        }
    }

    /// The same fragments with their origin moved `rows` rows down and `chunks` chunks right: a
    /// warp's share of the tile, so that its fragment offsets are compile-time constants (an
    /// immediate offset or a xor each, no address arithmetic per load). As in
    /// [`SmemTile::shift`], `rows` is a multiple of 8, and `chunks` a multiple of a power of two
    /// (at least 2) that exceeds every chunk offset later passed to these fragments.
    #[inline(always)]
    pub fn offset(self, rows: u32, chunks: u32) -> Self {
        let t = self.tile;
        Self { tile: t, a: t.shift(self.a, rows, chunks), b: t.shift(self.b, rows, chunks), bt: t.shift(self.bt, rows, chunks) }
    }

    /// A fragment at rows `r0..r0 + 16` (`r0` a multiple of 16), columns `16 ks..16 ks + 16`.
    #[inline(always)]
    pub unsafe fn a(&self, r0: u32, ks: u32) -> [u32; 4] {
        unsafe { ldmatrix_x4(self.tile.shift(self.a, r0, 2 * ks)) }
    }

    /// `[b0, b1]` of n8 tile `n0 / 8` then of the next, k-step `ks` (`n0` a multiple of 16).
    #[inline(always)]
    pub unsafe fn b(&self, n0: u32, ks: u32) -> [u32; 4] {
        unsafe { ldmatrix_x4(self.tile.shift(self.b, n0, 2 * ks)) }
    }

    /// A fragment of the transpose of this `[k][m]` tile: rows (this tile's columns) at chunk
    /// `c0` (even, 16 columns), columns (this tile's rows) `k0..k0 + 16`. Same addresses as
    /// [`Fragments::b`], read through the transposing `ldmatrix`.
    #[inline(always)]
    pub unsafe fn a_trans(&self, k0: u32, c0: u32) -> [u32; 4] {
        unsafe { ldmatrix_x4_trans(self.tile.shift(self.b, k0, c0)) }
    }

    /// Transposed: k rows `k0..k0 + 16`, `[b0, b1]` of the n8 tile at chunk `c0` (even) then
    /// `c0 + 1`.
    #[inline(always)]
    pub unsafe fn b_trans(&self, k0: u32, c0: u32) -> [u32; 4] {
        unsafe { ldmatrix_x4_trans(self.tile.shift(self.bt, k0, c0)) }
    }
}

/// The double buffer of kernels whose key tiles are gathered by position (decoding, per-query
/// lists): two slots of K and V tiles of `rows` rows (K0, K1, V0, V1 from `base`) and a ring of
/// u32 key positions (`queue`, `capacity` entries, a power of two) indexed by a running count.
#[derive(Clone, Copy)]
pub struct GatheredKv {
    base: u32,
    rows: usize,
    row_bytes: usize,
    queue: u32,
    queue_mask: u32,
}

impl GatheredKv {
    #[inline(always)]
    pub fn new(base: u32, rows: usize, row_bytes: usize, queue: u32, capacity: u32) -> Self {
        GatheredKv { base, rows, row_bytes, queue, queue_mask: capacity - 1 }
    }

    /// Bytes of one tile (the four tiles take four times this).
    #[inline(always)]
    pub fn tile_bytes(&self) -> u32 {
        (self.rows * self.row_bytes) as u32
    }

    #[inline(always)]
    pub fn k(&self, slot: u32) -> SmemTile {
        SmemTile::new(self.base + slot * self.tile_bytes(), self.rows, self.row_bytes)
    }

    #[inline(always)]
    pub fn v(&self, slot: u32) -> SmemTile {
        SmemTile::new(self.base + (2 + slot) * self.tile_bytes(), self.rows, self.row_bytes)
    }

    /// Queue entry `i` (a running count; the queue wraps).
    #[inline(always)]
    pub fn entry(&self, i: u32) -> u32 {
        self.queue + 4 * (i & self.queue_mask)
    }

    #[inline(always)]
    pub fn key_at(&self, i: u32) -> u32 {
        unsafe { ld_shared_u32(self.entry(i)) }
    }

    /// Starts copying the K and V rows of slot `slot`'s tile of `count` keys: tile row `c` is
    /// the key `at(c)` names, read from `rows(at(c))` (its K and V rows' byte addresses); rows
    /// from `count` on are zero-filled (row 0's address: a zero-byte copy reads nothing, but its
    /// address must be valid). `threads` threads take the tile's 16-byte chunks in `P` passes
    /// (`P * threads` = the chunks of a row times `rows`), a K chunk and the same V chunk each.
    /// A thread reads the `at` of four passes before their copies: the queue reads are shared
    /// loads kept in order with the copies, and one each before its row's copies held each
    /// copy up for its load (a quarter of the decoding kernel's stall samples, H200 ncu). Four
    /// at a time, not all; and one at a time past eight passes (d192, d256), whose 96-128 O
    /// accumulators a thread leave no registers for more.
    #[inline(always)]
    pub unsafe fn load_async<const P: usize, T: Copy + Default>(&self, slot: u32, count: u32, tid: u32, threads: u32, at: impl Fn(u32) -> T, rows: impl Fn(T) -> (u64, u64)) {
        const GROUP: usize = 4;
        let group = if P > 8 { 1 } else { GROUP };
        let per_row = (self.row_bytes / 16) as u32;
        let (k, v) = (self.k(slot), self.v(slot));
        for p0 in (0..P.div_ceil(group)).map(|g| g * group) {
            // Pass `p0 + i`'s chunk: row and 16-byte column of the tile.
            let chunk = |i: usize| {
                let n = tid + (p0 + i) as u32 * threads;
                (n / per_row, n % per_row)
            };
            let named: [T; GROUP] = core::array::from_fn(|i| if i < group && p0 + i < P { at(if chunk(i).0 < count { chunk(i).0 } else { 0 }) } else { T::default() });
            for (i, &key) in named.iter().enumerate() {
                if i < group && p0 + i < P {
                    let (r, c) = chunk(i);
                    let (k_row, v_row) = rows(key);
                    let bytes = if r < count { 16 } else { 0 };
                    unsafe {
                        cp_async_16(k.chunk(r, c), k_row + 16 * c as u64, bytes);
                        cp_async_16(v.chunk(r, c), v_row + 16 * c as u64, bytes);
                    }
                }
            }
        }
    }
}
