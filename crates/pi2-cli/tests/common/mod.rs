//! What the CLI test files share: the model, running `pi2`, and the one-error-line check.
#![allow(dead_code)] // not every test file uses every helper

pub mod server;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn model() -> PathBuf {
    let p = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "test model missing at {}: run `cargo xtask fetch-model` first",
        p.display()
    );
    p
}

pub fn pi2(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pi2"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run pi2")
}

pub fn ok(args: &[&str]) -> String {
    let out = pi2(args);
    assert!(
        out.status.success(),
        "pi2 {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The command fails with exit code 1, and its stderr ends with exactly one `error:` line
/// containing `needle` (progress lines may come before it).
pub fn fails_with(args: &[&str], needle: &str) {
    let out = pi2(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "pi2 {args:?}: {err}");
    assert!(!err.contains("panicked"), "pi2 {args:?} panicked: {err}");
    let errors: Vec<_> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(
        errors.len(),
        1,
        "pi2 {args:?}: expected one error line, got {err}"
    );
    let last = err.lines().rfind(|l| !l.trim().is_empty()).unwrap();
    assert!(
        last.starts_with("error: ") && last.contains(needle),
        "pi2 {args:?}: {err}"
    );
}

pub fn m() -> String {
    model().display().to_string()
}

/// Runs `pi2 args` with `input` on its standard input.
pub fn pi2_with_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pi2"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pi2");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// SmolLM2 profiled and converted on 64 KJV tokens at sparsity 0.3, no predictor, into `dir`
/// (small and quick: for tests of the offloaded paths); returns the converted file's path.
pub fn small_conversion(dir: &std::path::Path) -> String {
    let corpus = root().join("testdata/corpus/kjv_calibration.txt");
    let corpus = corpus.display().to_string();
    let prof = dir.join("p.json").display().to_string();
    let conv = dir.join("c.gguf").display().to_string();
    let small = ["--tokens", "64", "--chunk", "32"];
    let model = m();
    let mut profile = vec!["profile", "-m", &model, "-f", &corpus, "-o", &prof];
    profile.extend_from_slice(&small);
    ok(&profile);
    let mut convert = vec!["convert", "-m", &model, "--profile", &prof, "-f", &corpus];
    convert.extend_from_slice(&small);
    convert.extend_from_slice(&["--sparsity", "0.3", "--predictor", "none", "-o", &conv]);
    ok(&convert);
    conv
}
