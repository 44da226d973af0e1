//! House rules, checked on every test run (as rust-analyzer's `tidy`): every `unsafe fn` says
//! why it is safe to call (its own `# Safety` section, its module's, or its trait's); no source
//! file of a crate is over 800 lines and no function over 150 (tests aside); every library
//! crate has a README.

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
