//! Builds `kernels-gpu` to PTX (rustc's NVPTX backend, linked by `dmattn-ptx-builder`) and leaves
//! it in `OUT_DIR` for `include_str!`. Runs again only when the kernel or ABI sources change.
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
    std::fs::copy(&ptx, out.join("dmattn_sm80.ptx")).expect("copy PTX into OUT_DIR");
    ExitCode::SUCCESS
}
