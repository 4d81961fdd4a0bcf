//! A packed batch's forward work order, computed on the host from the sequence lengths: its
//! grid spans the longest sequence's query tiles for every sequence, and run in grid order the
//! last sequences' CTAs are the tail. Ordered heaviest first (the key tiles each query tile
//! visits, from the band), the light ones fill the gaps at the end; tiles past a sequence's
//! end (which return at once) go last. Built once per (lengths, tile, heads, band) and kept
//! with the [`SeqLens`].
use crate::device::CudaDevice;
use crate::error::Result;
use crate::memory::DeviceBuffer;
use crate::seqlens::SeqLens;
use crate::sparse::band_tiles;
use dmattn_abi::{Band, packed_position};
use std::sync::Arc;

/// Key tiles of `block_n` keys that query rows `row0..row0 + rows` of a `len_q x len_k`
/// sequence visit under `band` (the sink tiles, then the band's: [`band_tiles`]).
fn visited_tiles(band: &Band, len_q: usize, len_k: usize, row0: usize, rows: usize, block_n: usize) -> usize {
    let (sinks, tiles) = band_tiles(band, len_q, len_k, row0, rows, block_n);
    sinks + tiles.len()
}

/// The work of grid position `x` (query tile `grid_x - 1 - x`) of sequence `z`: one more than
/// the key tiles it visits (even a tile that sees no key writes its rows), 0 past the
/// sequence's end (the CTA returns at once).
fn tile_work(seqs: &SeqLens, band: &Band, block_m: u32, block_n: u32, grid_x: u32, x: u32, z: usize) -> usize {
    let (q, k) = seqs.rows(z);
    let row0 = (grid_x - 1 - x) as usize * block_m as usize;
    if row0 < q.len() { 1 + visited_tiles(band, q.len(), k.len(), row0, (q.len() - row0).min(block_m as usize), block_n as usize) } else { 0 }
}

/// The forward grid `(grid_x, heads, batch)`'s CTAs, heaviest first ([`tile_work`]), as the
/// kernels' `FwdParams::order` holds them: a `packed_position` per CTA. Equal work keeps grid
/// order (a tile's heads side by side, sharing their kv head's K and V in L2).
pub(crate) fn order(seqs: &SeqLens, band: &Band, heads: u32, block_m: u32, block_n: u32, grid_x: u32) -> Vec<u64> {
    let mut ctas: Vec<(usize, u64)> = Vec::with_capacity(grid_x as usize * heads as usize * seqs.batch());
    for z in 0..seqs.batch() {
        // Every head of a tile has its work.
        let work: Vec<usize> = (0..grid_x).map(|x| tile_work(seqs, band, block_m, block_n, grid_x, x, z)).collect();
        for head in 0..heads {
            ctas.extend(work.iter().zip(0..grid_x).map(|(&w, x)| (w, packed_position(x, head, z as u32))));
        }
    }
    // Linear block index order is x fastest, then heads, then sequences: as pushed.
    heaviest_first(ctas)
}

/// The positions of `ctas` (work, `packed_position`), pushed in linear block index order,
/// sorted by work, most first; equal work keeps the pushed order (a stable sort).
fn heaviest_first(mut ctas: Vec<(usize, u64)>) -> Vec<u64> {
    ctas.sort_by_key(|&(work, _)| std::cmp::Reverse(work));
    ctas.into_iter().map(|(_, at)| at).collect()
}

/// The decoding grid `(kv_heads, splits, batch)`'s CTAs (`split_keys` keys a split), heaviest
/// first, as the decoding kernel's `FwdParams::order` holds them. A CTA's work is one more than
/// the keys of its split that some query of its sequence sees (a mask keeps a share of them the
/// host does not know; it is taken to keep the same share everywhere); 0 for a sequence without
/// queries (the CTA returns at once). Run in grid order, the batch's last sequences' full splits
/// were the tail: H100, the masked decode batch of 64 sequences over 1K-64K keys, modelled as
/// 12 % past perfectly even work in grid order against 3 % heaviest first.
pub(crate) fn decode_order(seqs: &SeqLens, band: &Band, kv_heads: u32, splits: u32, split_keys: u32) -> Vec<u64> {
    let mut ctas: Vec<(usize, u64)> = Vec::with_capacity(kv_heads as usize * splits as usize * seqs.batch());
    for z in 0..seqs.batch() {
        let (q, k) = seqs.rows(z);
        // The keys some query sees: the band's span in 1-key tiles (the decoding kernel takes
        // no sinks).
        let (_, keys) = band_tiles(band, q.len(), k.len(), 0, q.len().max(1), 1);
        for split in 0..splits {
            let begin = (split as usize * split_keys as usize).max(keys.start);
            let end = ((split as usize + 1) * split_keys as usize).min(keys.end);
            let work = if q.is_empty() { 0 } else { 1 + end.saturating_sub(begin) };
            ctas.extend((0..kv_heads).map(|x| (work, packed_position(x, split, z as u32))));
        }
    }
    // As pushed, x fastest: equal work keeps grid order (a split's kv heads side by side).
    heaviest_first(ctas)
}

/// Which work order a [`SeqLens`] keeps: a forward's tile, heads and grid, or a decoding grid's.
pub(crate) enum OrderKey {
    Forward { heads: u32, block_m: u32, block_n: u32, grid_x: u32 },
    Decode { kv_heads: u32, splits: u32, split_keys: u32 },
}

