//! Timing results as `dmattn-bench` and `peers.py` write them (SCHEMA.md).
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    Fwd,
    Bwd,
    /// Building a mask's prepared form once (dmattn: `SparseMask::prepare`; flex: the
    /// BlockMask), outside the timed forward and backward calls that reuse it.
    Prep,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Oom,
    Unsupported,
    Error,
    Skipped,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Record {
    pub case: String,
    #[serde(rename = "impl")]
    pub implementation: String,
    pub pass: Pass,
    pub status: Status,
    pub ms: Option<f64>,
    #[serde(default)]
    pub note: String,
    /// For a `prep` record: bytes of device memory the prepared form holds (dmattn:
    /// `PreparedMask::memory_bytes()`; flex: the BlockMask's index tensors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl Record {
    /// Whether this is the result of (case, implementation, pass).
    pub fn is_for(&self, case: &str, implementation: &str, pass: Pass) -> bool {
        self.case == case && self.implementation == implementation && self.pass == pass
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
pub struct Ceilings {
    pub matmul_tflops: f64,
    pub copy_gbps: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Results {
    pub tool: String,
    pub gpu: String,
    pub date: String,
    #[serde(default)]
    pub versions: BTreeMap<String, String>,
    #[serde(default)]
    pub ceilings: Option<Ceilings>,
    #[serde(default)]
    pub computed_fraction: BTreeMap<String, f64>,
    pub results: Vec<Record>,
    /// Dates of later runs merged into this one (`cargo xtask bench --from A,B`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<String>,
    /// dmattn-bench only, when the `sparse` group ran: what each mask form holds on the GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mask_memory: Vec<MaskMemory>,
}

/// One mask form's memory (dmattn-bench's table, measured on the GPU): the tensors the caller
/// gives, the prepared form (`PreparedMask::memory_bytes()`), and the dense bool mask of the same
/// scores for comparison.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct MaskMemory {
    pub form: String,
    pub batch: usize,
    pub heads: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub input_bytes: u64,
    pub prepared_bytes: u64,
    pub dense_bool_bytes: u64,
    /// Median time of `prepare` (ms), or the error that stopped the row.
    pub prepare_ms: Option<f64>,
    #[serde(default)]
    pub note: String,
}
