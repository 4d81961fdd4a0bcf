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
    // sm_80 PTX runs on Ampere and (JIT-compiled by the driver) on Hopper; an sm_90a module for
    // wgmma/TMA kernels will be a second PtxBuild here.
    let ptx = PtxBuild { crate_dir: kernels, arch: "sm_80", ptx_isa: "ptx78", target_dir: out.join("kernels") }.build();
    let text = std::fs::read(&ptx).expect("read the built PTX");
    std::fs::write(out.join("dmattn_sm80.ptx"), &text).expect("write PTX into OUT_DIR");
    std::fs::write(out.join("dmattn_sm80.ptx.deflate"), miniz_oxide::deflate::compress_to_vec(&text, 9)).expect("write deflated PTX");
    ExitCode::SUCCESS
}
