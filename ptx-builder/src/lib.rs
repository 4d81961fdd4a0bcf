//! Builds a `#![no_std]` kernel crate to PTX, the job `cuda_builder` does elsewhere.
//!
//! rustc compiles the crate for `nvptx64-nvidia-cuda` (with `-Zbuild-std=core`) and then calls
//! the target's linker with LLVM bitcode objects. The usual linker (`llvm-bitcode-linker`) is not
//! distributable here, so the calling build script names *itself* as the linker: run
//! [`link_if_invoked`] first thing in `main`, and when rustc calls back it links the bitcode with
//! the nightly's `llvm-tools` (`llvm-link`, `opt`, `llc`) and writes the PTX.
use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Set on the nested cargo so that the build script knows rustc is calling it as the linker.
const LINKER_MODE: &str = "DMATTN_PTX_LINKER_MODE";
/// Where the linker finds `llvm-link`, `opt` and `llc`.
const LLVM_BIN: &str = "DMATTN_PTX_LLVM_BIN";
const TARGET: &str = "nvptx64-nvidia-cuda";

/// One PTX module to build from a kernel crate.
pub struct PtxBuild {
    /// The kernel crate's directory (holding its `Cargo.toml`).
    pub crate_dir: PathBuf,
    /// GPU architecture, e.g. `sm_80`.
    pub arch: &'static str,
    /// PTX ISA feature, e.g. `ptx78`.
    pub ptx_isa: &'static str,
    /// Directory for the nested build's artifacts.
    pub target_dir: PathBuf,
}

impl PtxBuild {
    /// Compiles the crate and returns the path of the PTX file. Panics with the compiler's
    /// message on failure: this runs inside a build script, where a panic is the error report.
    pub fn build(&self) -> PathBuf {
        let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let me = env::current_exe().expect("build script path");
        let rustflags = [
            format!("-Ctarget-cpu={}", self.arch),
            format!("-Ctarget-feature=+{}", self.ptx_isa),
        ]
        .join("\x1f");
        let mut cmd = Command::new(cargo);
        cmd.current_dir(&self.crate_dir)
            .args(["build", "--release", "--target", TARGET, "-Zbuild-std=core"])
            .arg("--target-dir")
            .arg(&self.target_dir)
            .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
            .env("CARGO_TARGET_NVPTX64_NVIDIA_CUDA_LINKER", &me)
            .env(LINKER_MODE, "1")
            .env(LLVM_BIN, llvm_bin_dir());
        // The outer build's settings must not leak into the device build.
        for var in ["RUSTFLAGS", "CARGO_BUILD_TARGET", "CARGO_TARGET_DIR", "RUSTC_WORKSPACE_WRAPPER"] {
            cmd.env_remove(var);
        }
        let status = cmd.status().expect("failed to run cargo for the kernel crate");
        assert!(status.success(), "building the kernel crate for {TARGET} failed");
        let name = crate_name(&self.crate_dir);
        self.target_dir.join(TARGET).join("release").join(format!("{name}.ptx"))
    }
}

/// The `llvm-tools` binaries of the toolchain running this build.
fn llvm_bin_dir() -> PathBuf {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(rustc).args(["--print", "sysroot"]).output().expect("rustc --print sysroot");
    let sysroot = PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 sysroot").trim());
    let host = env::var("HOST").expect("HOST is set for build scripts");
    let bin = sysroot.join("lib/rustlib").join(host).join("bin");
    assert!(
        bin.join("llc").exists(),
        "{} has no llc: install the toolchain's llvm-tools component (rust-toolchain.toml lists it)",
        bin.display()
    );
    bin
}

/// The library name cargo gives the crate's artifact (its package name, `-` as `_`).
fn crate_name(dir: &Path) -> String {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("kernel crate manifest");
    let name = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("name"))
        .filter_map(|rest| rest.trim().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_string())
        .next()
        .expect("kernel crate manifest has a name");
    name.replace('-', "_")
}

