//! Timing results as `dmattn-bench` and `peers.py` write them (SCHEMA.md).
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    Fwd,
    Bwd,
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
}
