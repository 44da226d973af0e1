//! House rules, checked on every test run (as rust-analyzer's `tidy`): every `unsafe fn` says
//! why it is safe to call (its own `# Safety` section, its module's, or its trait's); no source
//! file of a crate is over 800 lines and no function over 150 (tests aside); every library
//! crate has a README; docs name only paths that exist, and the architecture page names every
//! crate; library crates read environment variables only where the architecture page says.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `.rs` files under `dir`, recursively.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn crate_sources() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let src = e.path().join("src");
        if src.is_dir() {
            sources(&src, &mut out);
        }
    }
    sources(&root().join("xtask/src"), &mut out);
    out.sort();
    out
}

/// The part of a file before its `#[cfg(test)]` module.
fn without_tests(text: &str) -> &str {
    text.find("\n#[cfg(test)]\nmod tests")
        .map_or(text, |i| &text[..i])
}

#[test]
fn every_unsafe_fn_documents_its_safety() {
    let mut missing = Vec::new();
    for p in crate_sources() {
        let text = std::fs::read_to_string(&p).unwrap();
        let module_doc = text.lines().take_while(|l| l.starts_with("//!"));
        if module_doc.clone().any(|l| l.contains("# Safety")) {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        let mut in_trait_impl = false;
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            if t.starts_with("impl") && t.contains(" for ") {
                in_trait_impl = true;
            } else if l.starts_with('}') {
                in_trait_impl = false;
            }
            let is_unsafe_fn =
                (t.contains("unsafe fn ") || t.starts_with("unsafe fn")) && !t.starts_with("//");
            // Trait implementations inherit the trait method's `# Safety`.
            if !is_unsafe_fn || in_trait_impl {
                continue;
            }
            let doc = lines[..i]
                .iter()
                .rev()
                .take_while(|d| {
                    let d = d.trim_start();
                    d.starts_with("///") || d.starts_with("#[") || d.starts_with("//")
                })
                .any(|d| d.contains("# Safety"));
            if !doc {
                missing.push(format!("{}:{}", p.display(), i + 1));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "unsafe fns without a `# Safety` section:\n{}",
        missing.join("\n")
    );
}

#[test]
fn files_and_functions_stay_small() {
    const MAX_FILE: usize = 800;
    const MAX_FN: usize = 150;
    let mut over = Vec::new();
    for p in crate_sources() {
        let text = std::fs::read_to_string(&p).unwrap();
        let body = without_tests(&text);
        let n = body.lines().count();
        if n > MAX_FILE {
            over.push(format!("{}: {n} lines", p.display()));
        }
        // Functions: from a line starting `fn`/`pub fn`/... at any indent to the line that
        // closes it at the same indent.
        let lines: Vec<&str> = body.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let l = lines[i];
            let t = l.trim_start();
            let indent = l.len() - t.len();
            let is_fn = t.split_whitespace().take(4).any(|w| w == "fn")
                && !t.starts_with("//")
                && !t.ends_with(';');
            if is_fn {
                let close = " ".repeat(indent) + "}";
                if let Some(len) = lines[i..].iter().position(|x| *x == close) {
                    if len + 1 > MAX_FN {
                        over.push(format!(
                            "{}:{}: fn of {} lines",
                            p.display(),
                            i + 1,
                            len + 1
                        ));
                    }
                }
            }
            i += 1;
        }
    }
    assert!(
        over.is_empty(),
        "over the size limits:\n{}",
        over.join("\n")
    );
}

#[test]
fn every_library_crate_has_a_readme() {
    let mut missing = Vec::new();
    for e in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let lib = e.path().join("src/lib.rs");
        if lib.exists() && !e.path().join("README.md").exists() {
            missing.push(e.path().display().to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "library crates without a README: {missing:?}"
    );
}

/// Markdown files the docs checks read: the README, `docs/`, and every crate's and tool's README.
fn doc_files() -> Vec<PathBuf> {
    let r = root();
    let mut out = vec![r.join("README.md"), r.join("bench/README.md")];
    let mut stack = vec![r.join("docs")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    for e in std::fs::read_dir(r.join("crates")).unwrap().flatten() {
        out.push(e.path().join("README.md"));
    }
    out.retain(|p| p.exists());
    out.sort();
    out
}

/// Top-level folders whose paths docs name.
const TREE: &[&str] = &[
    "crates/",
    "docs/",
    "bench/",
    "testdata/",
    "xtask/",
    "fuzz/",
    ".ci/",
    "examples/",
    "python/",
];

/// Paths a doc names: the targets of relative links, and code spans that start at a folder of
/// the tree or name a source file (`engine.rs`, `offload/vocab.rs`). Spans holding a
/// placeholder, a glob or spaces are commands or patterns, not paths.
fn named_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for link in text.split("](").skip(1) {
        let target = link.split(')').next().unwrap_or("");
        let target = target.split('#').next().unwrap_or("");
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(format!("link:{target}"));
        }
    }
    for (i, span) in text.split('`').enumerate() {
        let plain = span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c));
        if i % 2 == 0 || span.is_empty() || !plain {
            continue;
        }
        if TREE.iter().any(|t| span.starts_with(t)) || span.ends_with(".rs") {
            out.push(span.to_string());
        }
    }
    out
}