/// If rustc invoked this process as the nvptx linker, link and return the exit code for `main`
/// to return. Otherwise `None`, and the build script goes on with its normal work.
pub fn link_if_invoked() -> Option<ExitCode> {
    env::var_os(LINKER_MODE)?;
    let args: Vec<OsString> = env::args_os().skip(1).collect();
    Some(match link(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("dmattn ptx linker: {msg}");
            ExitCode::FAILURE
        }
    })
}

/// What rustc asks of the linker for an nvptx cdylib.
#[derive(Debug, Default, PartialEq)]
struct LinkArgs {
    objects: Vec<PathBuf>,
    exports: Vec<String>,
    target_cpu: Option<String>,
    features: Vec<String>,
    output: Option<PathBuf>,
}

fn parse_args(args: &[OsString]) -> Result<LinkArgs, String> {
    let mut out = LinkArgs::default();
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| it.next().ok_or(format!("{flag} needs a value"));
        match arg.as_str() {
            "--export-symbol" => out.exports.push(value("--export-symbol")?),
            "--target-cpu" => out.target_cpu = Some(value("--target-cpu")?),
            "-o" => out.output = Some(value("-o")?.into()),
            "-L" | "--target" => {
                value(&arg)?;
            }
            a if a.starts_with("--target-feature=") => out.features.extend(
                a["--target-feature=".len()..].split(',').filter(|f| !f.is_empty()).map(String::from),
            ),
            a if a.ends_with(".o") => out.objects.push(a.into()),
            // Dependency rlibs: with fat LTO everything the kernels use is already in the
            // crate object; an undefined symbol is caught after linking.
            a if a.ends_with(".rlib") => {}
            "-O0" | "-O1" | "-O2" | "-O3" | "--debug" => {}
            other => return Err(format!("unexpected linker argument `{other}`")),
        }
    }
    Ok(out)
}

fn link(args: &[OsString]) -> Result<(), String> {
    let a = parse_args(args)?;
    let output = a.output.ok_or("no -o")?;
    let cpu = a.target_cpu.ok_or("no --target-cpu")?;
    if a.objects.is_empty() {
        return Err("no bitcode objects".into());
    }
    let bin = PathBuf::from(env::var_os(LLVM_BIN).ok_or("LLVM bin dir not set")?);
    let linked = output.with_extension("linked.bc");
    let text = output.with_extension("linked.ll");
    let optimized = output.with_extension("opt.bc");
    run(Command::new(bin.join("llvm-link")).args(&a.objects).arg("-S").arg("-o").arg(&text))?;
    let ir = std::fs::read_to_string(&text).map_err(|e| format!("{}: {e}", text.display()))?;
    std::fs::write(&text, mark_collective_asm_convergent(&ir)).map_err(|e| e.to_string())?;
    run(Command::new(bin.join("llvm-as")).arg(&text).arg("-o").arg(&linked))?;
    run(Command::new(bin.join("opt"))
        .arg("-passes=internalize,default<O3>,globaldce")
        .arg(format!("--internalize-public-api-list={}", a.exports.join(",")))
        // Tile loops have constant trip counts; unrolling them fully is what turns the
        // fragment arrays into registers instead of local memory.
        .args(["-unroll-threshold=100000", "-unroll-full-max-count=4096"])
        .arg(&linked)
        .arg("-o")
        .arg(&optimized))?;
    let undefined = Command::new(bin.join("llvm-nm"))
        .args(["--undefined-only", "--just-symbol-name"])
        .arg(&optimized)
        .output()
        .map_err(|e| format!("llvm-nm: {e}"))?;
    let undefined = String::from_utf8_lossy(&undefined.stdout);
    let missing: Vec<&str> = undefined.lines().filter(|s| !s.starts_with("llvm.")).collect();
    if !missing.is_empty() {
        return Err(format!("kernels reference symbols no object defines: {missing:?}"));
    }
    let mattr = a.features.join(",");
    run(Command::new(bin.join("llc"))
        .args(["-O3", &format!("-mcpu={cpu}"), &format!("-mattr={mattr}")])
        .arg(&optimized)
        .arg("-o")
        .arg(&output))
}

