//! The contract between `kernels-gpu` (device) and `dmattn` (host): kernel parameter structs,
//! tile shapes and kernel names, by topic in the modules below and all re-exported here. Both
//! sides compile this one crate, so they cannot disagree.
#![no_std]

mod decode;
mod gather;
mod lists;
mod mask;
pub mod names;
mod params;
mod select;
mod tiles;

pub use decode::*;
pub use gather::*;
pub use lists::*;
pub use mask::*;
pub use params::*;
pub use select::*;
pub use tiles::*;


/// A strided 4-D view of device memory. Strides are in elements; a broadcast dimension has
/// stride 0. `ptr == 0` means "absent" for optional operands.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct View4 {
    pub ptr: u64,
    pub stride: [u64; 4],
}

impl View4 {
    pub const ABSENT: View4 = View4 { ptr: 0, stride: [0; 4] };
    pub const fn is_present(&self) -> bool {
        self.ptr != 0
    }
}

/// Flags of [`FwdParams::flags`].
pub mod flags {
    /// The bias rows can be copied with 16-byte `cp.async` (unit key stride, 16-byte aligned rows).
    pub const BIAS_VEC: u32 = 2;
    /// (Modifier variants, no work order, grid y = heads.) CTAs take their (query tile, head)
    /// heads fastest: every head's last query tile first, the heaviest under a causal band, with
    /// no ordering pass (gather attention, whose tile counts no block map holds).
    pub const HEADS_FIRST: u32 = 4;
    /// (Forward.) The bias does not vary along the queries (query stride 0): one row of it per
    /// key tile is copied, and every query row reads that row.
    pub const BIAS_ROW: u32 = 8;
}

/// The parametric part of a mask (zero storage): a band of keys around each query's diagonal key
/// `D(i)`, plus sink keys. `D(i) = i + sk - sq` (aligned to the bottom-right corner, as
/// FlashAttention's causal and `window_size`), or `floor(i / compress)` where `compress > 0` (the
/// compressed-causal rule of FlashAttention PR 2418, which has no `sk - sq` offset). Key `j` is
/// visible to query `i` iff `j < sk`, `j <= D(i) + right`, and `j >= D(i) - left` or `j < sinks`.
/// [`Band::NONE`] leaves a side unbounded; causal is `right == 0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Band {
    pub left: u32,
    pub right: u32,
    /// Keys `0..sinks` are exempt from the left edge (not from the right one).
    pub sinks: u32,
    /// 0: the bottom-right diagonal; `c > 0`: `D(i) = floor(i / c)`.
    pub compress: u32,
}

impl Band {
    /// Whether the band needs a backward kernel compiled for any band (`names::BAND_SUFFIX`):
    /// it has a left edge (and so maybe sinks) or a compressed diagonal.
    pub const fn needs_band_kernel(&self) -> bool {
        self.left != Band::NONE || self.compress != 0
    }

    /// Whether a backward may split a key tile's query tiles among CTAs: each then sees a
    /// problem ending at its share's last row, with `sk - sq` kept so that the diagonal stays
    /// (`kernels-gpu`'s `seq::localize_split`). That drops keys right of the diagonal, which only
    /// a right edge on it (causal) hides; a compressed diagonal ignores the lengths, and without
    /// edges the diagonal does not matter.
    pub const fn splits_queries(&self) -> bool {
        self.compress != 0 || self.right == 0 || (self.right == Band::NONE && self.left == Band::NONE)
    }

    /// An unbounded side.
    pub const NONE: u32 = u32::MAX;
    /// Every key visible.
    pub const ALL: Band = Band { left: Band::NONE, right: Band::NONE, sinks: 0, compress: 0 };
    /// Bottom-right causal.
    pub const CAUSAL: Band = Band { right: 0, ..Band::ALL };
}

impl Default for Band {
    fn default() -> Self {
        Band::ALL
    }
}

/// Device element types of q/k/v/o (and bias) on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceElem {
    F16,
    Bf16,
}

