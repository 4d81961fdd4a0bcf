//! Builds dmattn's `#![no_std]` kernel crate to PTX, the job `cuda_builder` does elsewhere, and
//! says whether the PTX committed beside the host crate (`host/ptx/`) is the build of the kernel
//! sources present.
//!
//! rustc compiles the crate for `nvptx64-nvidia-cuda` (with `-Zbuild-std=core`) on the pinned
//! nightly named by the kernel crate's `rust-toolchain.toml`, and then calls the target's linker
//! with LLVM bitcode objects. The usual linker (`llvm-bitcode-linker`) is not distributable here,
//! so the calling program names *itself* as the linker: run [`link_if_invoked`] first thing in
//! `main`, and when rustc calls back it links the bitcode with the nightly's `llvm-tools`
//! (`llvm-link`, `opt`, `llc`) and writes the PTX.
//!
//! Only kernel developers need the nightly: everyone else builds against the committed modules.
use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Set on the nested cargo so that the build script knows rustc is calling it as the linker.
const LINKER_MODE: &str = "DMATTN_PTX_LINKER_MODE";
/// Where the linker finds `llvm-link`, `opt` and `llc`.
const LLVM_BIN: &str = "DMATTN_PTX_LLVM_BIN";
const TARGET: &str = "nvptx64-nvidia-cuda";

/// One PTX module the host loads.
#[derive(Clone, Copy, Debug)]
pub struct Module {
    /// File stem: `dmattn_{name}.ptx`.
    pub name: &'static str,
    /// GPU architecture, e.g. `sm_80`.
    pub arch: &'static str,
    /// PTX ISA feature, e.g. `ptx78`.
    pub ptx_isa: &'static str,
}

impl Module {
    /// The PTX file's name.
    pub fn file(&self) -> String {
        format!("dmattn_{}.ptx", self.name)
    }
}

/// sm_80 PTX runs on Ampere and (JIT-compiled by the driver) on Hopper; the sm_90a module holds
/// the kernels that use Hopper's wgmma, loaded only on compute capability 9.0 (PTX ISA 8.3 for
/// `fence.proxy.tensormap`).
pub const MODULES: [Module; 2] =
    [Module { name: "sm80", arch: "sm_80", ptx_isa: "ptx78" }, Module { name: "sm90a", arch: "sm_90a", ptx_isa: "ptx83" }];

/// The files whose contents decide the PTX, relative to the workspace root: the kernel crate (its
/// sources, manifest, lock file and pinned toolchain), the ABI it shares with the host, and this
/// link step.
const KERNEL_INPUTS: [&str; 7] = [
    "kernels-gpu/Cargo.toml",
    "kernels-gpu/Cargo.lock",
    "kernels-gpu/rust-toolchain.toml",
    "kernels-gpu/src",
    "abi/Cargo.toml",
    "abi/src",
    "ptx-builder/src",
];

/// The file beside committed PTX that names the sources it was built from.
pub const STAMP: &str = "SOURCES";

/// The kernel sources of a workspace checkout; absent from the packaged crate.
pub struct KernelSources {
    /// The workspace root.
    pub root: PathBuf,
}

impl KernelSources {
    /// The sources beside a host crate at `host_dir`, if they are there (a git or path
    /// dependency, or the workspace itself; not the packaged crate).
    pub fn beside(host_dir: &Path) -> Option<Self> {
        let root = host_dir.parent()?;
        root.join("kernels-gpu/src/lib.rs").is_file().then(|| KernelSources { root: root.to_path_buf() })
    }

    /// The crate the kernels are compiled from.
    pub fn kernel_crate(&self) -> PathBuf {
        self.root.join("kernels-gpu")
    }

