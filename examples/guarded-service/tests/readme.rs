//! The guarded write of the library's README is this service's `put_doc`, as it is there:
//! building this crate compiles the README's code, and this test sees that it is the same.

const README: &str = include_str!("../../../fencelock/README.md");
const DOCS: &str = include_str!("../src/docs.rs");

/// The README's PostgreSQL snippet without its hidden (`# `) lines.
fn readme_snippet() -> String {
    let section = README
        .split("## A guarded write (PostgreSQL, actix-web)")
        .nth(1)
        .expect("the README has its guarded write");
    let code = section
        .split("```rust")
        .nth(1)
        .and_then(|s| s.split_once('\n'))
        .map(|(_, code)| code)
        .and_then(|code| code.split("```").next())
        .expect("the section holds a rust block");
    code.lines()
        .filter(|line| *line != "#" && !line.starts_with("# "))
        .map(|line| format!("{line}\n"))
        .collect()
}

#[test]
fn put_doc_is_the_readme_s_guarded_write() {
    let snippet = readme_snippet();
    assert!(snippet.contains("async fn put_doc("), "{snippet}");
    assert!(
        DOCS.contains(&snippet),
        "src/docs.rs no longer holds the README's guarded write, as it is there:\n{snippet}"
    );
}
