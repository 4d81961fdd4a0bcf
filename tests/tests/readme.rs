//! The README's API example is `host/examples/quickstart.rs` verbatim, so the code a user copies
//! is the code CI builds (`cargo test` builds examples) and runs in a downstream crate.
/// Embedded at build time, so that the packed suite runs where the sources are not.
const README: &str = include_str!("../../README.md");
const EXAMPLE: &str = include_str!("../../host/examples/quickstart.rs");

#[test]
fn readme_shows_the_quickstart_example() {
    let (readme, example) = (README, EXAMPLE);
    assert!(
        readme.contains(&format!("```rust\n{example}```\n")),
        "README.md must show host/examples/quickstart.rs verbatim in a ```rust block"
    );
}
