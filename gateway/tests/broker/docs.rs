//! docs/semantics.md and docs/integrity.md name the test that holds each promise: every
//! test they name must exist, so a renamed or removed test cannot leave a promise pointing
//! at nothing.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            if !matches!(name, "target" | "third_party" | ".git" | "fuzz") {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The last segment of every `a::b::c` name in backticks (test paths as the docs write
/// them), skipping module references that end in `*`.
fn named_tests(doc: &str) -> Vec<String> {
    let mut names = Vec::new();
    for quoted in doc.split('`').skip(1).step_by(2) {
        let is_path = quoted.contains("::")
            && quoted
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':');
        if let Some(last) = quoted.rsplit("::").next().filter(|_| is_path)
            && !last.is_empty()
        {
            names.push(last.to_owned());
        }
    }
    names
}

#[test]
fn every_test_the_semantics_and_integrity_pages_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let sources: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
        .collect();
    for page in ["docs/semantics.md", "docs/integrity.md"] {
        let doc = std::fs::read_to_string(root.join(page)).expect("the page");
        let names = named_tests(&doc);
        assert!(names.len() > 10, "{page}: names tests");
        let missing: Vec<&String> = names
            .iter()
            .filter(|name| {
                let as_fn = format!("fn {name}(");
                let as_mod = format!("mod {name}");
                !sources.iter().any(|s| {
                    s.contains(&as_fn) || s.contains(&as_mod) || s.contains(&format!("fn {name}<"))
                })
            })
            .collect();
        assert!(
            missing.is_empty(),
            "{page} names tests that do not exist: {missing:?}"
        );
    }
}
