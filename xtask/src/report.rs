//! Merges a benchmark run (`cases.json`, `dmattn.json`, `peers.json`; bench/SCHEMA.md) into the
//! markdown tables under `bench/results/`.
use dmattn_bench::cases::{Case, CaseSet, Mask, SelectOutput};
use dmattn_bench::results::{Pass, Record, Results, Status};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Column order: dmattn, our baseline, then the peers users would pick first, then the
/// references that skip part of the work ([`REFERENCES`]).
pub const ORDER: [&str; 11] =
    ["dmattn", "cublas-materialized", "flex", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math", "fa2-varlen", "fa2-kept-keys", "fa2-varlen-kept", "fa2-dense-causal"];
/// peers.py's FlashAttention-2 references: attention over the kept keys alone without bias or
/// causal (the floor; `fa2-varlen-kept` for a packed batch's key-side mask, each kv head's kept
/// keys a sequence of its own), and dense causal ignoring the mask. Listed for scale, never
/// counted as the best peer: they do not do the case's work.
pub const REFERENCES: [&str; 3] = ["fa2-kept-keys", "fa2-varlen-kept", "fa2-dense-causal"];
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
                        if !t.mask_memory.is_empty() {
                            mine.mask_memory = t.mask_memory;
                        }
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
    /// a backward that could not produce the bias gradient ("no dbias") and the [`REFERENCES`]
    /// do not count.
    pub fn best_peer(&self, case: &str, pass: Pass) -> Option<(String, f64)> {
        self.impls()
            .into_iter()
            .filter(|i| i != DMATTN && !REFERENCES.contains(&i.as_str()))
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

/// What a table row is called; `with_dim` where the group's head dims differ.
fn row_label(c: &Case, with_dim: bool) -> String {
    let dim = if with_dim { format!("d{} ", c.head_dim) } else { String::new() };
    format!("{dim}q {} k {} {}", c.seqlen_q, c.seqlen_k, c.variant())
}

/// The head dims of `cases`, in order, once each.
fn head_dims(cases: &[&Case]) -> Vec<usize> {
    distinct(cases, |c| c.head_dim)
}

/// `field` of `cases`, in order, once each.
fn distinct(cases: &[&Case], field: impl Fn(&Case) -> usize) -> Vec<usize> {
    let mut seen: Vec<usize> = Vec::new();
    for c in cases {
        if !seen.contains(&field(c)) {
            seen.push(field(c));
        }
    }
    seen
}

/// Values as a header gives them: `2`, or `2 and 16` where a group mixes them.
fn listed(values: &[usize]) -> String {
    values.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(" and ")
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
    let some_decode = cases.iter().any(|c| c.is_decode());
    let ceil = run.dmattn().ceilings.map(|c| c.matmul_tflops);
    // The peers that ran on some case of the group (either pass): peers of one mask kind only
    // get no empty columns elsewhere.
    let in_group: Vec<&Case> = run.set.cases.iter().filter(|c| c.group == group).collect();
    let peers: Vec<String> = run
        .impls()
        .into_iter()
        .filter(|i| i != DMATTN && in_group.iter().any(|c| [Pass::Fwd, Pass::Bwd].iter().any(|&p| run.record(&c.id, i, p).is_some())))
        .collect();
    let dims = head_dims(&cases);
    let _ = writeln!(
        out,
        "\n### {group} — {} (batch {}, heads {}, kv heads {}, dim {})\n",
        if pass == Pass::Fwd { "forward" } else { "backward" },
        listed(&distinct(&cases, |c| c.batch)),
        listed(&distinct(&cases, |c| c.heads)),
        listed(&distinct(&cases, |c| c.kv_heads)),
        listed(&dims)
    );
    let rate = match (decode, some_decode) {
        (true, _) => "dmattn GB/s",
        (false, true) => "dmattn TF/s dense-eq / computed (decode: GB/s)",
        (false, false) => "dmattn TF/s dense-eq / computed",
    };
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
            } else if c.is_decode() {
                format!("{:.0} GB/s", c.fwd_bytes() / (ms * 1e-3) / 1e9)
            } else {
                let tf = c.flops(pass) / (ms * 1e-3) / 1e12;
                let computed = run.dmattn().computed_fraction.get(&c.id).copied().unwrap_or(1.0);
                let tc = c.computed_flops(pass, computed) / (ms * 1e-3) / 1e12;
                let pct = ceil.map_or(String::new(), |m| format!(" ({:.0}%)", 100.0 * tc / m));
                format!("{tf:.0} / {tc:.0}{pct}")
            }
        });
        let _ = write!(out, "| {} | {dm_cell} | {rate_cell} |", row_label(c, dims.len() > 1));
        peer_cells(run, c, pass, &peers, dm, out, notes);
    }
}