/// A work order ([`order`] or [`decode_order`]) on the device, built on first use and kept with
/// `seqs`; `None` where it is not built yet and the stream is being captured into a graph: a
/// graph would copy it from host memory the call frees, and `seqs` would keep an allocation the
/// graph owns. The kernel then takes the grid's order (the same results; its CTAs do not depend
/// on each other).
pub(crate) fn device_order(dev: &CudaDevice, seqs: &SeqLens, band: &Band, which: OrderKey, capturing: bool) -> Result<Option<Arc<DeviceBuffer>>> {
    // A decoding key starts with u32::MAX, which no head count is.
    let key = match which {
        OrderKey::Forward { heads, block_m, block_n, grid_x } => [heads, block_m, block_n, grid_x, band.left, band.right, band.sinks, band.compress],
        OrderKey::Decode { kv_heads, splits, split_keys } => [u32::MAX, kv_heads, splits, split_keys, band.left, band.right, band.sinks, band.compress],
    };
    if capturing {
        return Ok(seqs.kept_order(key));
    }
    seqs.cached_order(key, || {
        let order = match which {
            OrderKey::Forward { heads, block_m, block_n, grid_x } => order(seqs, band, heads, block_m, block_n, grid_x),
            OrderKey::Decode { kv_heads, splits, split_keys } => decode_order(seqs, band, kv_heads, splits, split_keys),
        };
        let bytes: Vec<u8> = order.iter().flat_map(|at| at.to_le_bytes()).collect();
        Ok(Arc::new(DeviceBuffer::from_host(dev.stream(), &bytes)?))
    })
    .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;
    use dmattn_abi::unpacked_position;

    /// Every CTA once; work never increases along the order; a causal batch's heaviest tile
    /// (the longest sequence's last) first; tiles past a sequence's end last.
    #[test]
    fn heaviest_first_each_cta_once() {
        let seqs = SeqLens::from_lengths(&[300, 1000, 0, 64], &[300, 1000, 5, 64], &Device::Cpu).unwrap();
        let (heads, block_m, block_n) = (3, 128, 64);
        let grid_x = 1000u32.div_ceil(block_m);
        let order = order(&seqs, &Band::CAUSAL, heads, block_m, block_n, grid_x);
        let mut seen: Vec<_> = order.iter().map(|&at| unpacked_position(at)).collect();
        let work = |(x, _, z): (u32, u32, u32)| tile_work(&seqs, &Band::CAUSAL, block_m, block_n, grid_x, x, z as usize);
        assert!(seen.windows(2).all(|w| work(w[0]) >= work(w[1])));
        assert_eq!(seen[0], (0, 0, 1));
        assert_eq!(work(seen[0]), 1 + 1000usize.div_ceil(64));
        let with_rows = [300usize, 1000, 0, 64].iter().map(|n| n.div_ceil(128)).sum::<usize>() * heads as usize;
        assert!(seen[..with_rows].iter().all(|&p| work(p) > 0) && seen[with_rows..].iter().all(|&p| work(p) == 0));
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), grid_x as usize * heads as usize * 4);
    }

    /// A decoding grid: every CTA once, full splits of the longest sequences first, each
    /// split's kv heads side by side in grid order, a sequence without queries last; a window
    /// leaves the splits before it no work.
    #[test]
    fn decoding_ctas_heaviest_first() {
        let seqs = SeqLens::from_lengths(&[1, 8, 0, 3], &[5000, 1500, 9000, 2048], &Device::Cpu).unwrap();
        let (kv_heads, splits, split_keys) = (2, 3, 2048);
        let order = decode_order(&seqs, &Band::CAUSAL, kv_heads, splits, split_keys);
        let seen: Vec<_> = order.iter().map(|&at| unpacked_position(at)).collect();
        // (split, sequence) by keys: (0, 0), (1, 0), (0, 3) full, then (0, 1) 1500, (2, 0) 904,
        // then the empty splits of sequences with queries, then sequence 2's (no queries).
        let pairs: Vec<(u32, u32)> = seen.iter().step_by(2).map(|&(_, y, z)| (y, z)).collect();
        assert_eq!(pairs, [(0, 0), (1, 0), (0, 3), (0, 1), (2, 0), (1, 1), (2, 1), (1, 3), (2, 3), (0, 2), (1, 2), (2, 2)]);
        assert!(seen.chunks(2).all(|c| c[0].0 == 0 && c[1].0 == 1 && (c[0].1, c[0].2) == (c[1].1, c[1].2)));
        let mut sorted = seen.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), (kv_heads * splits * 4) as usize);
        // Causal + left window 100: sequence 0's query sees keys 4900..5000 (split 2), sequence
        // 1's keys 1392..1500, sequence 3's 1945..2048.
        let band = Band { left: 100, ..Band::CAUSAL };
        let windowed: Vec<_> = decode_order(&seqs, &band, 1, 5, 2048).iter().map(|&at| unpacked_position(at)).collect();
        assert_eq!(windowed[..3], [(0, 0, 1), (0, 0, 3), (0, 2, 0)]);
    }

    /// A window's tiles: its width around the diagonal, plus the sink tiles before it.
    #[test]
    fn windowed_tiles() {
        let band = Band { left: 256, right: 0, sinks: 10, compress: 0 };
        assert_eq!(visited_tiles(&band, 4096, 4096, 2048, 128, 64), 1 + (2048 + 128 - (2048 - 256)) / 64);
        assert_eq!(visited_tiles(&Band::ALL, 10, 700, 0, 10, 64), 11);
        assert_eq!(visited_tiles(&Band::CAUSAL, 100, 0, 0, 100, 64), 0);
    }
}
