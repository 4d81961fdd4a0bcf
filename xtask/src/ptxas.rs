//! `cargo xtask ptxas`: assemble the shipped PTX for each architecture, print every kernel's
//! registers, stack and spills, and fail if any kernel spills or has its `wgmma`s serialised by
//! ptxas (`docs/perf-notes.md`, "dQ's accumulator in the products' layout").
use std::path::{Path, PathBuf};
use std::process::Command;

fn find_ptxas(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = explicit.or_else(|| std::env::var_os("PTXAS").map(PathBuf::from)) {
        return Ok(p);
    }
    if Command::new("ptxas").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Ok("ptxas".into());
    }
    let out = Command::new("python3")
        .args(["-c", "import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])"])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let p = Path::new(&dir).join("bin/ptxas");
    if out.status.success() && p.exists() {
        Ok(p)
    } else {
        Err("no ptxas: pass --ptxas, set PTXAS, or `pip install nvidia-cuda-nvcc-cu12`".into())
    }
}

/// Per kernel: (name, registers, stack bytes, spill store bytes, spill load bytes).
fn parse(report: &str) -> Vec<(String, u32, u32, u32, u32)> {
    let mut rows = Vec::new();
    let mut name = None;
    let mut frame = (0, 0, 0);
    let nums = |l: &str| -> Vec<u32> { l.split(|c: char| !c.is_ascii_digit()).filter_map(|t| t.parse().ok()).collect() };
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            name = rest.split('\'').next().map(String::from);
        } else if line.contains("bytes stack frame") && name.is_some() {
            let n = nums(line);
            frame = (n[0], n[1], n[2]);
        } else if line.contains("Used")
            && line.contains("registers")
            && let Some(n) = name.take()
        {
            rows.push((n, nums(line.split("Used").nth(1).unwrap())[0], frame.0, frame.1, frame.2));
        }
    }
    rows
}

/// The kernels whose `wgmma`s ptxas serialises, with its reason (e.g. C7520: a warpgroup arrive
/// it had to insert on a path it cannot prove uniform, as where accumulators are written between
/// a group's `wgmma.fence` and its first `wgmma`).
fn serialised_wgmma(report: &str) -> Vec<(String, String)> {
    report
        .lines()
        .filter(|l| l.contains("wgmma.mma_async instructions are serialized"))
        .map(|l| {
            let name = l.rsplit("function '").next().and_then(|r| r.split('\'').next()).unwrap_or("?");
            let why = l.split("info    : ").nth(1).unwrap_or(l).split(" in the function").next().unwrap_or(l);
            (name.to_string(), why.trim().to_string())
        })
        .collect()
}

/// Checks the portable module for each of `archs`, and the Hopper module for sm_90a (the only
/// GPU it runs on).
pub fn run(ptxas: Option<PathBuf>, archs: &[String]) -> Result<(), String> {
    let ptxas = find_ptxas(ptxas)?;
    let dir = crate::root().join("target/ptxas");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut failures = Vec::new();
    let sm90a = ["sm_90a".to_string()];
    for (module, arch) in archs.iter().map(|a| ("sm80", a)).chain(sm90a.iter().map(|a| ("sm90a", a))) {
        let module = crate::ptx::module(module);
        let ptx = dir.join(module.file());
        std::fs::write(&ptx, crate::ptx::embedded(&module)?).map_err(|e| e.to_string())?;
        let out = Command::new(&ptxas)
            .args([&format!("-arch={arch}"), "-v", "-o", "/dev/null"])
            .arg(&ptx)
            .output()
            .map_err(|e| format!("{}: {e}", ptxas.display()))?;
        let report = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(format!("ptxas -arch={arch} failed:\n{report}"));
        }
        let mut rows = parse(&report);
        rows.sort();
        println!("ptxas -arch={arch} ({})", module.file());
        println!("{:<30} {:>5} {:>6} {:>13}", "kernel", "regs", "stack", "spill st/ld");
        for (name, regs, stack, st, ld) in &rows {
            println!("{name:<30} {regs:>5} {stack:>6} {:>13}", format!("{st}/{ld}"));
            if stack + st + ld > 0 {
                failures.push(format!("{name} on {arch}: {stack} B stack, {st}/{ld} B spilled"));
            }
        }
        if rows.is_empty() {
            return Err(format!("ptxas -arch={arch} reported no kernels"));
        }
        for (name, why) in serialised_wgmma(&report) {
            failures.push(format!("{name} on {arch}: wgmma serialised, {why}"));
        }
    }
    if failures.is_empty() { Ok(()) } else { Err(format!("kernels spill or serialise their wgmma:\n  {}", failures.join("\n  "))) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialised_wgmma_names_the_kernel_and_the_reason() {
        let report = concat!(
            "ptxas info    : (C7519) warpgroup.arrive is injected in around line 3294 by compiler to allow use of registers in GMMA in function 'dmattn_bwd_a'\n",
            "ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due to program dependence on compiler-inserted WG.AR in divergent path in the function 'dmattn_bwd_b'\n",
        );
        let found = serialised_wgmma(report);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, "dmattn_bwd_b");
        assert!(found[0].1.starts_with("(C7520) Potential Performance Loss") && found[0].1.ends_with("divergent path"), "{}", found[0].1);
    }
}