    /// Every input file and directory, for `cargo:rerun-if-changed`.
    pub fn inputs(&self) -> impl Iterator<Item = PathBuf> + '_ {
        KERNEL_INPUTS.iter().map(|p| self.root.join(p))
    }

    /// A digest of every input file (relative path and contents, line endings normalised so that
    /// a checkout with CRLF endings agrees): equal digests mean the same PTX from the pinned
    /// toolchain. FNV-1a, 64 bits: it detects edits, it is not a security hash.
    pub fn digest(&self) -> std::io::Result<String> {
        let mut files = Vec::new();
        for input in KERNEL_INPUTS {
            collect_files(&self.root, Path::new(input), &mut files)?;
        }
        files.sort();
        let mut h = Fnv1a::default();
        for rel in files {
            let bytes = std::fs::read(self.root.join(&rel))?;
            let text: Vec<u8> = bytes.iter().enumerate().filter(|&(i, &b)| !(b == b'\r' && bytes.get(i + 1) == Some(&b'\n'))).map(|(_, &b)| b).collect();
            let name = rel.to_string_lossy().replace('\\', "/");
            h.write(&(name.len() as u64).to_le_bytes());
            h.write(name.as_bytes());
            h.write(&(text.len() as u64).to_le_bytes());
            h.write(&text);
        }
        Ok(format!("{:016x}", h.0))
    }

    /// Whether the PTX committed in `dir` was built from these sources: its stamp
    /// ([`KernelSources::stamp`]) names their digest.
    pub fn built_into(&self, dir: &Path) -> std::io::Result<bool> {
        let stamp = std::fs::read_to_string(dir.join(STAMP)).unwrap_or_default();
        Ok(stamp.split_whitespace().next() == Some(self.digest()?.as_str()))
    }

    /// The stamp written beside PTX built from these sources: their digest, then the channel.
    pub fn stamp(&self) -> std::io::Result<String> {
        Ok(format!("{} {}\n", self.digest()?, self.channel()))
    }

    /// The pinned nightly's channel, from the kernel crate's `rust-toolchain.toml`.
    pub fn channel(&self) -> String {
        let path = self.kernel_crate().join("rust-toolchain.toml");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("channel"))
            .filter_map(|rest| rest.trim().strip_prefix('='))
            .map(|v| v.trim().trim_matches('"').to_string())
            .next()
            .unwrap_or_else(|| panic!("{} names no channel", path.display()))
    }

    /// Builds `module` with the pinned nightly (installed through rustup where missing) into
    /// `target_dir` and returns the path of the PTX file. Panics with the compiler's message on
    /// failure: this runs inside build scripts and xtask, where a panic is the error report.
    pub fn build(&self, module: &Module, target_dir: &Path) -> PathBuf {
        let toolchain = Nightly::ensure(&self.channel());
        let me = env::current_exe().expect("path of the running program");
        let rustflags = [format!("-Ctarget-cpu={}", module.arch), format!("-Ctarget-feature=+{}", module.ptx_isa)].join("\x1f");
        let mut cmd = toolchain.command("cargo");
        cmd.current_dir(self.kernel_crate())
            .args(["build", "--release", "--locked", "--target", TARGET, "-Zbuild-std=core"])
            .arg("--target-dir")
            .arg(target_dir)
            .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
            .env("CARGO_TARGET_NVPTX64_NVIDIA_CUDA_LINKER", &me)
            .env(LINKER_MODE, "1")
            .env(LLVM_BIN, &toolchain.llvm_bin);
        // The outer build's settings (a stable cargo's own rustc among them) must not leak into
        // the device build.
        for var in [
            "CARGO", "RUSTC", "RUSTDOC", "RUSTC_WRAPPER", "RUSTC_WORKSPACE_WRAPPER", "RUSTFLAGS", "RUSTUP_TOOLCHAIN",
            "CARGO_BUILD_TARGET", "CARGO_TARGET_DIR", "CARGO_BUILD_RUSTC", "CARGO_BUILD_RUSTC_WRAPPER",
        ] {
            cmd.env_remove(var);
        }
        let status = cmd.status().expect("failed to run cargo for the kernel crate");
        assert!(status.success(), "building the kernel crate for {TARGET} ({}) failed", module.arch);
        let name = crate_name(&self.kernel_crate());
        target_dir.join(TARGET).join("release").join(format!("{name}.ptx"))
    }
}

/// Every file under `rel` (a file or a directory) in `root`.
fn collect_files(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let path = root.join(rel);
    if path.is_dir() {
        for entry in std::fs::read_dir(&path)? {
            collect_files(root, &rel.join(entry?.file_name()), out)?;
        }
    } else {
        out.push(rel.to_path_buf());
    }
    Ok(())
}

struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// The pinned nightly, run through rustup.
struct Nightly {
    channel: String,
    /// Its `llvm-tools` binaries.
    llvm_bin: PathBuf,
}

impl Nightly {
    /// The toolchain `channel` with the components the device build needs, installed through
    /// rustup where missing (rustup no longer installs a `rust-toolchain.toml`'s channel on
    /// first use).
    fn ensure(channel: &str) -> Nightly {
        let mut nightly = Nightly { channel: channel.to_string(), llvm_bin: PathBuf::new() };
        if let Some(sysroot) = nightly.sysroot()
            && sysroot.join("lib/rustlib/src/rust/library/core").is_dir()
            && let Some(bin) = nightly.llvm_bin(&sysroot)
            && bin.join("llc").exists()
        {
            nightly.llvm_bin = bin;
            return nightly;
        }
        println!("cargo:warning=installing the kernels' pinned toolchain {channel} (rust-src, llvm-tools) through rustup");
        let status = Command::new("rustup")
            .args(["toolchain", "install", channel, "--profile", "minimal", "--component", "rust-src,llvm-tools"])
            .status()
            .unwrap_or_else(|e| panic!("building the kernels needs rustup to install {channel}: {e}"));
        assert!(status.success(), "rustup toolchain install {channel} failed");
        let sysroot = nightly.sysroot().unwrap_or_else(|| panic!("{channel} is not usable after installing it"));
        nightly.llvm_bin = nightly.llvm_bin(&sysroot).unwrap_or_else(|| panic!("{channel}'s rustc names no host"));
        assert!(nightly.llvm_bin.join("llc").exists(), "{} has no llc after installing llvm-tools", nightly.llvm_bin.display());
        nightly
    }