impl DeviceElem {
    pub const fn name(self) -> &'static str {
        match self {
            DeviceElem::F16 => "f16",
            DeviceElem::Bf16 => "bf16",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ListsBand`'s words are its fields in memory order (the kernel raises them by offset, the
    /// host writes and reads them as words).
    #[test]
    fn lists_band_words_are_its_layout() {
        use core::mem::{offset_of, size_of};
        assert_eq!(size_of::<ListsBand>(), 40);
        let offsets = [
            offset_of!(ListsBand, broken),
            offset_of!(ListsBand, empty_rows),
            offset_of!(ListsBand, left_max),
            offset_of!(ListsBand, left_min_neg),
            offset_of!(ListsBand, right_max),
            offset_of!(ListsBand, right_min_neg),
            offset_of!(ListsBand, clipped_left_diag),
            offset_of!(ListsBand, clipped_right_diag_neg),
            offset_of!(ListsBand, last_row),
            offset_of!(ListsBand, first_row_neg),
        ];
        assert_eq!(offsets, core::array::from_fn(|i| 4 * i));
        let b = ListsBand { broken: 1, empty_rows: 2, left_max: 3, left_min_neg: -4, right_max: 5, right_min_neg: 6, clipped_left_diag: 7, clipped_right_diag_neg: 8, last_row: 9, first_row_neg: 10 };
        assert_eq!(b.to_words(), [1, 2, 3, -4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(ListsBand::from_words(b.to_words()), b);
    }

    /// A packed batch's sequences start in dQ's blocked accumulator at multiples of 16, each
    /// past the previous one's rows rounded up to 16, all within `dq_blocked_rows`: over every
    /// run of lengths 0-40 (the rounding's cases) of up to four sequences, from every offset.
    #[test]
    fn blocked_dq_rows_never_overlap() {
        for n in 1..=4u32 {
            for code in 0..41u32.pow(n) {
                let lens = [0, 1, 2, 3].map(|i| code / 41u32.pow(i) % 41);
                let (mut q0, mut end) = (0, 0);
                for (s, len) in lens[..n as usize].iter().enumerate() {
                    let row = dq_blocked_row(q0, s as u32);
                    assert!(row % DQ_GROUP_ROWS == 0 && row >= end, "{lens:?}");
                    end = row + len.div_ceil(DQ_GROUP_ROWS) * DQ_GROUP_ROWS;
                    q0 += len;
                }
                assert!(end as u64 <= dq_blocked_rows(q0 as u64, n as u64), "{lens:?}");
            }
        }
    }

    /// The Hopper forward tiles with modifiers have the portable ones' shapes (the work-order
    /// kernels, built once per head dim, count tiles of that shape; the lean variant is never
    /// ordered or split), a warpgroup per 64 rows, and fit the shared memory of one CTA. The lean
    /// ones are warp-specialised: two or three consumer warpgroups and the producer.
    #[test]
    fn hopper_forward_tiles_match_the_portable_shapes() {
        for v in FWD_TILES_SM90 {
            let p = fwd_variants(v.mods.head_dim).unwrap();
            for (h, t) in [(v.mods, p.mods), (v.plain.unwrap(), p.plain.unwrap())].into_iter().chain(v.gather_narrow.zip(p.gather_narrow)) {
                assert!(h.wgmma && !t.wgmma);
                assert_eq!(h.head_dim, t.head_dim);
                assert!(h.producer || (h.block_m, h.block_n) == (t.block_m, t.block_n));
                assert_eq!((h.m_tiles_per_warp(), h.block_m % 64), (1, 0));
                assert!(h.smem_bytes() <= 227 * 1024);
            }
            let lean = v.plain.unwrap();
            assert!(lean.producer && !lean.modifiers && !v.mods.producer);
            // The fixed-length modifier kernel, where warp-specialised: the modifier tile's query
            // rows (its work order); its keys split in its own tiles.
            if let Some(ws) = v.mods_ws {
                assert!(ws.producer && ws.modifiers && !ws.mask_only && ws.ws_bias_ring() && ws.smem_bytes() <= 227 * 1024);
                assert_eq!((ws.head_dim, ws.block_m, ws.threads()), (v.mods.head_dim, v.mods.block_m, FWD_WS_THREADS));
            }
            // The mask-only kernel: the modifier tile's query rows (its work order), no bias ring.
            if let Some(ws) = v.mask_ws {
                assert!(ws.producer && ws.modifiers && ws.mask_only && ws.smem_bytes() <= 227 * 1024);
                assert_eq!((ws.head_dim, ws.block_m, ws.threads()), (v.mods.head_dim, v.mods.block_m, FWD_WS_THREADS));
            }
            assert!(matches!(lean.block_m, 128 | 192) && lean.threads() == fwd_ws_lean_threads(lean.head_dim));
            // The registers each CTA is launched with: ptxas's per-thread share (65536 / threads,
            // rounded down to 8); `setmaxnreg.inc` waits forever for more than that.
            let packed = fwd_ws_packed_tile(&v).unwrap();
            assert_eq!((packed.block_m, packed.block_n, packed.threads()), (128, lean.block_n, FWD_WS_THREADS));
            for t in [Some(lean), Some(packed), v.mods_ws, v.mask_ws].into_iter().flatten() {
                let pool = t.threads() * (65536 / t.threads() / 8 * 8);
                // The paged and modifier kernels' big producer: two consumer warpgroups only.
                for big in [false, t.warps == 8] {
                    let (producer, consumer) = t.ws_registers(big);
                    assert!(t.consumer_threads() * consumer + 128 * producer <= pool, "{t:?}");
                }
            }
            assert_eq!(fwd_variants_for(v.mods.head_dim, true), Some(v));
            assert_eq!(fwd_variants_for(v.mods.head_dim, false), Some(p));
        }
        assert_eq!(fwd_variants_for(96, true), fwd_variants(96));
        assert!(fwd_variants_for(128, true).unwrap().mods_ws.is_some() && !fwd_sm90_two_cta_mods(128));
        assert!(fwd_variants_for(64, true).unwrap().mods_ws.is_some() && fwd_sm90_two_cta_mods(64));
    }

    /// Every warp-specialised forward kernel has launch bounds of its tile's threads and one CTA
    /// an SM: without them ptxas gives it more registers than a CTA of its threads can have (a
    /// d64 mask-only kernel tried without them, branch wip-d64-mask-ws, took 182 a thread, and
    /// its launches failed for lack of resources).
    #[test]
    fn warp_specialised_forwards_have_launch_bounds() {
        extern crate std;
        for v in FWD_TILES_SM90 {
            let d = v.mods.head_dim;
            let mods_ws = if fwd_sm90_two_cta_mods(d) { "_mods_ws" } else { "_mods" };
            let ws = [("", v.plain), (mods_ws, v.mods_ws), ("_mask", v.mask_ws)];
            for (suffix, tile) in ws.into_iter().filter_map(|(s, t)| t.map(|t| (s, t))) {
                for elem in ["bf16", "f16"] {
                    let name = std::format!("{}{elem}_d{d}{suffix}", names::FWD_WGMMA_PREFIX);
                    let bounds = LAUNCH_BOUNDS.iter().find(|(n, _, _)| *n == name);
                    assert_eq!(bounds.map(|&(_, threads, ctas)| (threads, ctas)), Some((tile.threads(), 1)), "{name}");
                }
            }
        }
    }

    #[test]
    fn block_class_of_any_and_all() {
        assert_eq!(block_class::of(false, false), block_class::EMPTY);
        assert_eq!(block_class::of(false, true), block_class::EMPTY);
        assert_eq!(block_class::of(true, false), block_class::PARTIAL);
        assert_eq!(block_class::of(true, true), block_class::FULL);
    }

    #[test]
    fn positions_unpack_to_what_was_packed() {
        for (x, y, z) in [(0, 0, 0), (1, 2, 3), (u32::MAX, 0xffff, 0xffff), (7, 0xffff, 0), (0, 0, 0xffff)] {
            assert_eq!(unpacked_position(packed_position(x, y, z)), (x, y, z));
        }
    }

    #[test]
    fn mask_word_byte_inverts_mask_bit() {
        // Each key alone, and a few mixed words, against the key-by-key packing.
        let pack = |keys: &[u32]| keys.iter().fold(0u64, |w, &k| w | 1 << mask_bit(k));
        for k in 0..MASK_WORD_KEYS {
            for nt in 0..8 {
                let want = if k / 8 == nt { 1 << (k % 8) } else { 0 };
                assert_eq!(mask_word_byte(pack(&[k]), nt), want, "key {k}, n8 tile {nt}");
            }
        }
        let keys = [0, 3, 9, 10, 17, 31, 32, 45, 46, 47, 60, 63];
        for nt in 0..8 {
            let want = keys.iter().filter(|&&k| k / 8 == nt).fold(0, |b, &k| b | 1 << (k % 8));
            assert_eq!(mask_word_byte(pack(&keys), nt), want);
        }
    }

    #[test]
    fn mask_word_of_bits_moves_each_key_to_its_mask_bit() {
        for k in 0..MASK_WORD_KEYS {
            assert_eq!(mask_word_of_bits(1 << k), 1 << mask_bit(k), "key {k}");
        }
        // Mixed words: the moves are a permutation, so each word's bits move independently.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..64 {
            x = x.rotate_left(17) ^ x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            let want = (0..MASK_WORD_KEYS).fold(0u64, |w, k| w | ((x >> k) & 1) << mask_bit(k));
            assert_eq!(mask_word_of_bits(x), want, "{x:016x}");
        }
    }

    #[test]
    fn mask_bits_of_bytes_matches_mask_bit_key_by_key() {
        // Every byte value in every position, at every key offset of a word.
        for k in (0..MASK_WORD_KEYS).step_by(4) {
            for pos in 0..4 {
                for byte in 0..=255u32 {
                    let filler = [0u32, 0x01, 0xff][(byte % 3) as usize];
                    let bytes: [u32; 4] = core::array::from_fn(|i| if i == pos { byte } else { (filler + i as u32) & 0xff });
                    let x = bytes.iter().enumerate().fold(0, |x, (i, b)| x | b << (8 * i));
                    let want = (0..4).fold(0u64, |w, i| w | ((bytes[i] != 0) as u64) << mask_bit(k + i as u32));
                    assert_eq!(mask_bits_of_bytes(x, k), want, "k {k} bytes {bytes:02x?}");
                }
            }
        }
    }
}
