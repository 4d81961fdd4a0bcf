//! The README's API example is `host/examples/quickstart.rs` verbatim, so the code a user copies
//! is the code CI builds (`cargo test` builds examples) and runs in a downstream crate.
use std::path::Path;

#[test]
fn readme_shows_the_quickstart_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let example = std::fs::read_to_string(root.join("host/examples/quickstart.rs")).unwrap();
    assert!(
        readme.contains(&format!("```rust\n{example}```\n")),
        "README.md must show host/examples/quickstart.rs verbatim in a ```rust block"
    );
}