    /// `program` of this toolchain, through `rustup run`.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("rustup");
        cmd.args(["run", &self.channel, program]);
        cmd
    }

    /// What this toolchain's rustc prints for `args`, if it runs.
    fn rustc(&self, args: &[&str]) -> Option<String> {
        let out = self.command("rustc").args(args).env_remove("RUSTUP_TOOLCHAIN").output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn sysroot(&self) -> Option<PathBuf> {
        self.rustc(&["--print", "sysroot"]).map(|s| PathBuf::from(s.trim()))
    }

    /// The `llvm-tools` binaries under `sysroot`, in the directory of rustc's host triple.
    fn llvm_bin(&self, sysroot: &Path) -> Option<PathBuf> {
        let host = self.rustc(&["-vV"])?.lines().find_map(|l| l.strip_prefix("host: ").map(str::to_string))?;
        Some(sysroot.join("lib/rustlib").join(host).join("bin"))
    }
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
    std::fs::write(&text, shared_casts_visible(&mark_collective_asm_convergent(&ir))).map_err(|e| e.to_string())?;
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
        .arg(&output))?;
    let ptx = std::fs::read_to_string(&output).map_err(|e| format!("{}: {e}", output.display()))?;
    std::fs::write(&output, with_launch_bounds(&ptx, &dmattn_abi::LAUNCH_BOUNDS)).map_err(|e| e.to_string())
}