/// PTX instructions that a whole warp (or CTA) must execute together.
const COLLECTIVE: [&str; 7] = [".sync", "bar.", "barrier.", "vote.", "shfl.", "ldmatrix", "mma."];

/// Marks inline-asm call sites of collective instructions `convergent` in textual IR. rustc does
/// not, so LLVM may legally duplicate them into divergent branches (tail duplication, jump
/// threading), where an `.aligned` instruction is undefined and a `.sync` one can hang.
fn mark_collective_asm_convergent(ir: &str) -> String {
    let mut out = String::with_capacity(ir.len() + 4096);
    for line in ir.lines() {
        let asm = line.split_once(" asm ").and_then(|(call, rest)| {
            let template = rest.split('"').nth(1)?;
            (call.contains("call ") && COLLECTIVE.iter().any(|c| template.contains(c))).then_some(())
        });
        match asm {
            Some(()) if !line.contains(" convergent") => {
                // Function attributes follow the argument list: before `#N`, or before the
                // call's metadata, or at the end of the line.
                let end = line.find(", !").unwrap_or(line.len());
                let (head, tail) = line.split_at(end);
                let at = match head.rfind(" #") {
                    Some(i) if head[i + 2..].chars().all(|c| c.is_ascii_digit()) => i,
                    _ => head.len(),
                };
                out.push_str(&head[..at]);
                out.push_str(" convergent");
                out.push_str(&head[at..]);
                out.push_str(tail);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if status.success() { Ok(()) } else { Err(format!("{cmd:?} failed with {status}")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_what_rustc_passes() {
        let args = os(&[
            "--export-symbol", "k1", "--export-symbol", "k2", "/t/deps/kern.cgu.0.rcgu.o",
            "/t/deps/libcompiler_builtins-1.rlib", "-L", "/t/raw-dylibs", "--target",
            "nvptx64-nvidia-cuda", "--target-cpu", "sm_80", "--target-feature=+ptx78", "-L",
            "/sysroot/self-contained", "-o", "/t/deps/kern.ptx", "-O3", "--debug",
        ]);
        let a = parse_args(&args).unwrap();
        assert_eq!(a.exports, ["k1", "k2"]);
        assert_eq!(a.objects, [PathBuf::from("/t/deps/kern.cgu.0.rcgu.o")]);
        assert_eq!(a.target_cpu.as_deref(), Some("sm_80"));
        assert_eq!(a.features, ["+ptx78"]);
        assert_eq!(a.output, Some(PathBuf::from("/t/deps/kern.ptx")));
    }

    #[test]
    fn marks_only_collective_asm_convergent() {
        let ir = concat!(
            "  %1 = tail call i32 asm sideeffect \"shfl.sync.bfly.b32 ${0}, ${1}, 1, 0x1f, -1;\", \"=r,r\"(i32 %0) #3, !srcloc !2\n",
            "  tail call void asm sideeffect \"bar.sync 0;\", \"~{memory}\"()\n",
            "  %2 = tail call float asm \"ex2.approx.f32 ${0}, ${1};\", \"=r,r\"(float %x) #4, !srcloc !5\n",
        );
        let out = mark_collective_asm_convergent(ir);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].ends_with("(i32 %0) convergent #3, !srcloc !2"), "{}", lines[0]);
        assert!(lines[1].ends_with("() convergent"), "{}", lines[1]);
        assert!(!lines[2].contains("convergent"), "{}", lines[2]);
    }

    #[test]
    fn rejects_unknown_arguments() {
        assert!(parse_args(&os(&["--whole-archive"])).is_err());
        assert!(parse_args(&os(&["-o"])).is_err());
    }
}
