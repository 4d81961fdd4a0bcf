//! Merges a benchmark run (`cases.json`, `dmattn.json`, `peers.json`; bench/SCHEMA.md) into the
//! markdown tables under `bench/results/`.
use dmattn_bench::cases::{Case, CaseSet};
use dmattn_bench::results::{Pass, Record, Results, Status};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Column order: dmattn, our baseline, then the peers users would pick first.
pub const ORDER: [&str; 7] = ["dmattn", "cublas-materialized", "flex", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math"];
const DMATTN: &str = "dmattn";
/// How peers.py notes a backward run without the bias gradient.
const NO_DBIAS: &str = "no dbias";

/// One benchmark run: its cases and every tool's results.
pub struct Run {
    pub set: CaseSet,
    pub tools: Vec<Results>,
}

fn read<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

impl Run {
    /// Reads `dir`: cases.json and dmattn.json must be there; peers.json is optional (no
    /// PyTorch on the machine), and its absence is said in the report.
    fn load_one(dir: &Path) -> Result<Run, String> {
        let set = read(&dir.join("cases.json"))?;
        let mut tools = vec![read(&dir.join("dmattn.json"))?];
        let peers = dir.join("peers.json");
        if peers.exists() {
            tools.push(read(&peers)?);
        }
        Ok(Run { set, tools })
    }

    /// Reads one or more run folders (a grid split across runs, e.g. to stay inside a time
    /// limit, or cases re-measured after a change) as one run: a later folder's result for a
    /// (case, implementation, pass) replaces an earlier one. Metadata comes from the first
    /// folder; [`Run::dates`] lists every run's.
    pub fn load(dirs: &[PathBuf]) -> Result<Run, String> {
        let mut runs = dirs.iter().map(|d| Run::load_one(d));
        let mut run = runs.next().ok_or("no run folder given")??;
        for other in runs {
            let other = other?;
            for c in other.set.cases {
                if !run.set.cases.iter().any(|mine| mine.id == c.id) {
                    run.set.cases.push(c);
                }
            }
            for (i, t) in other.tools.into_iter().enumerate() {
                match run.tools.get_mut(i) {
                    Some(mine) => {
                        let replaced = |r: &Record| t.results.iter().any(|n| r.is_for(&n.case, &n.implementation, n.pass));
                        mine.results.retain(|r| !replaced(r));
                        mine.results.extend(t.results);
                        mine.computed_fraction.extend(t.computed_fraction);
                        mine.runs.push(t.date);
                    }
                    None => run.tools.push(t),
                }
            }
        }
        Ok(run)
    }

    pub fn record(&self, case: &str, imp: &str, pass: Pass) -> Option<&Record> {
        self.tools.iter().flat_map(|t| &t.results).find(|r| r.is_for(case, imp, pass))
    }

    pub fn ms(&self, case: &str, imp: &str, pass: Pass) -> Option<f64> {
        self.record(case, imp, pass).filter(|r| r.status == Status::Ok).and_then(|r| r.ms)
    }

    /// Implementations present, in [`ORDER`] (unknown names last).
    pub fn impls(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tools.iter().flat_map(|t| &t.results).map(|r| r.implementation.clone()).collect();
        names.sort_by_key(|n| (ORDER.iter().position(|o| o == n).unwrap_or(ORDER.len()), n.clone()));
        names.dedup();
        names
    }

    fn dmattn(&self) -> &Results {
        &self.tools[0]
    }

    /// The fastest other implementation on (case, pass) that did the same work, with its time:
    /// a backward that could not produce the bias gradient ("no dbias") does not count.
    pub fn best_peer(&self, case: &str, pass: Pass) -> Option<(String, f64)> {
        self.impls()
            .into_iter()
            .filter(|i| i != DMATTN)
            .filter(|i| self.record(case, i, pass).is_some_and(|r| !r.note.contains(NO_DBIAS)))
            .filter_map(|i| self.ms(case, &i, pass).map(|ms| (i, ms)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The groups in case order.
    pub fn groups(&self) -> Vec<&str> {
        let mut g: Vec<&str> = Vec::new();
        for c in &self.set.cases {
            if !g.contains(&c.group.as_str()) {
                g.push(&c.group);
            }
        }
        g
    }
}

/// What a table row is called.
fn row_label(c: &Case) -> String {
    format!("q {} k {} {}", c.seqlen_q, c.seqlen_k, c.variant())
}

fn status_word(r: Option<&Record>) -> String {
    match r {
        None => "—".into(),
        Some(r) => format!("{:?}", r.status).to_lowercase(),
    }
}

/// Adds `imp`'s `note` (first line) under `label` to the notes below a table, once per kind:
/// notes of one kind differ only in figures (free memory, sizes) past their start.
fn note_once(notes: &mut Vec<String>, imp: &str, label: &str, note: &str) {
    let note = note.lines().next().unwrap_or("").chars().take(160).collect::<String>().replace('|', "/");
    let head = format!("{imp} {label}: ");
    let kind = format!("{head}{}", note.chars().take(48).collect::<String>());
    if !notes.iter().any(|n| n.starts_with(&kind)) {
        notes.push(format!("{head}{note}"));
    }
}

fn table(run: &Run, group: &str, pass: Pass, out: &mut String, notes: &mut Vec<String>) {
    let cases: Vec<&Case> = run.set.cases.iter().filter(|c| c.group == group && (pass == Pass::Fwd || c.backward)).collect();
    if cases.is_empty() {
        return;
    }
    let decode = cases.iter().all(|c| c.is_decode());
    let ceil = run.dmattn().ceilings.map(|c| c.matmul_tflops);
    let peers: Vec<String> = run.impls().into_iter().filter(|i| i != DMATTN).collect();
    let first = &cases[0];
    let _ = writeln!(
        out,
        "\n### {group} — {} (batch {}, heads {}, kv heads {}, dim {})\n",
        if pass == Pass::Fwd { "forward" } else { "backward" },
        first.batch,
        first.heads,
        first.kv_heads,
        first.head_dim
    );
    let rate = if decode { "dmattn GB/s" } else { "dmattn TF/s dense-eq / computed" };
    let _ = write!(out, "| case | dmattn ms | {rate} |");
    peers.iter().for_each(|p| {
        let _ = write!(out, " {p} |");
    });
    let _ = writeln!(out, " best peer ÷ dmattn |\n|{}", "---|".repeat(4 + peers.len()));
    for c in cases {
        let dm = run.ms(&c.id, DMATTN, pass);
        let dm_cell = dm.map_or_else(|| status_word(run.record(&c.id, DMATTN, pass)), |ms| format!("{ms:.3}"));
        let rate_cell = dm.map_or("".into(), |ms| {
            if decode {
                format!("{:.0}", c.fwd_bytes() / (ms * 1e-3) / 1e9)
            } else {
                let flops = if pass == Pass::Fwd { c.fwd_flops() } else { c.bwd_flops() };
                let tf = flops / (ms * 1e-3) / 1e12;
                let computed = run.dmattn().computed_fraction.get(&c.id).copied().unwrap_or(1.0);
                let pct = ceil.map_or(String::new(), |m| format!(" ({:.0}%)", 100.0 * tf * computed / m));
                format!("{tf:.0} / {:.0}{pct}", tf * computed)
            }
        });
        let _ = write!(out, "| {} | {dm_cell} | {rate_cell} |", row_label(c));
        for p in &peers {
            let rec = run.record(&c.id, p, pass);
            // A result that came with a caveat (K/V repeated for GQA, no bias gradient) is
            // marked, and caveats and failures are listed under the table.
            let mark = match rec.filter(|r| r.status == Status::Ok && !r.note.is_empty()) {
                Some(r) => {
                    note_once(notes, p, "†", &r.note);
                    "†"
                }
                None => "",
            };
            let cell = match (run.ms(&c.id, p, pass), dm) {
                (Some(ms), Some(d)) => format!("{ms:.3}{mark} ({:.2}×)", ms / d),
                (Some(ms), None) => format!("{ms:.3}{mark}"),
                (None, _) => {
                    if let Some(r) = rec.filter(|r| !r.note.is_empty()) {
                        note_once(notes, p, &status_word(rec), &r.note);
                    }
                    status_word(rec)
                }
            };
            let _ = write!(out, " {cell} |");
        }
        let best = match (run.best_peer(&c.id, pass), dm) {
            (Some((name, ms)), Some(d)) => format!("{:.2}× ({name})", ms / d),
            _ => "—".into(),
        };
        let _ = writeln!(out, " {best} |");
    }
}

/// (case, pass, dmattn ms, best peer, its ms) where dmattn trails its best peer, worst first.
pub fn behind(run: &Run) -> Vec<(String, Pass, f64, String, f64)> {
    let mut v = Vec::new();
    for c in &run.set.cases {
        for pass in [Pass::Fwd, Pass::Bwd] {
            if let (Some(d), Some((peer, ms))) = (run.ms(&c.id, DMATTN, pass), run.best_peer(&c.id, pass))
                && d > ms
            {
                v.push((c.id.clone(), pass, d, peer, ms));
            }
        }
    }
    v.sort_by(|a, b| (b.2 / b.4).total_cmp(&(a.2 / a.4)));
    v
}

/// The whole report, in markdown.
pub fn markdown(run: &Run, plot_file: Option<&str>) -> String {
    let dm = run.dmattn();
    let mut out = format!("# dmattn benchmarks\n\nGPU: **{}** · {} · dtype {} · CUDA events, {} warm-up calls, median of {} timed calls, operands rotated over sets that do not fit in L2, N(0, 1) data.\n", dm.gpu, dm.date, run.set.dtype, run.set.warmup, run.set.reps);
    for (tool, later) in run.tools.iter().map(|t| (&t.tool, &t.runs)).filter(|(_, r)| !r.is_empty()) {
        let _ = writeln!(out, "Some {tool} rows were re-measured in later runs on the same GPU ({}): they replace the first run's.", later.join(", "));
    }
    if let Some(c) = dm.ceilings {
        let _ = writeln!(out, "Ceilings measured in the same run: cuBLAS bf16 matmul **{:.0} TFLOP/s** (8192³), device copy **{:.0} GB/s** (read + write).", c.matmul_tflops, c.copy_gbps);
    }
    match run.tools.get(1) {
        Some(p) => {
            let versions: Vec<String> = p.versions.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(out, "Peers ({}) ran on the same machine ({}), started {}.", versions.join(", "), p.gpu, p.date);
        }
        None => out += "No peers ran (no PyTorch with CUDA on this machine): only dmattn's own figures.\n",
    }
    out += "\nCells hold milliseconds and, in parentheses, that implementation's time ÷ dmattn's: above 1 dmattn is faster. \
TF/s dense-eq counts every pair causal masking leaves (FlashAttention's convention; backward = 2.5× forward); \
computed counts only the 64×64 score tiles holding a visible score (what a block-sparse kernel must do). \
Decode rows give the bytes of q, k, v, mask, bias and out over the time. `cublas-materialized` is dmattn's \
unfused baseline (S = QKᵀ on cuBLAS, masked softmax, PV on cuBLAS). Failures are listed, not dropped; \
† marks a peer result with a caveat (listed under its group), and a backward without the bias gradient is never \
counted as the best peer.\n";
    if let Some(p) = plot_file {
        let _ = writeln!(out, "\n![time vs sequence length]({p})");
    }
    let behind = behind(run);
    out += "\n## Where dmattn is furthest behind its best peer\n\n";
    if behind.is_empty() {
        out += "Nowhere: dmattn is at least as fast as every peer that ran, on every case.\n";
    }
    for (case, pass, d, peer, ms) in behind.iter().take(3) {
        let _ = writeln!(out, "- `{case}` {pass:?}: dmattn {d:.3} ms vs {peer} {ms:.3} ms ({:.2}× slower)", d / ms);
    }
    let pairs = run.set.cases.iter().map(|c| 1 + c.backward as usize).sum::<usize>();
    let _ = writeln!(out, "\ndmattn trails its best peer in {} of {pairs} measurements.", behind.len());
    for group in run.groups() {
        let _ = writeln!(out, "\n## {group}");
        let mut notes = Vec::new();
        table(run, group, Pass::Fwd, &mut out, &mut notes);
        table(run, group, Pass::Bwd, &mut out, &mut notes);
        if !notes.is_empty() {
            out += "\nFailures and caveats (†):\n";
            notes.iter().for_each(|n| {
                let _ = writeln!(out, "- {n}");
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmattn_bench::cases::grid;

    fn rec(case: &str, imp: &str, pass: Pass, ms: Option<f64>) -> Record {
        let status = if ms.is_some() { Status::Ok } else { Status::Oom };
        Record { case: case.into(), implementation: imp.into(), pass, status, ms, note: if ms.is_some() { "" } else { "CUDA out of memory" }.into() }
    }

    fn results(tool: &str, results: Vec<Record>) -> Results {
        Results {
            tool: tool.into(),
            gpu: "G".into(),
            date: "2026-11-22T00:00:00Z".into(),
            versions: Default::default(),
            ceilings: None,
            computed_fraction: Default::default(),
            results,
            runs: vec![],
        }
    }

    #[test]
    fn ratios_failures_and_worst_cases() {
        let cases = grid(true, &["llm".into()]);
        let (a, b) = (&cases[0].id, &cases[1].id);
        let run = Run {
            set: CaseSet { dtype: "bf16".into(), warmup: 1, reps: 1, cases: cases.clone() },
            tools: vec![
                results("dmattn-bench", vec![rec(a, "dmattn", Pass::Fwd, Some(2.0)), rec(b, "dmattn", Pass::Fwd, Some(1.0))]),
                results("peers", vec![rec(a, "flex", Pass::Fwd, Some(3.0)), rec(b, "flex", Pass::Fwd, Some(0.5)), rec(b, "sdpa-math", Pass::Fwd, None)]),
            ],
        };
        assert_eq!(run.impls(), ["dmattn", "flex", "sdpa-math"]);
        let behind = behind(&run);
        assert_eq!(behind.len(), 1);
        assert_eq!((behind[0].0.as_str(), behind[0].3.as_str(), behind[0].4), (b.as_str(), "flex", 0.5));
        let md = markdown(&run, None);
        assert!(md.contains("| 3.000 (1.50×) |"), "{md}");
        assert!(md.contains("| oom |") && md.contains("sdpa-math oom: CUDA out of memory"), "{md}");
        assert!(md.contains("trails its best peer in 1 of"), "{md}");
    }
}
