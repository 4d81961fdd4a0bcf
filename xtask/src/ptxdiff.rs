//! `cargo xtask ptx-diff [--base REV]`: what a change did to the committed PTX (`host/ptx`), kernel
//! by kernel, against the modules committed at `REV` (default `HEAD`; run it after `cargo xtask
//! ptx`). A kernel refactor that claims to leave the kernels alone shows here as `same`; where
//! LLVM only renumbered registers or labels, as `renumbered`; otherwise the instruction counts
//! and the opcodes whose counts moved. Register pressure is `cargo xtask ptxas`'s to judge.
use crate::{ptx, root};
use dmattn_ptx_builder::{MODULES, Module};
use std::collections::BTreeMap;
use std::process::Command;

/// A kernel's body: its lines without comments and blank lines (`text`), and the same with every
/// register number and label erased (`shape`).
#[derive(Debug, PartialEq)]
struct Body {
    text: Vec<String>,
    shape: Vec<String>,
}

/// How a kernel changed between two builds.
#[derive(Debug, PartialEq)]
enum Change {
    Same,
    /// Equal once register numbers and labels are erased.
    Renumbered,
    /// The same instructions in another order.
    Reordered,
    /// Instruction counts before and after, and the opcodes whose counts differ (after - before).
    Changed { before: usize, after: usize, opcodes: BTreeMap<String, i64> },
}

/// Erases register numbers (`%r12` -> `%r`) and labels (`$L__BB0_3` -> `$L`) from `line`.
fn erase_numbers(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '%' || c == '$' {
            // The register class or label prefix stays, its number goes.
            while let Some(&n) = chars.peek() {
                if n.is_ascii_alphabetic() || n == '_' {
                    out.push(n);
                    chars.next();
                } else {
                    break;
                }
            }
            while chars.peek().is_some_and(|n| n.is_ascii_digit() || *n == '_') {
                chars.next();
            }
        }
    }
    out
}

/// The `.entry` kernels of a PTX module, by name.
fn kernels(ptx: &str) -> BTreeMap<String, Body> {
    let mut out = BTreeMap::new();
    for part in ptx.split(".entry ").skip(1) {
        let name = part.split('(').next().unwrap_or_default().trim().to_string();
        // The first line is the name and the parameters' opening parenthesis.
        let text: Vec<String> = part
            .lines()
            .skip(1)
            .map(|l| l.split("//").next().unwrap_or_default().trim().to_string())
            .filter(|l| !l.is_empty() && !l.starts_with(".visible"))
            .collect();
        let shape = text.iter().map(|l| erase_numbers(l)).collect();
        out.insert(name, Body { text, shape });
    }
    out
}

/// The instructions of a body: lines that are not directives, braces or labels.
fn instructions(body: &Body) -> impl Iterator<Item = &String> {
    body.shape.iter().filter(|l| !l.starts_with('.') && !l.ends_with(':') && !matches!(l.as_str(), "{" | "}" | ")" | "("))
}

/// Each instruction's opcode (a predicate guard counts with it: `@%p bra`).
fn opcode(line: &str) -> String {
    let mut words = line.split_whitespace();
    let first = words.next().unwrap_or_default();
    if first.starts_with('@') { format!("{first} {}", words.next().unwrap_or_default()) } else { first.to_string() }
}

fn change(before: &Body, after: &Body) -> Change {
    if before.text == after.text {
        return Change::Same;
    }
    if before.shape == after.shape {
        return Change::Renumbered;
    }
    let count = |b: &Body| {
        let mut m = BTreeMap::<String, i64>::new();
        for i in instructions(b) {
            *m.entry(opcode(i)).or_default() += 1;
        }
        m
    };
    let (cb, ca) = (count(before), count(after));
    let mut opcodes = BTreeMap::new();
    for op in cb.keys().chain(ca.keys()) {
        let d = ca.get(op).copied().unwrap_or(0) - cb.get(op).copied().unwrap_or(0);
        if d != 0 {
            opcodes.insert(op.clone(), d);
        }
    }
    if opcodes.is_empty() {
        return Change::Reordered;
    }
    Change::Changed { before: instructions(before).count(), after: instructions(after).count(), opcodes }
}