/// The PTX with `.maxntid` and `.minnctapersm` after the parameter list of each listed entry
/// present in it (rustc has no attribute for them; ptxas bounds the entry's registers by them).
fn with_launch_bounds(ptx: &str, bounds: &[(&str, u32, u32)]) -> String {
    let mut out = String::with_capacity(ptx.len() + 64 * bounds.len());
    let mut pending = None;
    for line in ptx.lines() {
        out.push_str(line);
        out.push('\n');
        if let Some(entry) = line.trim_start().strip_prefix(".visible .entry ").or_else(|| line.trim_start().strip_prefix(".entry ")) {
            let name = entry.split('(').next().unwrap_or("").trim();
            pending = bounds.iter().find(|b| b.0 == name).map(|&(_, threads, ctas)| (threads, ctas));
        }
        if let Some((threads, ctas)) = pending {
            // The parameter list ends on a line of its own (or the entry's line when empty),
            // which llc follows with a comment.
            if line.split("//").next().unwrap_or("").trim_end().ends_with(')') {
                out.push_str(&format!(".maxntid {threads}, 1, 1\n.minnctapersm {ctas}\n"));
                pending = None;
            }
        }
    }
    out
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

/// The inline asm by which the kernels (`arch::smem_ref`) turn a shared-window address into a
/// generic pointer, as rustc writes it in textual IR.
const CVTA_SHARED: &str = " asm \"cvta.shared.u64 ${0}, ${1};\"";

/// Rewrites each `cvta.shared.u64` inline asm into the IR cast it stands for (`inttoptr` to a
/// shared pointer, `addrspacecast` to generic, `ptrtoint`), so that LLVM's address-space
/// inference sees where the pointer points and reads through it with `ld.shared`. Rust has no
/// shared pointer type, and through the asm LLVM saw only a generic pointer: every field read
/// of the backward's parameter copy in shared memory compiled to a generic load, which takes
/// the global load path (queued behind the dQ reductions). A line it cannot parse is kept: the
/// asm computes the same address.
fn shared_casts_visible(ir: &str) -> String {
    let mut out = String::with_capacity(ir.len() + 4096);
    for line in ir.lines() {
        let cast = line.contains(CVTA_SHARED).then(|| {
            let (lhs, rhs) = line.split_once(" = ")?;
            let name = lhs.trim().strip_prefix('%')?;
            let arg = rhs.split_once("(i64 ")?.1.split(')').next()?;
            (!name.is_empty() && !arg.is_empty()).then_some((lhs.trim(), name, arg))
        });
        match cast.flatten() {
            Some((result, name, arg)) => {
                let (shared, generic) = (format!("%dmattn.shared.{name}"), format!("%dmattn.generic.{name}"));
                out.push_str(&format!("  {shared} = inttoptr i64 {arg} to ptr addrspace(3)\n"));
                out.push_str(&format!("  {generic} = addrspacecast ptr addrspace(3) {shared} to ptr\n"));
                out.push_str(&format!("  {result} = ptrtoint ptr {generic} to i64"));
            }
            None => out.push_str(line),
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
    fn shared_address_asm_becomes_the_casts_it_stands_for() {
        let ir = concat!(
            "  %240 = tail call i64 asm \"cvta.shared.u64 ${0}, ${1};\", \"=&l,l\"(i64 %239) #8, !srcloc !12\n",
            "  %p.i = tail call i64 asm \"cvta.shared.u64 ${0}, ${1};\", \"=&l,l\"(i64 %at.i) #8\n",
            "  %3 = tail call i64 asm \"cvta.global.u64 ${0}, ${1};\", \"=&l,l\"(i64 %2) #8\n",
        );
        let out = shared_casts_visible(ir);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "  %dmattn.shared.240 = inttoptr i64 %239 to ptr addrspace(3)",
                "  %dmattn.generic.240 = addrspacecast ptr addrspace(3) %dmattn.shared.240 to ptr",
                "  %240 = ptrtoint ptr %dmattn.generic.240 to i64",
                "  %dmattn.shared.p.i = inttoptr i64 %at.i to ptr addrspace(3)",
                "  %dmattn.generic.p.i = addrspacecast ptr addrspace(3) %dmattn.shared.p.i to ptr",
                "  %p.i = ptrtoint ptr %dmattn.generic.p.i to i64",
                "  %3 = tail call i64 asm \"cvta.global.u64 ${0}, ${1};\", \"=&l,l\"(i64 %2) #8",
            ]
        );
    }

    /// A scratch workspace holding every kernel input.
    fn scratch(name: &str, lib: &[u8]) -> KernelSources {
        let root = env::temp_dir().join(format!("dmattn-ptx-builder-{name}-{}", std::process::id()));
        for dir in ["kernels-gpu/src", "abi/src", "ptx-builder/src"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        for file in ["kernels-gpu/Cargo.toml", "kernels-gpu/Cargo.lock", "abi/Cargo.toml", "abi/src/lib.rs", "ptx-builder/src/lib.rs"] {
            std::fs::write(root.join(file), format!("{file}\n")).unwrap();
        }
        std::fs::write(root.join("kernels-gpu/rust-toolchain.toml"), "[toolchain]\nchannel = \"nightly-2000-01-01\"\n").unwrap();
        std::fs::write(root.join("kernels-gpu/src/lib.rs"), lib).unwrap();
        KernelSources::beside(&root.join("host")).expect("the scratch workspace has kernel sources")
    }

    #[test]
    fn digest_follows_contents_not_line_endings() {
        let a = scratch("a", b"fn k() {}\n// x\n");
        let crlf = scratch("crlf", b"fn k() {}\r\n// x\r\n");
        let edited = scratch("edited", b"fn k() {}\n// y\n");
        assert_eq!(a.digest().unwrap(), crlf.digest().unwrap());
        assert_ne!(a.digest().unwrap(), edited.digest().unwrap());
        // A new file is an input too.
        std::fs::write(a.root.join("kernels-gpu/src/extra.rs"), "").unwrap();
        assert_ne!(a.digest().unwrap(), crlf.digest().unwrap());
        assert_eq!(a.channel(), "nightly-2000-01-01");
        for s in [a, crlf, edited] {
            std::fs::remove_dir_all(&s.root).unwrap();
        }
    }

    #[test]
    fn launch_bounds_follow_the_listed_entries_parameter_lists() {
        let ptx = ".visible .entry a(\n\t.param .u64 a_param_0\n)   // @a\n{\n\tret;\n}\n.visible .entry b(\n\t.param .u64 b_param_0\n)\n{\n}\n.entry c()\n{\n}\n";
        let out = with_launch_bounds(ptx, &[("a", 256, 4), ("c", 128, 2)]);
        assert_eq!(
            out,
            ".visible .entry a(\n\t.param .u64 a_param_0\n)   // @a\n.maxntid 256, 1, 1\n.minnctapersm 4\n{\n\tret;\n}\n\
             .visible .entry b(\n\t.param .u64 b_param_0\n)\n{\n}\n.entry c()\n.maxntid 128, 1, 1\n.minnctapersm 2\n{\n}\n"
        );
    }

    #[test]
    fn rejects_unknown_arguments() {
        assert!(parse_args(&os(&["--whole-archive"])).is_err());
        assert!(parse_args(&os(&["-o"])).is_err());
    }
}
