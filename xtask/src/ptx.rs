//! `cargo xtask ptx [--check]`: the PTX modules committed in `host/ptx/`, which every build of
//! dmattn embeds unless its kernel sources differ from them. `ptx` rebuilds them from the kernel
//! sources with the pinned nightly and writes them (zstd level 19) with the sources' digest;
//! `--check` rebuilds and fails unless the committed modules are byte for byte that build.
use crate::root;
use dmattn_ptx_builder::{KernelSources, MODULES, Module, STAMP};
use std::path::PathBuf;

/// zstd level of the committed modules: ~16x smaller than the text (15 MB for sm_80).
const LEVEL: i32 = 19;

fn committed_dir() -> PathBuf {
    root().join("host/ptx")
}

fn sources() -> KernelSources {
    KernelSources::beside(&root().join("host")).expect("the workspace has its kernel sources")
}

/// `module` built from the kernel sources (the nightly's first build takes a minute or two).
fn build(sources: &KernelSources, module: &Module) -> Result<String, String> {
    let ptx = sources.build(module, &root().join("target/ptx").join(module.arch));
    std::fs::read_to_string(&ptx).map_err(|e| format!("{}: {e}", ptx.display()))
}

/// The committed text of `module`.
pub fn committed(module: &Module) -> Result<String, String> {
    let path = committed_dir().join(format!("{}.zst", module.file()));
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = zstd::decode_all(&bytes[..]).map_err(|e| format!("{}: {e}", path.display()))?;
    String::from_utf8(text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The PTX of `module` that a build of dmattn here embeds: the committed module where the
/// sources match it, else a fresh build.
pub fn embedded(module: &Module) -> Result<String, String> {
    let sources = sources();
    if sources.built_into(&committed_dir()).map_err(|e| e.to_string())? { committed(module) } else { build(&sources, module) }
}

/// The module named `name` (`sm80`, `sm90a`).
pub fn module(name: &str) -> Module {
    *MODULES.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no PTX module {name}"))
}

pub fn run(check: bool) -> Result<(), String> {
    let sources = sources();
    let digest = sources.digest().map_err(|e| e.to_string())?;
    let mut stale = Vec::new();
    for module in MODULES {
        let text = build(&sources, &module)?;
        if check {
            if committed(&module).ok().as_deref() != Some(text.as_str()) {
                stale.push(module.file());
            }
        } else {
            let zst = zstd::encode_all(text.as_bytes(), LEVEL).map_err(|e| e.to_string())?;
            let path = committed_dir().join(format!("{}.zst", module.file()));
            std::fs::write(&path, &zst).map_err(|e| format!("{}: {e}", path.display()))?;
            println!("{}: {} bytes of PTX, {} committed", path.display(), text.len(), zst.len());
        }
    }
    if check {
        if !sources.built_into(&committed_dir()).map_err(|e| e.to_string())? {
            stale.push(STAMP.into());
        }
        if !stale.is_empty() {
            return Err(format!("host/ptx is not the build of the kernel sources ({}): run `cargo xtask ptx` and commit it", stale.join(", ")));
        }
        println!("host/ptx is the build of the kernel sources ({digest})");
    } else {
        std::fs::write(committed_dir().join(STAMP), sources.stamp().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    Ok(())
}
