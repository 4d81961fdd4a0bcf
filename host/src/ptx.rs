//! The PTX dmattn ships, and its split into one module per kernel.
//!
//! The driver compiles PTX when a module is loaded, the whole module at once: the portable module
//! holds every kernel (about 30 MB of PTX), which took 90-130 s on an H100 whose driver cache was
//! cold, before the first call could run. A [`Library`] keeps the text and hands out, per kernel,
//! a module of its own (the declarations every kernel shares, then that kernel), so that a process
//! compiles only the kernels it launches, each when first launched.
use std::collections::HashMap;
use std::ops::Range;

/// A PTX module as the library carries it (`build.rs` chooses which; a build uses one variant).
#[derive(Clone, Copy)]
#[allow(dead_code)]
pub(crate) enum EmbeddedPtx {
    /// Committed in `ptx/`, zstd-compressed.
    Zstd(&'static [u8]),
    /// Built from the kernel sources by `build.rs`.
    Text(&'static str),
}

macro_rules! embedded_ptx {
    ($stem:literal) => {{
        #[cfg(not(dmattn_kernels_from_source))]
        let ptx = EmbeddedPtx::Zstd(include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/ptx/", $stem, ".ptx.zst")));
        #[cfg(dmattn_kernels_from_source)]
        let ptx = EmbeddedPtx::Text(include_str!(concat!(env!("OUT_DIR"), "/", $stem, ".ptx")));
        ptx
    }};
}

/// Every kernel, for sm_80 and newer (the driver compiles it for the GPU at hand).
pub(crate) const PTX_SM80: EmbeddedPtx = embedded_ptx!("dmattn_sm80");
/// The kernels that use Hopper's wgmma, for compute capability 9.0 exactly (sm_90a code runs
/// on no other GPU).
pub(crate) const PTX_SM90A: EmbeddedPtx = embedded_ptx!("dmattn_sm90a");

impl EmbeddedPtx {
    pub(crate) fn text(self) -> String {
        match self {
            EmbeddedPtx::Text(text) => text.to_string(),
            EmbeddedPtx::Zstd(bytes) => {
                let mut text = String::new();
                let mut decoder = ruzstd::decoding::StreamingDecoder::new(bytes).expect("the committed PTX is a zstd frame");
                std::io::Read::read_to_string(&mut decoder, &mut text).expect("the committed PTX decompresses to text");
                text
            }
        }
    }
}

/// One PTX module split per kernel: the prelude (header, shared-memory declaration, device
/// functions: everything outside the kernels' bodies) and each kernel's entry.
pub(crate) struct Library {
    text: String,
    prelude: String,
    /// Kernel names in PTX order, with their entries' byte ranges in `text`.
    entries: Vec<(String, Range<usize>)>,
    by_name: HashMap<String, usize>,
}

impl Library {
    /// Splits `text` as LLVM's NVPTX back end writes it: an entry starts at a line
    /// `.visible .entry <name>(` and ends at the next line that is `}` alone (a body's own
    /// braces are indented).
    pub(crate) fn new(text: String) -> Self {
        let mut entries = Vec::new();
        let mut prelude = String::new();
        let mut at = 0;
        let mut open: Option<(String, usize)> = None;
        for line in text.split_inclusive('\n') {
            let start = at;
            at += line.len();
            match &open {
                None => match line.strip_prefix(".visible .entry ") {
                    Some(rest) => open = Some((rest.trim_end().trim_end_matches('(').to_string(), start)),
                    None => prelude.push_str(line),
                },
                Some((name, begin)) => {
                    if line.trim_end() == "}" {
                        entries.push((name.clone(), *begin..at));
                        open = None;
                    }
                }
            }
        }
        // A body without its end (not NVPTX's output) stays whole: the module is then the text.
        if let Some((name, begin)) = open {
            entries.push((name, begin..text.len()));
        }
        let by_name = entries.iter().enumerate().map(|(i, (name, _))| (name.clone(), i)).collect();
        Library { text, prelude, entries, by_name }
    }

    pub(crate) fn of(embedded: EmbeddedPtx) -> Self {
        Self::new(embedded.text())
    }

    /// The kernel names, in PTX order.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(name, _)| name.as_str())
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The declarations alone: a module with no kernel, which a driver that cannot compile this
    /// PTX version or target rejects.
    pub(crate) fn prelude(&self) -> &str {
        &self.prelude
    }

    /// A module holding kernel `name` alone, or `None` if there is no such kernel.
    pub(crate) fn module_of(&self, name: &str) -> Option<String> {
        let (_, range) = &self.entries[*self.by_name.get(name)?];
        Some([self.prelude.as_str(), &self.text[range.clone()]].concat())
    }
}

/// The kernel names of the shipped module with the Hopper kernels (`hopper`) or the portable one.
#[cfg(test)]
pub(crate) fn shipped_kernels(hopper: bool) -> Vec<String> {
    Library::of(if hopper { PTX_SM90A } else { PTX_SM80 }).names().map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = ".version 7.8\n.target sm_80\n.extern .shared .align 1024 .b8 dmattn_smem[];\n\
        .func helper\n()\n.noreturn;\n\t// .globl\tdmattn_a\n.visible .entry dmattn_a(\n\t.param .align 8 .b8 p[8]\n)\n{\n\
        \t{ // callseq 0, 0\n\tcall.uni helper, ();\n\t}\n\tret;\n}\n.func helper()\n.noreturn\n{\n\ttrap; exit;\n}\n\
        .visible .entry dmattn_b(\n\t.param .align 8 .b8 p[16]\n)\n{\n\tret;\n}\n";

    #[test]
    fn each_kernel_gets_the_prelude_and_its_own_body() {
        let lib = Library::new(PTX.to_string());
        assert_eq!(lib.names().collect::<Vec<_>>(), ["dmattn_a", "dmattn_b"]);
        let a = lib.module_of("dmattn_a").unwrap();
        let b = lib.module_of("dmattn_b").unwrap();
        for m in [&a, &b] {
            assert!(m.starts_with(".version 7.8\n.target sm_80\n.extern .shared"));
            // The device function's declaration and its body, once each.
            assert_eq!(m.matches(".func helper").count(), 2);
        }
        assert!(a.contains("call.uni helper") && !a.contains("dmattn_b"));
        assert!(b.contains(".visible .entry dmattn_b(\n\t.param .align 8 .b8 p[16]\n)\n{\n\tret;\n}\n") && !b.contains("dmattn_a("));
        assert!(lib.module_of("dmattn_c").is_none() && !lib.contains("dmattn_c") && lib.contains("dmattn_b"));
        assert!(!lib.prelude().contains(".entry"));
    }

    /// The shipped modules split into as many kernels as they declare, and the pieces hold the
    /// whole text: nothing outside the prelude and the entries.
    #[test]
    fn shipped_modules_split_whole() {
        for embedded in [PTX_SM80, PTX_SM90A] {
            let text = embedded.text();
            let declared = text.lines().filter(|l| l.starts_with(".visible .entry ")).count();
            let lib = Library::new(text.clone());
            assert!(declared > 0);
            assert_eq!(lib.names().count(), declared);
            let body: usize = lib.entries.iter().map(|(_, r)| r.len()).sum();
            assert_eq!(lib.prelude().len() + body, text.len());
            for (name, range) in &lib.entries {
                assert!(text[range.clone()].starts_with(&format!(".visible .entry {name}(")));
                assert!(text[range.clone()].ends_with("}\n"));
            }
        }
    }
}
