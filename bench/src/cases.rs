//! The benchmark grid: Flash-DMA's README grid and LLM shapes, as `cases.json` describes them.
use serde::{Deserialize, Serialize};

/// Which scores a case hides (see SCHEMA.md for how each is drawn).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Mask {
    /// Each query row keeps the `keep` keys of largest bias (Flash-DMA's dynamic top-k mask).
    Topk { keep: usize },
    /// Independent random `block`×`block` tiles, each visible with probability `density`.
    Blocks { block: usize, density: f64 },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Case {
    pub id: String,
    pub group: String,
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub mask: Option<Mask>,
    pub bias: bool,
    /// The heads dimension of mask and bias: 1 or `kv_heads`.
    pub mask_heads: usize,
    pub backward: bool,
}

/// The file `dmattn-bench` writes and `peers.py` reads.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct CaseSet {
    pub dtype: String,
    pub warmup: usize,
    pub reps: usize,
    pub cases: Vec<Case>,
}

impl Case {
    /// Query-key pairs left by causal masking alone (bottom-right aligned).
    fn causal_pairs(&self) -> f64 {
        let (sq, sk) = (self.seqlen_q as i64, self.seqlen_k as i64);
        if !self.causal {
            return (sq * sk) as f64;
        }
        // Row i sees keys 0..=i + sk - sq, clipped to [0, sk].
        (0..sq).map(|i| (i + sk - sq + 1).clamp(0, sk)).sum::<i64>() as f64
    }

    /// Dense-equivalent forward FLOPs: the two matmuls over every pair causal masking leaves
    /// (FlashAttention's count; the mask is not subtracted).
    pub fn fwd_flops(&self) -> f64 {
        4.0 * (self.batch * self.heads * self.head_dim) as f64 * self.causal_pairs()
    }

    /// Dense-equivalent backward FLOPs: five matmuls to the forward's two.
    pub fn bwd_flops(&self) -> f64 {
        2.5 * self.fwd_flops()
    }

    /// Bytes a forward must read at least (q, k, v, and the mask and bias) and write (out):
    /// the memory traffic that bounds decoding. Elements are 2 bytes, mask entries 1.
    pub fn fwd_bytes(&self) -> f64 {
        let qo = 2 * self.batch * self.seqlen_q * self.heads * self.head_dim;
        let kv = 2 * self.batch * self.seqlen_k * self.kv_heads * self.head_dim;
        let scores = self.batch * self.mask_heads * self.seqlen_q * self.seqlen_k;
        let extra = scores * (self.mask.is_some() as usize + 2 * self.bias as usize);
        (2 * qo + 2 * kv + extra) as f64
    }

    /// Whether this is a decoding case (one query row), reported in GB/s.
    pub fn is_decode(&self) -> bool {
        self.seqlen_q == 1
    }

    /// Short label of the masking, for tables: `dense`, `causal`, `topk1024+bias`, ...
    pub fn variant(&self) -> String {
        let mut parts = Vec::new();
        if self.causal {
            parts.push("causal".to_string());
        }
        match self.mask {
            Some(Mask::Topk { keep }) => parts.push(format!("topk{keep}")),
            Some(Mask::Blocks { block, density }) => parts.push(format!("blocks{block}x{:.0}%", density * 100.0)),
            None => {}
        }
        if self.bias {
            parts.push("bias".into());
        }
        if parts.is_empty() { "dense".into() } else { parts.join("+") }
    }
}

/// A case of `group` with Flash-DMA's benchmark shape (batch 1, 2 heads, 1 kv head, dim 64),
/// a top-`keep` mask and a bias.
fn flash_dma(group: &str, seqlen_q: usize, seqlen_k: usize, keep: usize) -> Case {
    let mut c = Case {
        id: String::new(),
        group: group.into(),
        batch: 1,
        heads: 2,
        kv_heads: 1,
        seqlen_q,
        seqlen_k,
        head_dim: 64,
        causal: false,
        mask: Some(Mask::Topk { keep }),
        bias: true,
        mask_heads: 1,
        backward: seqlen_q > 1,
    };
    c.id = format!("{group}/q{seqlen_q}/k{seqlen_k}/{}", c.variant());
    c
}