/// Whether a bare file name or a partial path (`offload/vocab.rs`) names a file of the tree.
fn tree_has_suffix(suffix: &str) -> bool {
    fn walk(dir: &Path, suffix: &str) -> bool {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                let p = e.path();
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if name == "target" || name.starts_with('.') {
                    return false;
                }
                if p.is_dir() {
                    walk(&p, suffix)
                } else {
                    p.to_string_lossy().ends_with(&format!("/{suffix}"))
                }
            })
    }
    walk(&root(), suffix)
}

#[test]
fn paths_named_in_docs_exist() {
    let r = root();
    let mut missing = Vec::new();
    for doc in doc_files() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for p in named_paths(&text) {
            let ok = match p.strip_prefix("link:") {
                Some(link) => doc.parent().unwrap().join(link).exists(),
                None if TREE.iter().any(|t| p.starts_with(t)) => r.join(&p).exists(),
                None => tree_has_suffix(&p),
            };
            if !ok {
                missing.push(format!("{}: {p}", doc.strip_prefix(&r).unwrap().display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths named in docs that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn architecture_names_every_crate() {
    let arch = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut missing = Vec::new();
    for e in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !arch.contains(&format!("`{name}`")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "crates docs/architecture.md does not name: {missing:?}"
    );
}

/// Library crates read environment variables only where docs/architecture.md says (the
/// folders of the caches and models, and the compute pool's size as rayon reads it): a setting
/// read deep inside a library is one a program embedding it cannot see or pass.
#[test]
fn libraries_read_the_environment_only_where_the_architecture_says() {
    const ALLOWED: [&str; 3] = [
        "crates/pi2-runtime/src/device.rs",
        "crates/pi2-catalog/src/lib.rs",
        "crates/pi2-engine/src/engine/memory.rs",
    ];
    let r = root();
    let mut found = Vec::new();
    for p in crate_sources() {
        let rel = p
            .strip_prefix(&r)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        // Programs may read their environment: the CLI and the build tool.
        if rel.starts_with("crates/pi2-cli/") || rel.starts_with("xtask/") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        if without_tests(&text).contains("env::var") && !ALLOWED.contains(&rel.as_str()) {
            found.push(rel);
        }
    }
    assert!(
        found.is_empty(),
        "library sources reading environment variables outside docs/architecture.md's list: {found:?}"
    );
    let arch = std::fs::read_to_string(r.join("docs/architecture.md")).unwrap();
    for a in ALLOWED {
        assert!(arch.contains(a), "docs/architecture.md does not name {a}");
    }
}
