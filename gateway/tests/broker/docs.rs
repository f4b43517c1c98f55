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

/// docs/architecture.md opens with a "where is …" map, each answer a file or folder: every
/// one must exist, so a file that moves or splits cannot leave the map pointing at nothing.
/// A bare name (`poll.rs`) is read as the docs write it, beside a folder the same row names
/// (`gateway/src/groups/`), or under one of the crates' `src/`.
#[test]
fn every_file_the_architecture_map_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("the page");
    let map = doc
        .split("## Where is")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/architecture.md has a `## Where is …` section");
    let crates = [
        "wire", "model", "hot", "cold", "meta", "gateway", "client", "bench",
    ];
    let mut checked = 0;
    let mut missing = Vec::new();
    for row in map
        .lines()
        .filter(|l| l.starts_with("| ") && !l.contains("---"))
    {
        let Some(answer) = row.split('|').nth(2) else {
            continue;
        };
        let names: Vec<&str> = answer
            .split('`')
            .skip(1)
            .step_by(2)
            .filter_map(|q| q.split_whitespace().next())
            .filter(|q| q.ends_with(".rs") || q.ends_with('/'))
            .collect();
        // The folders this row names, and their parents (`replication/leader.rs` beside
        // `gateway/src/replication/lease.rs`).
        let mut dirs: Vec<PathBuf> = Vec::new();
        for name in names.iter().filter(|n| n.contains('/')) {
            let path = root.join(name);
            let dir = if name.ends_with('/') {
                path
            } else {
                path.parent().expect("a parent").to_path_buf()
            };
            if let Some(parent) = dir.parent() {
                dirs.push(parent.to_path_buf());
            }
            dirs.push(dir);
        }
        dirs.extend(crates.iter().map(|c| root.join(c).join("src")));
        for name in names {
            checked += 1;
            if !root.join(name).exists() && !dirs.iter().any(|d| d.join(name).exists()) {
                missing.push(name.to_owned());
            }
        }
    }
    assert!(checked > 30, "the map names files ({checked} found)");
    assert!(
        missing.is_empty(),
        "docs/architecture.md's map names files that do not exist: {missing:?}"
    );
}
