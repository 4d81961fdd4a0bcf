//! Builds `kernels-gpu` to PTX (rustc's NVPTX backend, linked by `dmattn-ptx-builder`) and leaves
//! it in `OUT_DIR`: as text (for `cargo xtask ptxas`) and deflated, which the library embeds (the
//! text is ~8 MB, about a tenth of that deflated). Runs again only when the kernel or ABI sources change.
use dmattn_ptx_builder::{PtxBuild, link_if_invoked};
use std::env;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    // rustc calls this same executable back as the nvptx linker.
    if let Some(code) = link_if_invoked() {
        return code;
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let kernels = manifest.join("../kernels-gpu");
    for dir in ["../kernels-gpu/src", "../kernels-gpu/Cargo.toml", "../abi/src", "../ptx-builder/src"] {
        println!("cargo:rerun-if-changed={dir}");
    }
    // sm_80 PTX runs on Ampere and (JIT-compiled by the driver) on Hopper; the sm_90a module
    // holds the kernels that use Hopper's wgmma, loaded only on compute capability 9.0.
    for (arch, ptx_isa) in [("sm_80", "ptx78"), ("sm_90a", "ptx81")] {
        let ptx = PtxBuild { crate_dir: kernels.clone(), arch, ptx_isa, target_dir: out.join(format!("kernels-{arch}")) }.build();
        let text = std::fs::read(&ptx).expect("read the built PTX");
        let name = format!("dmattn_{}.ptx", arch.replace('_', ""));
        std::fs::write(out.join(&name), &text).expect("write PTX into OUT_DIR");
        std::fs::write(out.join(format!("{name}.deflate")), miniz_oxide::deflate::compress_to_vec(&text, 9)).expect("write deflated PTX");
    }
    ExitCode::SUCCESS
}