/// LLM-shaped cases: batch 2, 32 heads, 8 kv heads (GQA), dim 128.
/// LLM shapes: dense, causal, a 50 % random 128-block mask, and that mask with a bias.
fn llm(group: &str, head_dim: usize, seqlen: usize) -> Vec<Case> {
    let base = Case {
        id: String::new(),
        group: group.into(),
        batch: 2,
        heads: 32,
        kv_heads: 8,
        seqlen_q: seqlen,
        seqlen_k: seqlen,
        head_dim,
        causal: false,
        mask: None,
        bias: false,
        mask_heads: 1,
        backward: true,
    };
    let blocks = Some(Mask::Blocks { block: 128, density: 0.5 });
    [base.clone(), Case { causal: true, ..base.clone() }, Case { mask: blocks, ..base.clone() }, Case { mask: blocks, bias: true, ..base }]
        .into_iter()
        .map(|mut c| {
            c.id = format!("llm/d{}/s{seqlen}/{}", c.head_dim, c.variant());
            c
        })
        .collect()
}

/// The groups of the grid, in run order.
pub const GROUPS: [&str; 6] = ["llm", "llm-d64", "dma-train", "dma-window", "dma-infer", "dma-infer-window"];

/// The grid for `groups` (all when empty); `quick` keeps a few sizes of each for a run of about
/// two minutes.
pub fn grid(quick: bool, groups: &[String]) -> Vec<Case> {
    let pick = |full: &[usize], few: &[usize]| -> Vec<usize> { if quick { few.to_vec() } else { full.to_vec() } };
    let mut cases = Vec::new();
    for group in GROUPS.into_iter().filter(|g| groups.is_empty() || groups.iter().any(|x| x == g)) {
        match group {
            "llm" | "llm-d64" => {
                let head_dim = if group == "llm" { 128 } else { 64 };
                let seqlens = pick(&[1024, 2048, 4096, 8192, 16384], &[8192]);
                cases.extend(seqlens.into_iter().flat_map(|s| llm(group, head_dim, s)));
            }
            "dma-train" => cases.extend(
                pick(&[256, 512, 1024, 2048, 4096, 8192, 16384, 32768], &[1024, 16384]).into_iter().map(|s| flash_dma(group, s, s, 1024)),
            ),
            "dma-window" => cases.extend(
                pick(&[32, 128, 512, 2048, 8192, 32768], &[64, 4096]).into_iter().map(|w| flash_dma(group, 32768, 32768, w)),
            ),
            "dma-infer" => cases.extend(
                pick(&[256, 1024, 4096, 16384, 65536, 131072, 262144, 524288], &[16384, 524288])
                    .into_iter()
                    .map(|s| flash_dma(group, 1, s, 1024)),
            ),
            "dma-infer-window" => cases.extend(
                pick(&[32, 128, 512, 2048, 8192], &[64]).into_iter().map(|w| flash_dma(group, 1, 524288, w)),
            ),
            _ => unreachable!(),
        }
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_groups_known() {
        let all = grid(false, &[]);
        let mut ids: Vec<&str> = all.iter().map(|c| c.id.as_str()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), all.len());
        assert!(grid(true, &["llm".into()]).iter().all(|c| c.group == "llm"));
        assert!(grid(true, &[]).len() < all.len());
    }

    #[test]
    fn causal_flops_count_the_visible_triangle() {
        let mut c = flash_dma("t", 4, 6, 1);
        c.causal = true;
        // Rows see 3, 4, 5, 6 keys.
        assert_eq!(c.fwd_flops(), 4.0 * 2.0 * 64.0 * 18.0);
        c.causal = false;
        assert_eq!(c.fwd_flops(), 4.0 * 2.0 * 64.0 * 24.0);
        let sq_gt_sk = Case { seqlen_q: 6, seqlen_k: 4, causal: true, ..c };
        // Rows 0 and 1 see nothing; then 1, 2, 3, 4.
        assert_eq!(sq_gt_sk.fwd_flops(), 4.0 * 2.0 * 64.0 * 10.0);
    }

    #[test]
    fn json_round_trip_matches_schema_names() {
        let c = &grid(true, &["llm".into()])[3];
        let text = serde_json::to_string(c).unwrap();
        assert!(text.contains(r#""mask":{"kind":"blocks","block":128,"density":0.5}"#), "{text}");
        assert_eq!(&serde_json::from_str::<Case>(&text).unwrap(), c);
    }
}