/// A row's peer cells (ms and the ratio to dmattn's `dm`, or the failure) and its best-peer cell,
/// to the end of the line.
fn peer_cells(run: &Run, c: &Case, pass: Pass, peers: &[String], dm: Option<f64>, out: &mut String, notes: &mut Vec<String>) {
    for p in peers {
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

/// The `select` group's tables, one per output form (index lists, bool mask): key selection alone
/// (`select_keys`, Flash-DMA's `create_mask`), no attention, so no TF/s: the time, the GB/s of
/// the bias and causal mask read, and of everything moved (read, and the output written) next to
/// the device copy measured in the same run, then the peers and the speedup over the best.
fn select_tables(run: &Run, group: &str, out: &mut String, notes: &mut Vec<String>) {
    let in_group: Vec<&Case> = run.set.cases.iter().filter(|c| c.group == group && c.is_select()).collect();
    let copy = run.dmattn().ceilings.map(|c| c.copy_gbps);
    for (output, title) in [(SelectOutput::Indices, "index lists (`.indices()`)"), (SelectOutput::Mask, "bool mask (`.mask()`)")] {
        let cases: Vec<&Case> = in_group.iter().copied().filter(|c| matches!(c.mask, Some(Mask::Select { output: o, .. }) if o == output)).collect();
        if cases.is_empty() {
            continue;
        }
        let keeps = distinct(&cases, |c| match c.mask {
            Some(Mask::Select { keep, .. }) => keep,
            _ => 0,
        });
        let peers: Vec<String> = run.impls().into_iter().filter(|i| i != DMATTN && cases.iter().any(|c| run.record(&c.id, i, Pass::Fwd).is_some())).collect();
        let ceiling = copy.map_or(String::new(), |g| format!("; device copy {g:.0} GB/s"));
        let _ = writeln!(out, "\n### {group} — {title}, top-{} of a {} bias{ceiling}\n", listed(&keeps), run.set.dtype);
        let _ = write!(out, "| case | bias | dmattn ms | dmattn GB/s read | read + written GB/s (% of copy) |");
        peers.iter().for_each(|p| {
            let _ = write!(out, " {p} |");
        });
        let _ = writeln!(out, " best peer ÷ dmattn |\n|{}", "---|".repeat(6 + peers.len()));
        for c in cases {
            let dm = run.ms(&c.id, DMATTN, Pass::Fwd);
            let dm_cell = dm.map_or_else(|| status_word(run.record(&c.id, DMATTN, Pass::Fwd)), |ms| format!("{ms:.3}"));
            let (read, written) = c.select_bytes().unwrap_or_default();
            let gbs = |bytes: f64| dm.map(|ms| bytes / (ms * 1e-3) / 1e9);
            let read_cell = gbs(read).map_or(String::new(), |g| format!("{g:.0}"));
            let moved_cell = gbs(read + written).map_or(String::new(), |g| match copy {
                Some(copy) => format!("{g:.0} ({:.0}%)", 100.0 * g / copy),
                None => format!("{g:.0}"),
            });
            let within = match c.mask {
                Some(Mask::Select { within_causal: true, .. }) => format!(" within causal [1, 1, {}, {}]", c.seqlen_q, c.seqlen_k),
                _ => String::new(),
            };
            let _ = write!(out, "| {} | {:?}{within} | {dm_cell} | {read_cell} | {moved_cell} |", row_label(c, false), c.select_bias_shape());
            peer_cells(run, c, Pass::Fwd, &peers, dm, out, notes);
        }
    }
}

/// Bytes for a table: B, KiB, MiB or GiB.
fn bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB"];
    let (mut x, mut u) = (n as f64, 0);
    while x >= 1024.0 && u + 1 < units.len() {
        (x, u) = (x / 1024.0, u + 1);
    }
    if u == 0 { format!("{n} B") } else { format!("{x:.1} {}", units[u]) }
}

/// The group's `prep` records (a sparse mask prepared once, a flex BlockMask built once): time
/// and bytes of each implementation that reported one.
fn prep_table(run: &Run, group: &str, out: &mut String, notes: &mut Vec<String>) {
    let cases: Vec<&Case> = run.set.cases.iter().filter(|c| c.group == group).collect();
    let impls: Vec<String> = run.impls().into_iter().filter(|i| cases.iter().any(|c| run.record(&c.id, i, Pass::Prep).is_some())).collect();
    if impls.is_empty() {
        return;
    }
    let with_dim = head_dims(&cases).len() > 1;
    let _ = writeln!(out, "\n### {group} — mask preparation (once per mask, outside the timed calls)\n");
    let _ = write!(out, "| case |");
    impls.iter().for_each(|i| {
        let _ = write!(out, " {i} ms | {i} bytes |");
    });
    let _ = writeln!(out, "\n|{}", "---|".repeat(1 + 2 * impls.len()));
    for c in cases.iter().filter(|c| impls.iter().any(|i| run.record(&c.id, i, Pass::Prep).is_some())) {
        let _ = write!(out, "| {} |", row_label(c, with_dim));
        for i in &impls {
            let rec = run.record(&c.id, i, Pass::Prep);
            let ms = match (run.ms(&c.id, i, Pass::Prep), rec) {
                (Some(ms), _) => format!("{ms:.3}"),
                (None, r) => {
                    if let Some(r) = r.filter(|r| !r.note.is_empty()) {
                        note_once(notes, i, &format!("prep {}", status_word(rec)), &r.note);
                    }
                    status_word(r)
                }
            };
            let size = rec.and_then(|r| r.bytes).map_or("—".into(), bytes);
            let _ = write!(out, " {ms} | {size} |");
        }
        out.push('\n');
    }
}

/// dmattn-bench's mask-memory table, where it made one.
fn memory_table(run: &Run, out: &mut String) {
    let rows = &run.dmattn().mask_memory;
    if rows.is_empty() {
        return;
    }
    out.push_str(
        "\n## Mask memory\n\nOne pattern's forms on the GPU (batch 1, one head), from `PreparedMask::memory_bytes()`: the tensors the caller gives, \
the prepared form the kernels read, and the dense bool mask of the same scores.\n\n",
    );
    out.push_str("| form | q × k | given | prepared | dense bool | prepared ÷ dense bool | prepare ms | note |\n|---|---|---|---|---|---|---|---|\n");
    for m in rows {
        let ratio = match (m.prepared_bytes, m.dense_bool_bytes) {
            (_, 0) => "—".into(),
            (0, _) => "0".into(),
            (p, d) => format!("{:.2e}", p as f64 / d as f64),
        };
        let prep = m.prepare_ms.map_or("—".into(), |ms| format!("{ms:.3}"));
        let _ = writeln!(
            out,
            "| {} | {} × {} | {} | {} | {} | {ratio} | {prep} | {} |",
            m.form,
            m.seqlen_q,
            m.seqlen_k,
            bytes(m.input_bytes),
            bytes(m.prepared_bytes),
            bytes(m.dense_bool_bytes),
            m.note.replace('|', "/")
        );
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
TF/s dense-eq counts every pair causal masking, windows, compression and block masks (BCSR, bitset) leave (FlashAttention's convention; \
backward = 2.5× forward; top-k and random-block masks given densely are not subtracted; a key-side top-k counts the kept keys each query sees, index lists their listed keys, distinct ones in expectation for random lists); \
computed counts every score of the 64×64 score tiles holding a visible score (what a block-sparse kernel must do; for a key-side top-k, \
the tiles of the kept keys compacted, which gather attention computes). \
Sparse masks are prepared once per case outside the timed calls (as layers of a model reuse one), and flex's BlockMask is built once likewise; \
both build times are listed under their group. \
Decode rows give the bytes of q, k, v (only the kept keys' rows for a key-side top-k), mask, bias and out over the time. `cublas-materialized` is dmattn's \
unfused baseline (S = QKᵀ on cuBLAS, masked softmax, PV on cuBLAS). Failures are listed, not dropped; \
† marks a peer result with a caveat (listed under its group), and a backward without the bias gradient is never \
counted as the best peer, nor are the FlashAttention-2 references `fa2-kept-keys` (the kept keys alone, no bias, no causal: \
the floor of gather attention) and `fa2-dense-causal` (all keys, mask and bias ignored). \
The `select` group times key selection alone (`select_keys`: Flash-DMA's `create_mask`, top-k of a bias, no attention) against `torch.topk` and \
Flash-DMA's `create_mask` in PyTorch (`torch-create-mask`), on inputs of the same shapes (N(0, 1) bias drawn on each side): its GB/s count the bias and \
causal mask read (each once), and with the output written (index lists or bool mask) against the device copy.\n";
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
        if run.set.cases.iter().filter(|c| c.group == group).all(|c| c.is_select()) {
            select_tables(run, group, &mut out, &mut notes);
        } else {
            table(run, group, Pass::Fwd, &mut out, &mut notes);
            table(run, group, Pass::Bwd, &mut out, &mut notes);
        }
        prep_table(run, group, &mut out, &mut notes);
        if !notes.is_empty() {
            out += "\nFailures and caveats (†):\n";
            notes.iter().for_each(|n| {
                let _ = writeln!(out, "- {n}");
            });
        }
    }
    memory_table(run, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmattn_bench::cases::grid;

    fn rec(case: &str, imp: &str, pass: Pass, ms: Option<f64>) -> Record {
        let status = if ms.is_some() { Status::Ok } else { Status::Oom };
        Record { case: case.into(), implementation: imp.into(), pass, status, ms, note: if ms.is_some() { "" } else { "CUDA out of memory" }.into(), bytes: None }
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
            mask_memory: vec![],
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

    #[test]
    fn gather_group_mixes_shapes_and_decoding_and_never_takes_a_reference_as_best() {
        let mut cases = grid(false, &["gather".into()]);
        cases.extend(grid(true, &["llm".into()]).into_iter().take(1));
        let (train, decode, llm) = (cases[0].id.clone(), cases[4].id.clone(), cases[5].id.clone());
        let dm = results("dmattn-bench", vec![rec(&train, "dmattn", Pass::Fwd, Some(2.0)), rec(&decode, "dmattn", Pass::Fwd, Some(0.01)), rec(&llm, "dmattn", Pass::Fwd, Some(1.0))]);
        let peers = results(
            "peers",
            vec![
                rec(&train, "fa2-kept-keys", Pass::Fwd, Some(0.5)),
                rec(&train, "flex", Pass::Fwd, Some(4.0)),
                rec(&decode, "fa2-dense-causal", Pass::Fwd, Some(0.005)),
                rec(&llm, "flex", Pass::Fwd, Some(2.0)),
            ],
        );
        let run = Run { set: CaseSet { dtype: "bf16".into(), warmup: 1, reps: 1, cases: cases.clone() }, tools: vec![dm, peers] };
        // The references are faster but never the best peer: dmattn trails nowhere.
        assert_eq!(run.best_peer(&train, Pass::Fwd), Some(("flex".into(), 4.0)));
        assert_eq!(run.best_peer(&decode, Pass::Fwd), None);
        assert!(behind(&run).is_empty());
        let md = markdown(&run, None);
        assert!(md.contains("### gather — forward (batch 1, heads 2 and 16, kv heads 1 and 4, dim 64 and 128)"), "{md}");
        assert!(md.contains("| case | dmattn ms | dmattn TF/s dense-eq / computed (decode: GB/s) | flex | fa2-kept-keys | fa2-dense-causal |"), "{md}");
        // The decoding row gives GB/s: its bytes over 0.01 ms.
        let gbs = format!("| d64 q 1 k 524288 causal+keytopk1024+bias | 0.010 | {:.0} GB/s |", cases[4].fwd_bytes() / 1e-5 / 1e9);
        assert!(md.contains(&gbs), "{gbs} not in {md}");
        assert!(md.contains("| 0.500 (0.25×) |") && md.contains("| 2.00× (flex) |"), "{md}");
        // The llm group's table has no columns for the references, which did not run there.
        let llm_table = &md[md.find("## llm").unwrap()..];
        assert!(llm_table.contains("| case | dmattn ms | dmattn TF/s dense-eq / computed | flex | best peer ÷ dmattn |"), "{llm_table}");
    }

    #[test]
    fn select_group_gives_gb_per_s_next_to_the_copy_and_the_speedup_over_torch() {
        use dmattn_bench::results::Ceilings;
        let mut cases = grid(false, &["select".into()]);
        cases.extend(grid(true, &["llm".into()]).into_iter().take(1));
        let id = |i: usize| cases[i].id.clone();
        let (pq_idx, pq_mask, causal_idx, row32k, llm) = (id(0), id(1), id(2), id(4), id(cases.len() - 1));
        let mut dm = results(
            "dmattn-bench",
            vec![
                rec(&pq_idx, "dmattn", Pass::Fwd, Some(2.0)),
                rec(&pq_mask, "dmattn", Pass::Fwd, Some(4.0)),
                rec(&causal_idx, "dmattn", Pass::Fwd, None),
                rec(&row32k, "dmattn", Pass::Fwd, Some(0.01)),
                rec(&llm, "dmattn", Pass::Fwd, Some(1.0)),
            ],
        );
        dm.ceilings = Some(Ceilings { matmul_tflops: 800.0, copy_gbps: 3000.0 });
        let chunked = Record { note: "in chunks of 2048 rows; whole tensor: CUDA out of memory".into(), ..rec(&pq_mask, "torch-create-mask", Pass::Fwd, Some(30.0)) };
        let peers = results(
            "peers",
            vec![
                rec(&pq_idx, "torch-topk", Pass::Fwd, Some(8.0)),
                chunked,
                rec(&causal_idx, "torch-topk", Pass::Fwd, Some(5.0)),
                rec(&row32k, "torch-topk", Pass::Fwd, Some(0.005)),
                rec(&llm, "flex", Pass::Fwd, Some(2.0)),
            ],
        );
        let run = Run { set: CaseSet { dtype: "bf16".into(), warmup: 1, reps: 1, cases: cases.clone() }, tools: vec![dm, peers] };
        let md = markdown(&run, None);
        let select = &md[md.find("## select").unwrap()..md.find("## llm").unwrap()];
        // One table per output form, each with its own peer; no TF/s.
        assert!(select.contains("### select — index lists (`.indices()`), top-1024 of a bf16 bias; device copy 3000 GB/s"), "{select}");
        assert!(select.contains("### select — bool mask (`.mask()`), top-1024 of a bf16 bias; device copy 3000 GB/s"), "{select}");
        assert!(select.contains("| case | bias | dmattn ms | dmattn GB/s read | read + written GB/s (% of copy) | torch-topk | best peer ÷ dmattn |"), "{select}");
        assert!(select.contains("| case | bias | dmattn ms | dmattn GB/s read | read + written GB/s (% of copy) | torch-create-mask | best peer ÷ dmattn |"), "{select}");
        assert!(!select.contains("TF/s"), "{select}");
        // The 4 GiB per-query bias in 2 ms: 2147 GB/s read; with the 256 MiB of index lists
        // written, 2282 GB/s, 76% of the copy; torch.topk 4x slower.
        assert!(
            select.contains("| q 32768 k 32768 per-query/indices | [1, 2, 32768, 32768] | 2.000 | 2147 | 2282 (76%) | 8.000 (4.00×) | 4.00× (torch-topk) |"),
            "{select}"
        );
        // The bool mask's 2 GiB written count too; the chunked peer is marked and its note listed.
        assert!(select.contains("| q 32768 k 32768 per-query/mask | [1, 2, 32768, 32768] | 4.000 | 1074 | 1611 (54%) | 30.000† (7.50×) | 7.50× (torch-create-mask) |"), "{select}");
        assert!(select.contains("- torch-create-mask †: in chunks of 2048 rows"), "{select}");
        // A failed dmattn row keeps its peer's time and no speedup.
        assert!(select.contains("| q 32768 k 32768 key-side+causal/indices | [1, 1, 1, 32768] within causal [1, 1, 32768, 32768] | oom |  |  | 5.000 | — |"), "{select}");
        // Where torch is faster, dmattn trails: the 32K row.
        assert!(select.contains("| q 1 k 32768 key-side/indices | [1, 1, 1, 32768] | 0.010 | 7 | 7 (0%) | 0.005 (0.50×) | 0.50× (torch-topk) |"), "{select}");
        assert_eq!(behind(&run).iter().map(|b| b.0.as_str()).collect::<Vec<_>>(), [row32k.as_str()]);
        // Cases that did not run show as such; the llm group keeps its TF/s table.
        assert!(select.contains("| q 1 k 524288 key-side/indices | [1, 1, 1, 524288] | — |  |  | — | — |"), "{select}");
        assert!(md[md.find("## llm").unwrap()..].contains("| case | dmattn ms | dmattn TF/s dense-eq / computed | flex | best peer ÷ dmattn |"), "{md}");
    }

    #[test]
    fn sparse_group_prep_records_and_mask_memory() {
        use dmattn_bench::results::MaskMemory;
        let cases = grid(false, &["sparse".into()]);
        let w = &cases.iter().find(|c| c.id == "sparse/d64/q16384/k16384/causal+window1024").unwrap().id;
        let prep = |imp: &str, ms: f64, bytes: u64| Record { bytes: Some(bytes), ..rec(w, imp, Pass::Prep, Some(ms)) };
        let mut dm = results("dmattn-bench", vec![rec(w, "dmattn", Pass::Fwd, Some(2.0)), prep("dmattn", 0.01, 0)]);
        dm.mask_memory = vec![MaskMemory {
            form: "block_bitset(128), 50 % random".into(),
            batch: 1,
            heads: 1,
            seqlen_q: 32768,
            seqlen_k: 32768,
            input_bytes: 65536,
            prepared_bytes: 262144,
            dense_bool_bytes: 1 << 30,
            prepare_ms: Some(0.05),
            note: String::new(),
        }];
        let peers = results("peers", vec![rec(w, "flex", Pass::Fwd, Some(3.0)), prep("flex", 1.5, 2048)]);
        let run = Run { set: CaseSet { dtype: "bf16".into(), warmup: 1, reps: 1, cases }, tools: vec![dm, peers] };
        let md = markdown(&run, None);
        // The group mixes head dims: rows and header say which.
        assert!(md.contains("dim 128 and 64") && md.contains("| d64 q 16384 k 16384 causal+window1024 | 2.000 |"), "{md}");
        assert!(md.contains("| dmattn ms | dmattn bytes | flex ms | flex bytes |"), "{md}");
        assert!(md.contains("| d64 q 16384 k 16384 causal+window1024 | 0.010 | 0 B | 1.500 | 2.0 KiB |"), "{md}");
        assert!(md.contains("| block_bitset(128), 50 % random | 32768 × 32768 | 64.0 KiB | 256.0 KiB | 1.0 GiB | 2.44e-4 | 0.050 |"), "{md}");
        // A prep record is no forward or backward: dmattn trails nowhere.
        assert!(behind(&run).is_empty());
    }
}
