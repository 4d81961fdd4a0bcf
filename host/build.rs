//! Chooses the PTX the library embeds. The modules committed in `ptx/` (zstd-compressed, with the
//! digest of the kernel sources they were built from in `ptx/SOURCES`) serve every user: the
//! packaged crate, which carries no kernel sources, and any checkout whose kernel sources match
//! the digest. Where they do not match (a kernel developer's edit), or `DMATTN_PTX_FROM_SOURCE=1`,
//! the kernels are built here with their pinned nightly (installed through rustup where missing)
//! and embedded as text; `cargo xtask ptx` then updates `ptx/`.
use dmattn_ptx_builder::{KernelSources, MODULES, link_if_invoked};
use std::env;
use std::path::PathBuf;
use std::process::ExitCode;

/// Set when the build embeds freshly built PTX text rather than the committed modules.
const FROM_SOURCE_CFG: &str = "dmattn_kernels_from_source";

fn main() -> ExitCode {
    // rustc calls this same executable back as the nvptx linker.
    if let Some(code) = link_if_invoked() {
        return code;
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    println!("cargo::rustc-check-cfg=cfg({FROM_SOURCE_CFG})");
    println!("cargo::rerun-if-changed=ptx");
    println!("cargo::rerun-if-env-changed=DMATTN_PTX_FROM_SOURCE");
    let Some(sources) = KernelSources::beside(&manifest) else {
        return ExitCode::SUCCESS; // the packaged crate: the committed modules
    };
    for input in sources.inputs() {
        println!("cargo::rerun-if-changed={}", input.display());
    }
    let forced = env::var_os("DMATTN_PTX_FROM_SOURCE").is_some_and(|v| v == "1");
    if !forced && sources.built_into(&manifest.join("ptx")).expect("read the kernel sources") {
        return ExitCode::SUCCESS;
    }
    if !forced {
        println!("cargo::warning=the kernel sources differ from those of the committed PTX (host/ptx): building them with the pinned nightly; `cargo xtask ptx` updates host/ptx");
    }
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for module in MODULES {
        let ptx = sources.build(&module, &out.join(format!("kernels-{}", module.arch)));
        std::fs::copy(&ptx, out.join(module.file())).expect("copy the built PTX into OUT_DIR");
    }
    println!("cargo::rustc-cfg={FROM_SOURCE_CFG}");
    ExitCode::SUCCESS
}