/// The module committed at `rev`.
fn committed_at(rev: &str, module: &Module) -> Result<String, String> {
    let spec = format!("{rev}:host/ptx/{}.zst", module.file());
    let out = Command::new("git").args(["show", &spec]).current_dir(root()).output().map_err(|e| format!("git show {spec}: {e}"))?;
    if !out.status.success() {
        return Err(format!("git show {spec}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let text = zstd::decode_all(&out.stdout[..]).map_err(|e| format!("{spec}: {e}"))?;
    String::from_utf8(text).map_err(|e| format!("{spec}: {e}"))
}

pub fn run(base: &str) -> Result<(), String> {
    for module in MODULES {
        let (before, after) = (kernels(&committed_at(base, &module)?), kernels(&ptx::committed(&module)?));
        let mut tally = BTreeMap::<&str, usize>::new();
        let mut lines = Vec::new();
        for (name, b) in &after {
            let Some(a) = before.get(name) else {
                lines.push(format!("  added      {name}"));
                continue;
            };
            match change(a, b) {
                Change::Same => *tally.entry("same").or_default() += 1,
                Change::Renumbered => *tally.entry("renumbered").or_default() += 1,
                Change::Reordered => lines.push(format!("  reordered  {name}")),
                Change::Changed { before, after, opcodes } => {
                    let ops: Vec<String> = opcodes.iter().map(|(op, d)| format!("{op} {d:+}")).collect();
                    lines.push(format!("  changed    {name}: {before} -> {after} instructions ({})", ops.join(", ")));
                }
            }
        }
        for name in before.keys().filter(|n| !after.contains_key(*n)) {
            lines.push(format!("  removed    {name}"));
        }
        let tally: Vec<String> = tally.iter().map(|(k, n)| format!("{n} {k}")).collect();
        println!("{} against {base}: {} kernels; {}", module.file(), after.len(), if tally.is_empty() { "none unchanged".into() } else { tally.join(", ") });
        for l in lines {
            println!("{l}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(body_a: &str, body_b: &str) -> String {
        format!(
            "// header\n.visible .entry k_a(\n.param .u64 p\n)\n{{\n{body_a}\n}}\n.visible .entry k_b(\n.param .u64 p\n)\n{{\n{body_b}\n}}\n"
        )
    }

    #[test]
    fn kinds_of_change() {
        let before = kernels(&module("mov.u32 %r1, %tid.x;\n$L__BB0_1:\nadd.s32 %r2, %r1, 1; // note\n@%p1 bra $L__BB0_1;", "add.s32 %r1, %r1, 1;\nmul.lo.s32 %r2, %r1, 3;"));
        let same = kernels(&module("mov.u32 %r1, %tid.x;\n$L__BB0_1:\nadd.s32 %r2, %r1, 1;\n@%p1 bra $L__BB0_1;", "mul.lo.s32 %r2, %r1, 3;\nadd.s32 %r1, %r1, 1;"));
        assert_eq!(change(&before["k_a"], &same["k_a"]), Change::Same, "comments do not count");
        assert_eq!(change(&before["k_b"], &same["k_b"]), Change::Reordered);
        let renumbered = kernels(&module("mov.u32 %r7, %tid.x;\n$L__BB3_2:\nadd.s32 %r9, %r7, 1;\n@%p4 bra $L__BB3_2;", "add.s32 %r1, %r1, 1;"));
        assert_eq!(change(&before["k_a"], &renumbered["k_a"]), Change::Renumbered);
        let Change::Changed { before: nb, after: na, opcodes } = change(&before["k_b"], &renumbered["k_b"]) else { panic!("a removed instruction is a change") };
        assert_eq!((nb, na), (2, 1));
        assert_eq!(opcodes, BTreeMap::from([("mul.lo.s32".to_string(), -1)]));
    }

    #[test]
    fn numbers_erased_only_after_sigils() {
        assert_eq!(erase_numbers("ld.shared.v2.b32 {%r12, %r3}, [%rd40+16];"), "ld.shared.v2.b32 {%r, %r}, [%rd+16];");
        assert_eq!(erase_numbers("@%p12 bra $L__BB0_17;"), "@%p bra $L__BB;");
        assert_eq!(opcode("@%p bra $L__BB;"), "@%p bra");
    }
}
